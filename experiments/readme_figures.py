"""Regenerate every figure of README.md: each block between ``<!-- NAME:start -->`` and
``<!-- NAME:end -->`` is rewritten from what this machine measures now, and timings say which
machine measured them.  Nothing in those blocks is written by hand.

    python experiments/readme_figures.py              # every block (several minutes on 2 cores)
    python experiments/readme_figures.py --only tour  # some blocks
    python experiments/readme_figures.py --list       # the blocks and what produces them

Blocks:

* ``trace-speed``: Llama-3 405B's trace time and peak RSS, a fresh process, cache off, on
  ``--cores`` cores (``bench_trace.run_child``);
* ``validation``: the published-run errors (``validate_published``: the Megatron rows, the
  held-out H100 table, Nemotron-4 340B);
* ``tour``: ``autoplan search gpt3-175b --cluster h100x1024`` as a 100-column terminal shows it;
* ``run-check``: ``autoplan run … --check`` on 4 CPU processes;
* ``export-example``: the best plan of the tour's search exported to Megatron-LM and torchtitan;
* ``deepseek-mla``: the zoo DeepSeek-V3's multi-head latent attention (``zoo.mla``) and its size;
* ``activations``: saved activations of traced blocks against Korthikanti's formulas
  (``check_activations``);
* ``evidence-mfu``: the best published MFU per model kind the evidence flags compare against
  (``costmodels/evidence.yaml``);
* ``robust-check``: the default objective's worst regret under the perturbations of
  ``experiments/perturbations/`` and its p50 against the point optimum's (``perturbations``);
* ``bench-quick``: the wall and CPU time of ``autoplan bench --suite quick`` on this machine;
* ``study-answers``: the five answers of ``autoplan study q1 … q5`` in one line each with their
  error bands, read from ``experiments/study/QN/results.json`` (each written by the command it
  names, the full grid unless it says ``--quick``; RESULTS.md has each study's section).
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

TOUR = ("search", "gpt3-175b", "--cluster", "h100x1024")
RUN_CHECK = ("run", "gpt:layers=4,hidden=64,heads=4,vocab=256", "--plan", "tp=2,pp=2", "--nproc", "4", "--steps", "4",
             "--check")
EXPORTS = (("megatron", "--model", "gpt3-175b", "--global-batch", "1024", "--seq", "2048"),
           ("torchtitan", "--model", "gpt3-175b", "--global-batch", "1024", "--seq", "2048"))
TOUR_MORE = """$ autoplan estimate gpt3-175b --cluster h100x1024 \\
      --plan tp=8,pp=8,vpp=3,schedule=interleaved,recompute=selective        # price a hand-written plan
$ autoplan baseline gpt3-175b --cluster h100x1024 --recipe megatron           # what a recipe gives
$ autoplan baseline gpt3-175b --cluster h100x1024 --recipe published          # what MegaScale published
$ autoplan search gpt3-175b --cluster h100x1024 --params experiments/perturbations/nic.yaml   # NICs at 80 %
$ autoplan search gpt3-175b --cluster h100x1024 --json > plans.json
$ autoplan explain plans.json --model gpt3-175b --cluster h100x1024 --baseline megascale --format html -o audit.html
$ autoplan export plans.json --to megatron --model gpt3-175b                  # Megatron-LM arguments
$ autoplan run gpt:layers=4,hidden=64,heads=4,vocab=256 --plan tp=2,pp=2 --nproc 4 --steps 4   # CPU, gloo"""


def machine() -> str:
    """The machine a timing was measured on: CPU model and core count, from /proc/cpuinfo."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores"


def autoplan(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``python -m autoplan ARGS`` from the repository, stdout on a pipe."""
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "autoplan", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, check=check)


def on_terminal(args: tuple[str, ...], columns: int) -> subprocess.CompletedProcess:
    """``python -m autoplan ARGS`` with stdout on a pseudo-terminal of ``columns`` columns, as a
    user sees it (styles stripped, trailing blanks dropped); stderr on a pipe, so no progress bar."""
    import pty
    import threading

    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=REPO, COLUMNS=str(columns), TERM="xterm")
    p = subprocess.Popen([sys.executable, "-m", "autoplan", *args], stdout=slave, stderr=subprocess.PIPE,
                         text=True, cwd=REPO, env=env)
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:                 # EIO: the child closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read)
    reader.start()
    stderr = p.communicate()[1]
    reader.join()
    os.close(master)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode().replace("\r\n", "\n"))
    return subprocess.CompletedProcess(p.args, p.returncode, "\n".join(l.rstrip() for l in text.splitlines()) + "\n",
                                       stderr)


def pct(x: float) -> str:
    """A fraction as the README writes it: "3.6 %"."""
    return f"{100 * abs(x):.1f} %"


def _fill(text: str, width: int = 100) -> str:
    """``text`` wrapped at ``width`` columns, never between a number and its unit ("3.6 %")."""
    glued = re.sub(r"(\d) (%|pp|s\b|GB)", "\\1\x00\\2", text)
    return textwrap.fill(glued, width=width, break_long_words=False, break_on_hyphens=False).replace("\x00", " ")


# --- the blocks ------------------------------------------------------------------------

def trace_speed(cores: int) -> str:
    from bench_trace import run_child

    r = run_child("llama3-405b", 2048, cores, 3)           # the fastest of 3: the machine may be shared
    return (f"Llama-3 405B traces in {r['seconds']:.1f} s using {r['peak_rss_bytes'] / 1e9:.1f} GB of RAM "
            f"on {cores} cores of an {machine().rsplit(',', 1)[0]}")


def validation(cores: int) -> str:
    import cross_validation as cv
    import validate_published as vp

    errors = [abs(err) for _, e, err, _ in vp.price_rows() if e is not None]
    _, h100_mean = vp.held_out_h100()
    nemotron = [(run.gpus, e.step_time_s / run.published_s - 1)
                for run, (e, _) in zip(vp.NEMOTRON_RUNS, vp.nemotron_estimates())]
    held = " and ".join(f"{pct(err)} ({n:,} H100)" for n, err in nemotron)
    return _fill(
        f"The cost model reproduces {len(errors)} published Megatron runs (SC21 Table 1, Korthikanti Table 5) with "
        f"**{pct(sum(errors) / len(errors))} mean and {pct(max(errors))} max error** on iteration time using "
        f"physical parameters only; on runs it was never fitted to, Megatron-LM's H100 table comes out within "
        f"{100 * h100_mean:.1f} pp MFU on average and Nemotron-4 340B's step time within {held} "
        f"(`experiments/RESULTS.md`). " + out_of_sample(cv))


def out_of_sample(cv) -> str:
    """The leave-one-source-out sentence: the error on each regime's rows with every fitted
    parameter refitted without the row's own source (``validate_published.py --cv``)."""
    o = cv.summary(cv.cross_validate())["out_of_sample"]
    names = (("megatron", "Megatron-style"), ("fsdp", "FSDP"), ("schedule", "pipeline-schedule"),
             ("cp", "context-parallel"), ("single-node", "vTrain single-node"))
    parts = ", ".join(f"{pct(o[k]['mean_abs'])} on {o[k]['rows']} {label}" for k, label in names)
    return (f"**Out of sample** — each source left out, every fitted parameter refitted without it, its rows "
            f"priced (`python experiments/validate_published.py --cv`) — the mean error is {parts} rows "
            f"(vTrain's host-time parameters have no second source: left out, they fall to their priors).")


def tour(cores: int) -> str:
    out = on_terminal(TOUR, 100)
    if out.returncode:
        raise RuntimeError(out.stderr)
    return (f"```console\n$ autoplan {' '.join(TOUR)}\n{out.stdout}{TOUR_MORE}\n```\n\n"
            f"The table as a 100-column terminal shows it; the search time (its last line) measured on "
            f"{machine()}.")


def run_check(cores: int) -> str:
    out = autoplan(*RUN_CHECK)
    tail = out.stdout.rstrip("\n").splitlines()[-3:]
    return "```\n$ autoplan " + " ".join(RUN_CHECK) + "\n...\n" + "\n".join(tail) + "\n```"


def export_example(cores: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        plans = os.path.join(tmp, "plans.json")
        autoplan(*TOUR, "--json", "-o", plans)
        shown = []
        for engine, *rest in EXPORTS:
            out = autoplan("export", plans, "--to", engine, *rest)
            shown.append(f"$ autoplan export plans.json --to {engine} {' '.join(rest)}\n{out.stderr}{out.stdout}")
    return (f"The best plan of the README's main command (`autoplan {' '.join(TOUR)} --json > plans.json`),\n"
            f"exported:\n\n```console\n" + "\n".join(shown) + "```")


def deepseek_mla(cores: int) -> str:
    import torch

    from autoplan import zoo
    from autoplan.zoo.mla import MLAttention

    cfg = zoo.ZOO["deepseek-v3"]
    assert isinstance(cfg, zoo.LlamaConfig)         # a MoEConfig
    with torch.device("meta"):
        attention = next(m for m in zoo.build(cfg).modules() if isinstance(m, MLAttention))
    params = sum(p.numel() for p in attention.parameters())
    return (f"multi-head latent attention as DeepSeek-V3 has it (`zoo.mla`: {cfg.heads} heads, q/k head "
            f"{cfg.d_head} + {cfg.qk_rope_dim} rotary, v head {cfg.v_head_dim}, latent ranks {cfg.kv_lora_rank} "
            f"for k/v and {cfg.q_lora_rank} for q; {params / 1e6:.1f} M parameters a layer)")


def activations(cores: int) -> str:
    from check_activations import rows

    table = rows()
    return (f"within {pct(max(abs(r.error) for r in table))} of Korthikanti's formulas in "
            f"{len(table)} settings, `experiments/check_activations.py`")


def evidence_mfu(cores: int) -> str:
    from autoplan.cost.evidence import coverage

    best = coverage()["max_mfu"]
    return ", ".join(f"{pct(value)} {kind}" for kind, (value, _source) in best.items())


def robust_check(cores: int) -> str:
    import perturbations as pt
    from autoplan.plan import Plan

    parts = []
    for model, cluster, seq, batch in pt.CASES:
        row = pt.run_case(model, cluster, seq, batch)
        a = row["acceptance"]
        worst = max(row["perturbed"], key=lambda p: row["perturbed"][p]["regret"][a["objective"]])
        same = row["chosen"][a["objective"]]["plan"] == row["chosen"]["point"]["plan"]
        plan = Plan.parse(row["chosen"][a["objective"]]["plan"]).to_compact()
        parts.append(f"on {model} / {cluster} the {a['objective']} choice (`{plan}`"
                     f"{', also the point optimum' if same else ''}) has worst regret {pct(a['worst_regret'])} "
                     f"(under `{worst}.yaml`) and a p50 {pct(a['p50_over_point_p50'] - 1)} "
                     f"{'above' if a['p50_over_point_p50'] >= 1 else 'below'} the point optimum's")
    return "; ".join(parts)


def bench_quick(cores: int) -> str:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, AUTOPLAN_CACHE_DIR=os.path.join(tmp, "cache"))     # cold: tracing included
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "autoplan", "bench", "--suite", "quick", "--out", tmp], cwd=REPO,
                       env=env, check=True, capture_output=True, text=True)
        wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return f"three small cases, {wall:.0f} s wall and {cpu:.0f} CPU s cold on {machine()}"


STUDIES = ("q1", "q2", "q3", "q4", "q5")


def study_answers(cores: int) -> str:
    """One line per study: its headline, its error band (the out-of-sample error of the regimes
    its plans lean on), the command that wrote it, its RESULTS section."""
    import json

    from autoplan.study.output import error_band_text

    lines = []
    for q in STUDIES:
        path = os.path.join(REPO, "experiments", "study", q, "results.json")
        if not os.path.exists(path):
            raise SystemExit(f"{path} is missing: run `autoplan study {q} --out experiments/study/{q} "
                             f"--results-md experiments/RESULTS.md` first")
        with open(path) as f:
            r = json.load(f)
        title = r["title"].split(" · ", 1)[1]
        lines.append(f"- **{q.upper()} · {title}**: {r['headline']}; error band {error_band_text(r)} "
                     f"(`{r['command'].split(' --out')[0]}`; `experiments/RESULTS.md`, section {q.upper()})")
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[int], str]] = {"trace-speed": trace_speed, "validation": validation, "tour": tour,
                                           "run-check": run_check, "export-example": export_example,
                                           "deepseek-mla": deepseek_mla, "activations": activations,
                                           "evidence-mfu": evidence_mfu, "robust-check": robust_check,
                                           "bench-quick": bench_quick, "study-answers": study_answers}


def replace_block(text: str, name: str, body: str) -> str:
    """``text`` with the part between ``<!-- name:start -->`` and ``<!-- name:end -->`` set to
    ``body``; a block that starts on its own line keeps its body on lines of its own."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if text.count(start) != 1 or text.count(end) != 1:
        raise SystemExit(f"README.md needs exactly one {start} … {end} pair")
    i, j = text.index(start) + len(start), text.index(end)
    inline = text[i:j].count("\n") == 0
    return text[:i] + (body if inline else "\n" + body.rstrip("\n") + "\n") + text[j:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=sorted(BLOCKS), metavar="BLOCK", help="regenerate these blocks only")
    ap.add_argument("--cores", type=int, default=2, help="cores the trace timing is pinned to (default 2)")
    ap.add_argument("--readme", default=README, help="the file to rewrite (default README.md)")
    ap.add_argument("--list", action="store_true", help="list the blocks and exit")
    args = ap.parse_args(argv)
    if args.list:
        for name, fn in BLOCKS.items():
            print(f"{name}: {fn.__name__}")
        return 0
    for name in args.only or BLOCKS:
        print(f"regenerating {name} …", file=sys.stderr, flush=True)
        body = BLOCKS[name](args.cores)
        text = replace_block(open(args.readme).read(), name, body)   # read now: edits made meanwhile stay
        with open(args.readme, "w") as f:          # each block as soon as it is measured
            f.write(text)
    print(f"wrote {args.readme} ({machine()})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
