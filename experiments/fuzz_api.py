"""Random API fuzz (issue 15 acceptance): random models × clusters × plans through the CLI.

    nice -n 10 python experiments/fuzz_api.py --seed 20261201 --cases 1000 [--models 150] \\
        [--search-every 10] [--json OUT]

A pool of ``--models`` (spec, seq) pairs is drawn first (each traces once); each case draws from
it a gpt/llama/moe family spec (sometimes subtly invalid), a cluster (a shorthand of
every GPU kind, or a random cluster YAML, sometimes invalid), a sequence length in 128–262,144,
a global batch and a plan (valid by construction, or one field broken), and runs
``autoplan estimate --json`` in this process; every ``--search-every``-th case with a small cluster
runs ``autoplan search --json`` instead and then ``estimate`` of each plan it returned.

A **crash** is an exception out of ``cli.main``, an exit code other than 0 or 2, or an exit 2
whose stderr lacks ``error:``/``fix:``.  A **violation** is an answer that breaks an invariant
computed here from the plan, the cluster and the drawn model (not by the code under test):
degrees multiply to the GPU count; every tp/ep/Ulysses group (its ranks from the plan's axis
order) leaves its NVLink domain iff the matching ``*-inside-nvlink`` violation is reported;
exposed ≤ time for every primitive and in sum; the primitives' exposed seconds are what the step
charges beyond compute, idle pipeline ranks and the optimizer; the time breakdown adds up to the step time;
memory > 0 and ``fits`` ⇔ memory ≤ HBM − margin; 0 < MFU, HFU < 1; tokens/s = global batch · seq / step
time; one stage time per virtual stage and ≥ 1 layer in each; tp divides the heads and divides
or is a multiple of the KV heads; every number
finite; an input that must be refused (a broken field) is refused; a plan the search returned is
accepted by ``estimate`` with the same bytes and by ``autoplan run``'s checks (``check_supported``);
every 10th estimate repeated gives the same bytes.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import math
import os
import random
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

SEQS = (128, 512, 2048, 8192, 32768, 262144)
KINDS = {"a100": 8, "a100-40gb": 8, "h100": 8, "h800": 8, "h200": 8, "b200": 8, "gb200": 72}
SCHEDULES = {1: ("gpipe", "1f1b", "zb-h1", "zb-h2"), 2: ("interleaved", "zbv", "dualpipev"), 3: ("interleaved",)}
AXES = ("tp", "cp", "ep", "dp", "pp")
NOT_IN_THE_TABLE = ("compute", "pp_bubble", "pp_engine_host", "optimizer")   # breakdown causes no primitive holds


@dataclass
class Model:
    """A drawn family spec and the sizes the invariants need (``bad``: a field broken on purpose)."""

    spec: str
    layers: int
    heads: int
    kv_heads: int
    experts: int
    bad: str = ""


@dataclass
class Tally:
    cases: int = 0
    searches: int = 0
    estimates: int = 0
    accepted: int = 0
    refused: Counter = field(default_factory=Counter)
    crashes: list = field(default_factory=list)
    violations: list = field(default_factory=list)


# --- drawing inputs --------------------------------------------------------------------

def draw_model(rng: random.Random, seq: int) -> Model:
    family = rng.choice(("gpt", "llama", "moe"))
    heads = rng.choice((1, 2, 4, 6, 8, 12, 16, 32))
    head_dim = rng.choice((8, 16, 32, 64))
    kv = heads if family == "gpt" else rng.choice([d for d in range(1, heads + 1) if heads % d == 0])
    layers = rng.randint(1, 48)
    keys = {"layers": layers, "hidden": heads * head_dim, "heads": heads, "vocab": rng.randint(32, 60000)}
    if family != "gpt":
        keys["kv_heads"] = kv
    if rng.random() < 0.5:
        keys["ffn"] = rng.choice((32, 96, 128, 4 * heads * head_dim, 3 * heads * head_dim + 8))
    experts = 0
    if family == "moe":
        experts = rng.choice((2, 4, 8, 16, 64))
        keys.update(experts=experts, topk=rng.randint(1, min(4, experts)),
                    dense_layers=rng.randint(0, min(2, layers)), shared_experts=rng.choice((0, 0, 1)))
    if family == "gpt":
        keys["dropout"] = 0
        if seq > 2048:
            keys["max_seq"] = seq
    bad = ""
    if rng.random() < 0.05:
        bad, keys = _break_spec(rng, family, keys)
    spec = f"{family}:" + ",".join(f"{k}={v}" for k, v in keys.items())
    return Model(spec, layers, heads, kv, experts, bad)


def _break_spec(rng: random.Random, family: str, keys: dict) -> tuple[str, dict]:
    """One field of a spec made invalid: (what was broken, keys)."""
    options = ["layers_huge", "hidden_not_heads", "vocab_zero"]
    if family != "gpt":
        options += ["odd_head_dim", "kv_not_dividing"]
    if family == "moe":
        options += ["topk_gt_experts"]
    what = rng.choice(options)
    keys = dict(keys)
    if what == "layers_huge":
        keys["layers"] = rng.choice((2000, 10 ** 9, 2 ** 63))
    elif what == "hidden_not_heads":
        keys["heads"] = 7 if keys["hidden"] % 7 else 5
        keys["hidden"] = keys["hidden"] + 1 if keys["hidden"] % keys["heads"] == 0 else keys["hidden"]
        keys.pop("kv_heads", None)
    elif what == "vocab_zero":
        keys["vocab"] = 0
    elif what == "odd_head_dim":
        keys.update(hidden=keys["heads"] * 15, head_dim=15)
    elif what == "kv_not_dividing":
        keys.update(heads=6, kv_heads=4, hidden=6 * 16)
    else:
        keys["topk"] = keys["experts"] + 1
    return what, keys


def draw_cluster(rng: random.Random, tmp: str, small: bool) -> tuple[str, dict | None, str]:
    """(--cluster argument, the drawn YAML mapping or None for a shorthand, what was broken)."""
    if rng.random() < 0.5:
        kind = rng.choice(tuple(KINDS))
        domain = KINDS[kind]
        n = domain * rng.choice((1, 2) if small or domain > 8 else (1, 2, 4, 8, 16))
        return f"{kind}x{n}", None, ""
    per_node = rng.choice((2, 4, 8))
    domain = per_node * rng.choice((1, 2, 4))
    raw = {"gpu": rng.choice(("a100", "h100", "h200", "b200", "h800")), "gpus_per_node": per_node,
           "nvlink_domain": domain, "num_gpus": domain * rng.randint(1, 4 if small else 32),
           "nics_per_node": rng.choice((1, 2, 4, 8)), "pod_oversubscription": rng.choice((1.0, 2.0, 7.0)),
           "launch_latency": rng.uniform(0, 2e-5), "nic_efficiency": rng.uniform(0.3, 1.0)}
    bad = ""
    if rng.random() < 0.08:
        bad = rng.choice(("launch_latency", "nic_efficiency", "num_gpus", "nvlink_domain"))
        raw[bad] = rng.choice((-1, float("inf"), float("nan")) + ((0,) if bad != "launch_latency" else ()))
    path = os.path.join(tmp, f"cluster{rng.randrange(10 ** 9)}.yaml")
    with open(path, "w") as f:
        f.write("".join(f"{k}: {_yaml(v)}\n" for k, v in raw.items()))
    return path, raw, bad


def _yaml(v) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return ".nan" if math.isnan(v) else ".inf"
    return repr(v) if not isinstance(v, str) else v


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def draw_plan(rng: random.Random, gpus: int, model: Model, seq: int) -> tuple[dict, str]:
    """(plan fields, what was broken): degrees that multiply to ``gpus``, or one field broken."""
    tp = rng.choice([d for d in _divisors(math.gcd(gpus, model.heads) if rng.random() < 0.9 else gpus) if d <= 16])
    cp = rng.choice([d for d in _divisors(gpus // tp) if d <= 16 and seq % (2 * d) == 0])
    pp = rng.choice([d for d in _divisors(gpus // (tp * cp)) if d <= model.layers])
    dp = gpus // (tp * cp * pp)
    ep = rng.choice([d for d in _divisors(dp) if model.experts % d == 0]) if model.experts else 1
    vpp = rng.choice([v for v in (1, 2, 3) if pp > 1 and model.layers >= pp * v] or [1])
    f = {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": ep, "vpp": vpp, "mbs": rng.choice((1, 2, 4)),
         "schedule": rng.choice(SCHEDULES[vpp]) if pp > 1 else "1f1b",
         "recompute": rng.choice(("none", "selective", "full")), "cp_algo": rng.choice(("ring", "ulysses", "usp")),
         "zero": rng.choice((0, 1, 2, 3)) if dp > 1 else 0}
    if rng.random() < 0.3:
        f["order"] = "-".join(rng.sample(AXES, len(AXES)))
    if tp > 1 and rng.random() < 0.3:
        f["sp"] = rng.choice(("on", "off"))
    if pp > 1 and rng.random() < 0.3:
        f["layers"] = "-".join(map(str, _cuts(rng, model.layers, pp * vpp)))
    bad = ""
    if rng.random() < 0.15:
        bad = _break_plan(rng, f, model)
    return f, bad


def _cuts(rng: random.Random, layers: int, stages: int) -> list[int]:
    """Layers per virtual stage, each ≥ 1, summing to ``layers``."""
    cut = sorted(rng.sample(range(1, layers), stages - 1)) if stages > 1 else []
    return [b - a for a, b in zip([0] + cut, cut + [layers])]


def _break_plan(rng: random.Random, f: dict, model: Model) -> str:
    what = rng.choice(("degrees", "zero_layer", "layer_sum", "zero5", "v_schedule", "ep_experts"))
    if what == "degrees":
        f["dp"] = f["dp"] + 1
    elif what in ("zero_layer", "layer_sum") and f["pp"] > 1:
        cuts = _cuts(rng, model.layers, f["pp"] * f["vpp"])
        cuts[0] = 0 if what == "zero_layer" else cuts[0] + 1
        f["layers"] = "-".join(map(str, cuts))
    elif what == "zero5":
        f["zero"] = 5
    elif what == "v_schedule" and f["pp"] > 1 and f["vpp"] == 1:
        f["schedule"] = "zbv"
    elif what == "ep_experts" and model.experts:
        f["ep"] = model.experts * 2
    else:
        return ""
    return what


# --- running the CLI in this process ----------------------------------------------------

def cli(argv: list[str]) -> tuple[int | None, str, str, str]:
    """(exit code, stdout, stderr, crash text or '') of ``autoplan ARGV`` run in this process."""
    from autoplan.cli import main

    out, err = io.StringIO(), io.StringIO()
    crash = ""
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except SystemExit as e:                       # argparse
        code = e.code if isinstance(e.code, int) else 2
    except BaseException:                         # noqa: BLE001 - any escape is what we count
        code, crash = None, traceback.format_exc(limit=-4)
    if not crash and code not in (0, 2):
        crash = f"exit code {code}"
    elif code == 2 and not ("error:" in err.getvalue() and "fix:" in err.getvalue()):
        crash = f"exit 2 without error:/fix: {err.getvalue()[-300:]!r}"
    elif "Traceback" in err.getvalue():
        crash = "traceback on stderr: " + err.getvalue()[-500:]
    return code, out.getvalue(), err.getvalue(), crash


def plan_string(f: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in f.items())


# --- invariants (independent of the code under test) ------------------------------------

def axis_groups(p: dict, axis: str, sub: int = 0) -> list[list[int]]:
    """Every group of ``axis`` from the plan's degrees and order (innermost axis first)."""
    size = {"tp": p["tp"], "cp": p["cp"], "ep": p["ep"], "dp": p["dp"] // p["ep"], "pp": p["pp"]}
    order = p["order"].split("-")
    strides, s = {}, 1
    for a in order:
        strides[a], s = s, s * size[a]
    others = [a for a in order if a != axis]
    out = []
    for rest in itertools.product(*(range(size[a]) for a in others)):
        base = sum(c * strides[a] for a, c in zip(others, rest))
        members = [base + i * strides[axis] for i in range(size[axis])]
        block = sub or len(members)
        out += [members[k:k + block] for k in range(0, len(members), block)]
    return out


def parse_plan(text: str) -> dict:
    p = dict(kv.split("=", 1) for kv in text.split(","))
    return {k: (int(v) if v.isdigit() else v) for k, v in p.items()}


def nvlink_problems(p: dict, e: dict, domain: int, experts: int) -> list[str]:
    rules = {v["rule"] for v in e["violations"]}
    want = {}
    if p["tp"] > 1:
        want["tp"] = axis_groups(p, "tp")
    if p["ep"] > 1 and experts:
        want["ep"] = axis_groups(p, "ep")
    if p["cp"] > 1 and p["cp_algo"] != "ring":
        sizes = {q["group_size"] for q in e["primitives"] if q["axis"] == "cp" and q["kind"] == "all_to_all"}
        u = max(sizes) if sizes else (p["cp"] if p["cp_algo"] == "ulysses" else 1)
        if p["cp"] % u or (p["cp_algo"] == "ulysses" and u != p["cp"]):
            return [f"Ulysses group size {u} for cp={p['cp']} {p['cp_algo']}"]
        if u > 1:
            want["cp"] = axis_groups(p, "cp", sub=u)
    out = []
    for dim, groups in want.items():
        crossing = [g for g in groups if len({r // domain for r in g}) > 1]
        if bool(crossing) != (f"{dim}-inside-nvlink" in rules):
            out.append(f"{dim} groups crossing NVLink {crossing[:1]} vs violations {sorted(rules)}")
    return out


def _finite(x) -> bool:
    if isinstance(x, dict):
        return all(_finite(v) for v in x.values())
    if isinstance(x, list):
        return all(_finite(v) for v in x)
    return not isinstance(x, float) or math.isfinite(x)


def estimate_problems(e: dict, gpus: int, domain: int, model: Model, batch: int, seq: int) -> list[str]:
    """Every invariant an accepted estimate breaks (JSON numbers carry 6 significant digits)."""
    p = parse_plan(e["plan"]) if isinstance(e["plan"], str) else e["plan"]
    bad = []
    close = lambda a, b: math.isclose(a, b, rel_tol=2e-5, abs_tol=1e-12)   # noqa: E731
    checks = [
        (p["tp"] * p["cp"] * p["pp"] * p["dp"] == gpus, "degrees do not multiply to the GPU count"),
        (p["dp"] % p["ep"] == 0, "ep does not divide dp"),
        (model.heads % p["tp"] == 0, f"tp={p['tp']} priced on {model.heads} heads"),
        ((p["tp"] % model.kv_heads if p["tp"] > model.kv_heads else model.kv_heads % p["tp"]) == 0,
         f"tp={p['tp']} priced on {model.kv_heads} KV heads (a fraction of a KV head per rank)"),
        (_finite(e), "a number is not finite"),
        (e["memory_gib"] > 0 and e["hbm_gib"] > 0, "memory or HBM not positive"),
        # fits: the peak within HBM less the margin a plan must leave free (--memory-margin)
        (e["fits"] == (e["memory_gib"] <= (e["hbm_gib"] - e["memory_margin_gib"]) * (1 + 2e-5)),
         "fits disagrees with memory, HBM and margin"),
        (0 < e["mfu"] < 1 and 0 < e["hfu"] < 1, f"MFU {e['mfu']} / HFU {e['hfu']} outside (0, 1)"),
        (close(e["tokens_per_s"], batch * seq / e["step_time_s"]), "tokens/s != batch·seq / step time"),
        (close(sum(e["time_breakdown_s"].values()), e["step_time_s"]), "breakdown does not add up to the step"),
        (all(v >= 0 for v in e["time_breakdown_s"].values()), "negative breakdown entry"),
        (len(e["stage_times_s"]) == p["pp"] * p["vpp"], "stage times != pp·vpp virtual stages"),
        (e["comm_exposed_s"] <= e["comm_time_s"] * (1 + 2e-5) + 1e-12, "comm exposed > comm time"),
        (sum(q["exposed_s"] for q in e["primitives"]) <= sum(q["time_s"] for q in e["primitives"]) * (1 + 2e-5)
         + 1e-12, "sum of exposed > sum of times"),
        # every second the step charges beyond compute, idle ranks, the pipeline engine's host time
        # and the optimizer is in the table
        (math.isclose(sum(q["exposed_s"] for q in e["primitives"]),
                      e["step_time_s"] - sum(e["time_breakdown_s"][k] for k in NOT_IN_THE_TABLE),
                      rel_tol=1e-4, abs_tol=1e-5 * e["step_time_s"]),
         "the table's exposed seconds != what the step charges"),
    ]
    bad += [why for ok, why in checks if not ok]
    bad += [f"primitive {q['axis']}/{q['purpose']}/{q['kind']} exposed {q['exposed_s']} > time {q['time_s']}"
            for q in e["primitives"] if q["exposed_s"] > q["time_s"] * (1 + 2e-5) + 1e-12]
    if "layers" in p:
        cuts = [int(x) for x in str(p["layers"]).split("-")]
        if min(cuts) < 1 or sum(cuts) != model.layers:
            bad.append(f"layers={p['layers']} accepted for {model.layers} layers")
    return bad + nvlink_problems(p, e, domain, model.experts)


# --- one case ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    index: int
    model: Model
    cluster: str
    gpus: int
    domain: int
    broken: str          # what was broken on purpose ('' : a valid input)
    seq: int
    batch: int
    plan: dict
    search: bool

    def argv(self, command: str, plan: str | None = None) -> list[str]:
        head = [command, self.model.spec, "--cluster", self.cluster, "--seq", str(self.seq),
                "--global-batch", str(self.batch), "--json"]
        if command == "search":
            return head + ["--top", "3", "--workers", "1"]
        return head + ["--plan", plan or plan_string(self.plan)]


def draw_models(rng: random.Random, count: int) -> list[tuple[Model, int]]:
    """The pool of (model, seq) the cases draw from: each traces once (the trace cache keeps it)."""
    out = []
    for _ in range(count):
        seq = rng.choice(SEQS) if rng.random() < 0.9 else 128 * rng.randint(1, 64)
        out.append((draw_model(rng, seq), seq))
    return out


def draw_case(rng: random.Random, index: int, tmp: str, search_every: int, pool: list) -> Case:
    search = search_every > 0 and index % search_every == 0
    model, seq = rng.choice(pool)
    cluster, raw, cluster_bad = draw_cluster(rng, tmp, small=search)
    if raw is None:
        kind, n = cluster.rsplit("x", 1)
        gpus, domain = int(n), KINDS[kind]
    else:
        gpus, domain = int(raw["num_gpus"]) if math.isfinite(raw["num_gpus"]) else 8, raw["nvlink_domain"]
        domain = int(domain) if isinstance(domain, int) and domain > 0 else 8
    plan, plan_bad = draw_plan(rng, max(gpus, 1), model, seq)
    fill = plan["pp"] * plan["vpp"] if rng.random() < 0.8 else 1       # enough micro-batches, mostly
    batch = plan["dp"] * plan["mbs"] * fill * rng.choice((1, 2, 4))
    if rng.random() < 0.03:
        batch, plan_bad = batch + 1, plan_bad or "batch"
    broken = model.bad or (f"cluster {cluster_bad}" if cluster_bad else "") or ("" if search else plan_bad)
    return Case(index, model, cluster, gpus, domain, broken, seq, batch, plan, search)


def run_estimate(case: Case, tally: Tally, plan: str | None = None, expect: str | None = None) -> None:
    """One ``estimate`` and its invariants; ``expect``: the bytes it must print (a searched plan)."""
    tally.estimates += 1
    argv = case.argv("estimate", plan)
    code, out, err, crash = cli(argv)
    if crash:
        tally.crashes.append((case.index, argv, crash))
        return
    if code == 2:
        tally.refused[err.splitlines()[0][:70]] += 1
        if expect is not None:
            tally.violations.append((case.index, argv, ["estimate refuses a plan the search returned: " + err]))
        return
    tally.accepted += 1
    problems = [] if not case.broken or case.broken == "batch" or expect is not None else \
        [f"accepted an input broken on purpose ({case.broken})"]
    e = json.loads(out)
    if expect is not None and json.dumps(e, sort_keys=True) != json.dumps(json.loads(expect), sort_keys=True):
        problems.append("estimate of a searched plan differs from the search's own estimate")
    if plan is None and case.index % 10 == 0 and cli(argv)[1] != out:
        problems.append("same inputs, different bytes")
    problems += estimate_problems(e, case.gpus, case.domain, case.model, case.batch, case.seq)
    if problems:
        tally.violations.append((case.index, argv, problems))


def run_search(case: Case, tally: Tally) -> None:
    tally.searches += 1
    argv = case.argv("search")
    code, out, err, crash = cli(argv)
    if crash:
        tally.crashes.append((case.index, argv, crash))
        return
    if code == 2:
        tally.refused["search: " + err.splitlines()[0][:62]] += 1
        return
    for c in json.loads(out):
        plan = c["plan"] if isinstance(c["plan"], str) else c["estimate"]["plan"]
        run_estimate(case, tally, plan=plan, expect=json.dumps(c["estimate"]))
        refused = run_refuses(plan, case.batch, case.seq)
        if refused:
            tally.violations.append((case.index, argv, [f"autoplan run refuses {plan}: {refused}"]))


def run_refuses(plan: str, batch: int, seq: int) -> str:
    """What ``autoplan run`` says against a plan before starting processes ('' : nothing)."""
    from autoplan.apply.parallel import check_supported
    from autoplan.errors import UserError
    from autoplan.plan import Plan

    try:
        check_supported(Plan.parse(plan), batch, seq)
    except UserError as e:
        return str(e)
    return ""


def run(seed: int, cases: int, search_every: int, models: int, progress: bool) -> Tally:
    rng, tally, t0 = random.Random(seed), Tally(), time.time()
    pool = draw_models(rng, models)
    with tempfile.TemporaryDirectory(prefix="fuzz-api-") as tmp:
        for i in range(cases):
            case = draw_case(rng, i, tmp, search_every, pool)
            tally.cases += 1
            found = len(tally.crashes) + len(tally.violations)
            (run_search if case.search else run_estimate)(case, tally)
            if progress and len(tally.crashes) + len(tally.violations) > found:
                print(f"case {i}: {(tally.crashes + tally.violations)[-1]}", file=sys.stderr, flush=True)
            if progress and (i + 1) % 25 == 0:
                print(f"[{time.time() - t0:7.0f} s] {i + 1} cases, {len(tally.crashes)} crashes, "
                      f"{len(tally.violations)} violations", file=sys.stderr, flush=True)
    return tally


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--search-every", type=int, default=10, help="every N-th case runs search (0: never)")
    ap.add_argument("--models", type=int, default=150, help="distinct (model spec, seq) pairs drawn")
    ap.add_argument("--json", help="write the tally (crashes and violations in full) to this file")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    tally = run(args.seed, args.cases, args.search_every, args.models, not args.quiet)
    summary = {"seed": args.seed, "cases": tally.cases, "models": args.models, "searches": tally.searches,
               "estimates": tally.estimates,
               "accepted": tally.accepted, "refused": sum(tally.refused.values()), "crashes": len(tally.crashes),
               "violations": len(tally.violations), "seconds": round(time.time() - t0)}
    print(json.dumps(summary, sort_keys=True))
    for kind, rows in (("CRASH", tally.crashes), ("VIOLATION", tally.violations)):
        for index, argv, what in rows[:20]:
            print(f"{kind} case {index}: autoplan {' '.join(argv)}\n    {what}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**summary, "refused_by_message": dict(tally.refused.most_common()),
                       "crash_cases": tally.crashes, "violation_cases": tally.violations}, f, indent=1, default=str)
    return 1 if tally.crashes or tally.violations else 0


if __name__ == "__main__":
    sys.exit(main())
