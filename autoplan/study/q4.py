"""Q4: ring vs Ulysses vs USP — break-points by sequence length, heads and KV heads, and the
NVLink/IB bandwidth ratio.

Every scenario (a model of the Llama-3-8B shape on 64 H100, 4M tokens per step) is searched
three times, each arm held to one CP algorithm with cp ≥ 2 (``Constraints(cp=(2, …, 32),
cp_algos=(algo,))``); everything else — tp, pp, dp, cp's degree, USP's split, ZeRO, micro-batch,
schedule, recompute — is the search's.  USP exists only where tp·cp spans more than one NVLink
domain (below that it is Ulysses: ``search.space``), and Ulysses only where the query heads on a
tp rank divide by its degree.  The axes: sequence length (16K–256K) at two NVLink/IB ratios; the
ratio (8, 4, 2, 1 NICs per 8-GPU node) at 64K; heads (GQA 32q/8kv, MHA, MQA, 24 query heads).
"""
from __future__ import annotations

from typing import Any

from autoplan.search import Constraints
from autoplan.study.common import (
    Setting,
    Study,
    Sweep,
    cluster_with_nics,
    grid_study,
    leans_text,
    load_pairs,
    margin,
    nvlink_ib_ratio,
    ok,
    plan_fields,
    ranked,
    ratio_band,
    seq_label,
)
from autoplan.study.output import COLORS, band_line, error_band, png_bytes, pyplot, seq_axis

TITLE = "Q4 · Ring vs Ulysses vs USP: break-points by sequence length, heads and NVLink/IB ratio"
ALGOS = ("ring", "ulysses", "usp")
CP = (2, 4, 8, 16, 32)
TINY_MODEL = "llama:layers=4,hidden=768,heads=12,kv_heads=4,ffn=2048,vocab=32000"
HEADS = {   # label -> model (Llama-3-8B's shape; only the attention heads change)
    "32q/8kv": "llama3-8b",
    "32q/32kv": "llama:layers=32,hidden=4096,heads=32,kv_heads=32,ffn=14336,vocab=128256",
    "32q/1kv": "llama:layers=32,hidden=4096,heads=32,kv_heads=1,ffn=14336,vocab=128256",
    "24q/8kv": "llama:layers=32,hidden=4096,heads=24,kv_heads=8,head_dim=128,ffn=14336,vocab=128256",
}
_BASE = {"cluster": "h100x64", "tokens": 4 * 2 ** 20, "base_heads": "32q/8kv", "heads_models": HEADS}
GRIDS: dict[str, dict[str, Any]] = {
    "full": {**_BASE, "seqs": (16384, 32768, 65536, 131072, 262144), "seq_nics": (8, 2), "ratio_seq": 65536,
             "ratio_nics": (8, 4, 2, 1), "heads_seq": 65536, "heads": tuple(HEADS)},
    "quick": {**_BASE, "seqs": (16384, 131072), "seq_nics": (8,), "ratio_seq": 131072, "ratio_nics": (8, 1),
              "heads_seq": 65536, "heads": ("24q/8kv",)},
    # smoke test (seconds): a 4-layer model with 12 query heads on 16 GPUs
    "tiny": {"cluster": "h100x16", "tokens": 2 ** 18, "base_heads": "12q/4kv", "heads_models": {"12q/4kv": TINY_MODEL},
             "seqs": (16384, 65536), "seq_nics": (8,), "ratio_seq": 65536, "ratio_nics": (8,), "heads_seq": 65536,
             "heads": ()},
}


def grid(size: str) -> tuple[dict, list[Setting]]:
    g = GRIDS[size]
    base = g["base_heads"]
    cells: list[tuple[int, str, int]] = [(s, base, n) for n in g["seq_nics"] for s in g["seqs"]]
    cells += [(g["ratio_seq"], base, n) for n in g["ratio_nics"]]
    cells += [(g["heads_seq"], h, g["seq_nics"][0]) for h in g["heads"]]
    settings = []
    for seq, heads, nics in dict.fromkeys(cells):
        cluster = cluster_with_nics(g["cluster"], nics)
        axes = {"seq": seq, "heads": heads, "nics_per_node": nics, "nvlink_ib": round(nvlink_ib_ratio(cluster), 1)}
        settings += [Setting(axes, algo, g["heads_models"][heads], cluster, seq, g["tokens"] // seq,
                             Constraints(cp=CP, cp_algos=(algo,))) for algo in ALGOS]
    description = {"arms": {a: f"cp ∈ {{{', '.join(map(str, CP))}}}, cp_algo {a}" for a in ALGOS},
                   **{k: list(v) if isinstance(v, tuple) else v for k, v in g.items() if k != "heads_models"},
                   "heads_models": {h: g["heads_models"][h] for h in (base, *g["heads"])}}
    return description, settings


def study(sweep: Sweep, errors: dict[str, dict], *, size: str) -> Study:
    pairs = algorithm_pairs(load_pairs("cp"))
    return grid_study("q4", TITLE, sweep, errors, grid(size), finding=_finding, rules=_rules,
                      answer=lambda findings, leaning, _rules, g: _answer(findings, leaning, errors, g),
                      table=_table, headline=lambda findings, _rules: _headline(findings, pairs))


def _finding(axes: dict, arms: dict[str, dict], errors: dict[str, dict]) -> dict:
    order = ranked(arms)
    out: dict[str, Any] = {"axes": axes, "refused": [a for a in ALGOS if not ok(arms.get(a))],
                           "winner": order[0][0] if order else None, "runner_up": None,
                           "vs_ring": {}, "step_time_s": {a: p["step_time_s"] for a, p in order},
                           "plans": {a: p["compact"] for a, p in order},
                           "attention_share": order[0][1]["attention_share"] if order else None}
    ring = arms.get("ring")
    for a, p in order:
        if ok(ring):
            r = ratio_band(p, ring)
            out["vs_ring"][a] = {k: v - 1 for k, v in r.items()}
    if len(order) > 1:
        out["runner_up"] = order[1][0]
        out.update(margin(order[1][1], order[0][1], errors))
        # every slower algorithm's gap to the fastest, and what its plan had to give up
        out["gaps"] = {a: {**margin(p, order[0][1], errors), "why": _why_slower(p, order[0][1])}
                       for a, p in order[1:]}
    return out


def _why_slower(slow: dict, fast: dict) -> str:
    """What the slower plan gave up, read off the two plans: a smaller cp (plain Ulysses keeps its
    all-to-all inside one NVLink domain, so tp·cp ≤ the domain), more recomputation."""
    parts = []
    if slow["cp"] < fast["cp"]:
        parts.append(f"cp {slow['cp']} against {fast['cp']}" + (
            " — plain Ulysses keeps its all-to-alls in one NVLink domain, tp·cp ≤ 8" if slow["cp_algo"] == "ulysses"
            else ""))
    strength = {"none": 0, "selective": 1, "op": 2, "full": 3}
    if max(strength[r] for r in slow["recompute"]) > max(strength[r] for r in fast["recompute"]):
        parts.append(f"recompute {'/'.join(slow['recompute'])} against {'/'.join(fast['recompute'])}")
    return "; ".join(parts)


def _answer(findings: list[dict], leaning: list[dict], errors: dict[str, dict], g: dict) -> str:
    decided = [f for f in findings if f["runner_up"] is not None]
    wins = {a: [f for f in decided if f["winner"] == a] for a in ALGOS}
    margins = sorted(f["margin"] for f in decided)
    inside = [f for f in decided if f["inside_error"]]
    cp_err = errors["cp"]["out_of_sample_mean"]
    order = sorted((a for a in ALGOS if wins[a]), key=lambda a: -len(wins[a]))
    text = (f"Each algorithm's best plan with cp ≥ 2 ({g['heads_models'][g['base_heads']]} and its head variants on "
            f"{g['cluster']}, {g['tokens'] / 2 ** 20:g}M tokens per step), over {len(findings)} scenarios: "
            + "; ".join(f"{a} fastest in {len(wins[a])}" + ("" if i == 0 else
                                                            f" ({', '.join(_where(f) for f in wins[a])})")
                        for i, a in enumerate(order)) + ". ")
    if margins:
        median = margins[len(margins) // 2]
        text += (f"The runner-up is {margins[0]:.1%}–{margins[-1]:.1%} slower (median {median:.1%}); "
                 f"{len(inside)} of {len(decided)} margins are inside the out-of-sample error of the regimes the "
                 f"plans lean on (context parallelism: {cp_err:.1%} mean over {errors['cp']['rows']} published rows)")
        text += (", so the cost model cannot rank the three there: the break-points below are the model's, not "
                 "established. " if inside else ". ")
    text += _breakpoints(findings, g["base_heads"]) + _refusals(findings) + _published(load_pairs("cp"))
    far = [(a, f, g) for f in decided for a, g in f["gaps"].items() if not g["inside_error"]]
    if far:
        text += (" Beyond the error, though: " + "; ".join(
            f"{a} at {_where(f)} is {g['margin']:+.1%} behind {f['winner']}" + (f" ({g['why']})" if g["why"] else "")
            for a, f, g in far) + ".")
    return text + f" Leans on: {leans_text(leaning)}."


def _headline(findings: list[dict], pairs: list[dict]) -> str:
    decided = [f for f in findings if f["runner_up"] is not None]
    wins = {a: sum(f["winner"] == a for f in decided) for a in ALGOS}
    inside = sum(f["inside_error"] for f in decided)
    text = ", ".join(f"{a} fastest in {n}" for a, n in wins.items() if n) + f" of {len(decided)} scenarios"
    if decided:
        text += f", by {min(f['margin'] for f in decided):.1%}–{max(f['margin'] for f in decided):.1%}"
        text += f"; {inside} of {len(decided)} margins inside the CP regime's out-of-sample error"
    far = [(a, f, gap) for f in decided for a, gap in f["gaps"].items() if not gap["inside_error"]]
    if far:
        a, f, gap = max(far, key=lambda t: t[2]["margin"])
        text += f"; beyond the error only where {a} is capped ({gap['margin']:+.1%} at {_where(f)})"
    if pairs:
        text += (f"; the model orders {sum(q['order_right'] for q in pairs)} of {len(pairs)} published algorithm "
                 "pairs the measured way")
    return text


def _where(f: dict) -> str:
    a = f["axes"]
    return f"{seq_label(a['seq'])} {a['heads']} NVLink/IB {a['nvlink_ib']:g}"


def _breakpoints(findings: list[dict], base_heads: str) -> str:
    """Where the fastest algorithm changes along the sequence (per NVLink/IB ratio) and along the ratio."""
    parts = []
    base = [f for f in findings if f["axes"]["heads"] == base_heads and f["winner"]]
    for ratio in sorted({f["axes"]["nvlink_ib"] for f in base}):
        line = sorted((f for f in base if f["axes"]["nvlink_ib"] == ratio), key=lambda f: f["axes"]["seq"])
        if len(line) < 2:
            continue
        changes = [f"{line[i - 1]['winner']}→{line[i]['winner']} between {seq_label(line[i - 1]['axes']['seq'])} and "
                   f"{seq_label(line[i]['axes']['seq'])}" for i in range(1, len(line))
                   if line[i]["winner"] != line[i - 1]["winner"]]
        parts.append(f"at NVLink/IB {ratio:g}, " + ("; ".join(changes) if changes else
                                                   f"{line[0]['winner']} throughout {seq_label(line[0]['axes']['seq'])}"
                                                   f"–{seq_label(line[-1]['axes']['seq'])}"))
    return ("Break-points by sequence: " + "; ".join(parts) + ". ") if parts else ""


def algorithm_pairs(pairs: list[dict]) -> list[dict]:
    """The published pairs that differ only in how the cp axis splits attention (same tp and cp
    degree, another algorithm or Ulysses/ring split): what ranking ring, Ulysses and USP rests on."""
    out = []
    for q in pairs:
        a, b = plan_fields(q["base_plan"]), plan_fields(q["other_plan"])
        if (a.get("tp"), a.get("cp")) == (b.get("tp"), b.get("cp")) and \
                (a.get("cp_algo"), a.get("ulysses")) != (b.get("cp_algo"), b.get("ulysses")):
            out.append({**q, "order_right": (q["measured"] - 1) * (q["predicted"] - 1) > 0})
    return out


def _published(pairs: list[dict]) -> str:
    algo = algorithm_pairs(pairs)
    if not algo:
        return ""
    wrong = [q for q in algo if not q["order_right"]]
    worst = max(algo, key=lambda q: abs(q["predicted"] / q["measured"] - 1))
    return (f"On the published pairs this ranking rests on (same tp and cp degree, another CP split: "
            f"{len(algo)} pairs of the USP paper, A800), the model orders {len(algo) - len(wrong)} of {len(algo)} "
            f"the measured way; worst, {worst['other']} / {worst['base']} measures {worst['measured']:.3f}× and is "
            f"priced {worst['predicted']:.3f}×"
            + (" — the measured order is the other way there, so the model's ranking of ring against Ulysses "
               "is not evidence." if wrong else "."))


def _refusals(findings: list[dict]) -> str:
    out = [f"{', '.join(f['refused'])} refused at {_where(f)} (no plan: heads per tp rank do not divide, or no "
           f"mesh spans domains)" for f in findings if f["refused"]]
    return ("; ".join(out) + ". ") if out else ""


def _rules(findings: list[dict]) -> list[dict]:
    """The explainer has no rule that ranks CP algorithms; its CP trigger (Q5) is checked on the
    winners here for completeness: every point has cp ≥ 2 by construction."""
    shares = [f["attention_share"] for f in findings if f["attention_share"] is not None]
    return [{"rule": "cp-long-context", "says": "CP at attention > 50 % of block compute or seq ≥ 32K",
             "finds": (f"attention is {min(shares):.0%}–{max(shares):.0%} of block compute over these scenarios; "
                       "whether CP is needed at all is Q5's question (here cp ≥ 2 is imposed)") if shares else "—",
             "agrees": None}]


def _table(findings: list[dict]) -> str:
    lines = ["| seq | heads | NVLink/IB | " + " | ".join(f"{a} step s (plan)" for a in ALGOS)
             + " | fastest | runner-up slower by (p10–p90) | inside OOS error? |", "|" + "---|" * (6 + len(ALGOS))]
    for f in findings:
        a = f["axes"]
        cells = [f"{f['step_time_s'][x]:.3f} ({f['plans'][x]})" if x in f["step_time_s"] else "refused"
                 for x in ALGOS]
        m = (f"{f['margin']:.1%} ({f['margin_p10']:.1%}–{f['margin_p90']:.1%})" if f["runner_up"] else "—")
        inside = ("yes" if f["inside_error"] else "no") + f" ({f['error_regime']} {f['error']:.1%})" \
            if f["runner_up"] else "—"
        lines.append(f"| {seq_label(a['seq'])} | {a['heads']} | {a['nvlink_ib']:g} | " + " | ".join(cells)
                     + f" | {f['winner'] or '—'} | {m} | {inside} |")
    return "\n".join(lines) + "\n"


def figure(results: dict) -> bytes:
    plt = pyplot()
    findings = results["findings"]
    cp_err = next((x["out_of_sample_mean"] for x in results["leans_on"] if x["regime"] == "cp"), 0.0)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    g = results["grid"]
    base = g["base_heads"]
    _vs_ring(axes[0], [f for f in findings if f["axes"]["heads"] == base], "seq", g["seq_nics"],
             cp_err, "sequence length (tokens)")
    seq_axis(axes[0], sorted({f["axes"]["seq"] for f in findings if f["axes"]["heads"] == base}),
             "sequence length (tokens)")
    _vs_ring(axes[1], [f for f in findings if f["axes"]["heads"] == base
                       and f["axes"]["seq"] == g["ratio_seq"]], "nvlink_ib", None, cp_err,
             f"NVLink / IB bandwidth per GPU (×), at {seq_label(g['ratio_seq'])}")
    ratios = sorted({f["axes"]["nvlink_ib"] for f in findings})
    axes[1].set_xscale("log", base=2)
    axes[1].set_xticks(ratios)
    axes[1].set_xticklabels([f"{r:g}×" for r in ratios])
    axes[1].minorticks_off()
    _heads(axes[2], [f for f in findings if f["axes"]["seq"] == g["heads_seq"]
                     and f["axes"]["nics_per_node"] == g["seq_nics"][0]], cp_err, g["heads_seq"])
    fig.suptitle(f"{results['title']}\n({g['heads_models'][base]} and head variants, {g['cluster']}, "
                 f"{g['tokens'] / 2 ** 20:g}M tokens per step; each algorithm's best plan "
                 f"with cp ≥ 2; grey: ±{cp_err:.1%} CP out-of-sample error)", fontsize=10)
    fig.tight_layout()
    return png_bytes(fig)


def _vs_ring(ax: Any, findings: list[dict], x: str, nics: Any, cp_err: float, xlabel: str) -> None:
    error_band(ax, cp_err, "CP out-of-sample error")
    groups = ([(n, [f for f in findings if f["axes"]["nics_per_node"] == n]) for n in nics] if nics
              else [(None, findings)])
    for n, fs in groups:
        fs = sorted(fs, key=lambda f: f["axes"][x])
        for algo in ALGOS[1:]:
            pts = [f for f in fs if algo in f["vs_ring"]]
            if not pts:
                continue
            style = "o" if n is None or n == nics[0] else "s"
            label = algo + (f" ({pts[0]['axes']['nvlink_ib']:g}× NVLink/IB)" if n is not None else "")
            band_line(ax, [f["axes"][x] for f in pts], [f["vs_ring"][algo]["point"] * 100 for f in pts],
                      [f["vs_ring"][algo]["p10"] * 100 for f in pts], [f["vs_ring"][algo]["p90"] * 100 for f in pts],
                      label=label, color=COLORS[algo], marker=style)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("step time vs ring (%; > 0: slower than ring)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _heads(ax: Any, findings: list[dict], cp_err: float, seq: int) -> None:
    error_band(ax, cp_err, "CP out-of-sample error")
    order = sorted(findings, key=lambda f: f["axes"]["heads"])
    for j, algo in enumerate(ALGOS[1:]):
        for i, f in enumerate(order):
            r = f["vs_ring"].get(algo)
            if r is None:
                ax.text(i + (j - 0.5) * 0.35, 0.3, "refused", rotation=90, fontsize=7, ha="center", va="bottom")
                continue
            ax.bar(i + (j - 0.5) * 0.35, r["point"] * 100, 0.33, color=COLORS[algo], label=algo if i == 0 else None,
                   yerr=[[max(0.0, (r["point"] - r["p10"]) * 100)], [max(0.0, (r["p90"] - r["point"]) * 100)]],
                   capsize=2)
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels([f["axes"]["heads"] for f in order], fontsize=8)
    ax.set_xlabel(f"query heads / KV heads, at {seq_label(seq)} (bars: p10–p90)")
    ax.set_ylabel("step time vs ring (%; > 0: slower than ring)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
