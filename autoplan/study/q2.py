"""Q2: where does FSDP/ZeRO-3 alone stop being enough for dense pre-training — its MFU ceiling,
and the break-point (model size, sequence length, GPU count, network) at which TP, PP or CP
must come in?

Each scenario (a Llama 3 model, a GPU count of H100 nodes, a sequence length, NICs per node;
8M tokens per step, Llama 3's mid-training batch) is searched twice:

* ``fsdp``: tp = pp = cp = 1, ZeRO-3 only — FSDP over every GPU, the search choosing the
  micro-batch and the recomputation;
* ``free``: the whole space.

FSDP alone stops being enough where it fits nowhere (model states, activations), where the
batch has fewer sequences than GPUs (every FSDP rank needs one: the batch floor), or where the
best plan beats it by more than the out-of-sample error of the regimes the two plans lean on.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autoplan.explain.rules import MFU_BAND
from autoplan.search import Constraints
from autoplan.study.common import (
    Setting,
    Study,
    Sweep,
    cluster_with_nics,
    grid_study,
    leans_text,
    margin,
    model_label,
    ok,
    rule_sentence,
    seq_label,
)
from autoplan.study.output import COLORS, band_line, error_band, png_bytes, pyplot, seq_axis

TITLE = "Q2 · Where FSDP/ZeRO-3 alone stops being enough: MFU ceiling and break-points"
FSDP = Constraints(tp=(1,), cp=(1,), pp=(1,))
TINY_MODEL = "llama:layers=4,hidden=768,heads=12,kv_heads=4,ffn=2048,vocab=32000"
GRIDS: dict[str, dict[str, Any]] = {   # clusters: h100x<GPUs>, NICs per node varied where named
    "full": {"models": ("llama3-8b", "llama3-70b", "llama3-405b"), "gpus": (128, 512, 2048), "seq": 8192,
             "seqs": (4096, 8192, 16384, 32768), "seq_model": "llama3-70b", "seq_gpus": 512, "nics": (8, 2, 1),
             "tokens": 8 * 2 ** 20},
    "quick": {"models": ("llama3-8b",), "gpus": (128, 512), "seq": 8192, "seqs": (8192,), "seq_model": "llama3-70b",
              "seq_gpus": 512, "nics": (8, 1), "tokens": 8 * 2 ** 20},
    # smoke test: 64 GPUs and 32 sequences per step, below FSDP's batch floor
    "tiny": {"models": (TINY_MODEL,), "gpus": (16, 64), "seq": 4096, "seqs": (4096,), "seq_model": TINY_MODEL,
             "seq_gpus": 16, "nics": (8,), "tokens": 2 ** 17},
}


def grid(size: str) -> tuple[dict, list[Setting]]:
    g = GRIDS[size]
    cells = [(m, n, g["seq"], 8) for m in g["models"] for n in g["gpus"]]
    cells += [(g["seq_model"], g["seq_gpus"], s, 8) for s in g["seqs"]]
    cells += [(g["seq_model"], g["seq_gpus"], g["seq"], k) for k in g["nics"]]
    settings = []
    for model, gpus, seq, nics in dict.fromkeys(cells):
        cluster = cluster_with_nics(f"h100x{gpus}", nics)
        axes = {"model": model, "gpus": gpus, "seq": seq, "nics_per_node": nics}
        settings += [Setting(axes, "fsdp", model, cluster, seq, g["tokens"] // seq, FSDP, zero=(3,)),
                     Setting(axes, "free", model, cluster, seq, g["tokens"] // seq)]
    return {"arms": {"fsdp": FSDP.describe() + ", zero ∈ {3}", "free": "none"},
            **{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()}}, settings


def study(sweep: Sweep, errors: dict[str, dict], *, size: str) -> Study:
    return grid_study("q2", TITLE, sweep, errors, grid(size), finding=_finding, rules=_rules, answer=_answer,
                      table=_table, headline=lambda findings, _rules: _headline(findings))


def _finding(axes: dict, arms: dict[str, dict], errors: dict[str, dict]) -> dict:
    fsdp, free = arms.get("fsdp"), arms.get("free")
    out: dict[str, Any] = {"axes": axes, "fsdp_plan": fsdp["compact"] if ok(fsdp) else None,
                           "fsdp_mfu": fsdp["mfu"] if ok(fsdp) else None,
                           "free_plan": free["compact"] if ok(free) else None,
                           "free_mfu": free["mfu"] if ok(free) else None,
                           "why_not": None if ok(fsdp) else _why_not(fsdp, axes)}
    if ok(fsdp) and ok(free):
        out.update(margin(fsdp, free, errors))
    out["enough"] = None if not ok(free) else bool(ok(fsdp) and out["inside_error"])
    return out


def _why_not(p: dict | None, axes: dict) -> str:
    if p is None:
        return "not searched"
    if p["status"] == "no-mesh":
        return f"batch floor: {p['global_batch']:,} sequences for {axes['gpus']:,} FSDP ranks"
    return "memory: fits nowhere even at micro-batch 1 with full recomputation"


def _rules(findings: list[dict]) -> list[dict]:
    """The explainer's MFU band (dense 40–55 %) against the search: a plan below the band is
    flagged as leaving throughput on the table; is FSDP's plan below it exactly where the search
    finds a better one beyond the error?"""
    low, _ = MFU_BAND["dense"]
    out = []
    for f in findings:
        if f["fsdp_mfu"] is None or f["enough"] is None:
            continue
        says = f["fsdp_mfu"] < low
        finds = (f"FSDP alone {f['fsdp_plan']} at MFU {f['fsdp_mfu']:.1%}; the best plan {f['free_plan']} at "
                 f"{f['free_mfu']:.1%} ({'outside' if not f['inside_error'] else 'inside'} the {f['error']:.1%} error)")
        out.append({"rule": "mfu-band", "scenario": _where(f),
                    "says": f"MFU {f['fsdp_mfu']:.1%} {'below' if says else 'inside'} the dense band "
                            f"{low:.0%}–{MFU_BAND['dense'][1]:.0%}" + (": look for a better plan" if says else ""),
                    "finds": finds, "agrees": says == (not f["enough"]), "matters": not f["enough"]})
    return out


def _answer(findings: list[dict], leaning: list[dict], rules: list[dict], g: dict) -> str:
    tokens = g["tokens"]
    ran = [f for f in findings if f["fsdp_mfu"] is not None]
    text = (f"FSDP alone (ZeRO-3 over every GPU, no TP/PP/CP; {tokens / 2 ** 20:g}M tokens per step) over "
            f"{len(findings)} scenarios: ")
    if ran:
        top = max(ran, key=lambda f: f["fsdp_mfu"])
        text += (f"its MFU ceiling is {top['fsdp_mfu']:.1%} ({_where(top)}), its range "
                 f"{min(f['fsdp_mfu'] for f in ran):.1%}–{top['fsdp_mfu']:.1%}. ")
    enough = [f for f in findings if f["enough"]]
    behind = [f for f in findings if f["enough"] is False and f["fsdp_mfu"] is not None]
    cannot = [f for f in findings if f["why_not"]]
    text += f"It is enough — within the out-of-sample error of the best plan — in {len(enough)}"
    text += (" (" + ", ".join(f"{_where(f)}, {f['margin']:+.1%}" for f in enough) + ")" if enough else "") + ". "
    if behind:
        text += ("It falls behind by more than the error in " + ", ".join(
            f"{_where(f)} ({f['margin']:+.1%}; the best plan {f['free_plan']})" for f in behind) + ". ")
    if cannot:
        text += "It cannot run in " + ", ".join(f"{_where(f)} ({f['why_not']})" for f in cannot) + ". "
    text += _breakpoints(findings, g)
    text += rule_sentence("MFU below the dense 40–55 % band → a better plan exists", rules)
    return text + f"Leans on: {leans_text(leaning)}."


def _headline(findings: list[dict]) -> str:
    ran = [f for f in findings if f["fsdp_mfu"] is not None]
    enough = [f for f in findings if f["enough"]]
    behind = [f for f in findings if f["enough"] is False and f["fsdp_mfu"] is not None]
    cannot = [f for f in findings if f["why_not"]]
    text = f"FSDP alone peaks at {max(f['fsdp_mfu'] for f in ran):.1%} MFU; " if ran else ""
    text += f"within the out-of-sample error of the best plan in {len(enough)} of {len(findings)} scenarios"
    if behind:
        worst = max(behind, key=lambda f: f["margin"])
        text += f", behind beyond it in {len(behind)} (up to {worst['margin']:+.1%}, {_where(worst)})"
    if cannot:
        text += f", unable to run in {len(cannot)} ({'; '.join(sorted({f['why_not'].split(':')[0] for f in cannot}))})"
    return text


def _breakpoints(findings: list[dict], g: dict) -> str:
    """Where FSDP alone stops being enough: per model, the smallest GPU count (at the grid's
    sequence, 8 NICs per node); for the sequence sweep's model, the shortest sequence; and its
    verdict per NIC count."""
    decided = [f for f in findings if f["enough"] is not None]

    def line(fs: list[dict], axis: str, show: Callable[[int], str]) -> str | None:
        fs = sorted(fs, key=lambda f: f["axes"][axis])
        if len(fs) < 2:
            return None
        first = next((f for f in fs if not f["enough"]), None)
        return (f"enough up to {show(fs[-1]['axes'][axis])}" if first is None else
                f"stops being enough at {show(first['axes'][axis])}")

    parts = []
    for model in dict.fromkeys(f["axes"]["model"] for f in decided):
        verdict = line([f for f in decided if f["axes"]["model"] == model and f["axes"]["nics_per_node"] == 8
                        and f["axes"]["seq"] == g["seq"]], "gpus", lambda n: f"{n:,} GPUs")
        if verdict:
            parts.append(f"{model_label(model)}: {verdict}")
    text = ("Break-points by GPU count (at " + seq_label(g["seq"]) + "): " + "; ".join(parts) + ". ") if parts else ""
    at = [f for f in decided if f["axes"]["model"] == g["seq_model"] and f["axes"]["gpus"] == g["seq_gpus"]]
    verdict = line([f for f in at if f["axes"]["nics_per_node"] == 8], "seq", seq_label)
    if verdict:
        text += f"By sequence ({model_label(g['seq_model'])} on {g['seq_gpus']:,} GPUs): {verdict}. "
    nics = sorted((f for f in at if f["axes"]["seq"] == g["seq"]), key=lambda f: -f["axes"]["nics_per_node"])
    if len(nics) > 1:
        text += (f"By network ({model_label(g['seq_model'])} on {g['seq_gpus']:,} GPUs at {seq_label(g['seq'])}): "
                 + ", ".join(f"{f['axes']['nics_per_node']} NICs/node "
                             + (f"{'enough' if f['enough'] else 'not enough'} ({f['margin']:+.1%})" if "margin" in f
                                else "not enough") for f in nics) + ". ")
    return text


def _where(f: dict) -> str:
    a = f["axes"]
    return (f"{model_label(a['model'])} on {a['gpus']:,} GPUs at {seq_label(a['seq'])}"
            + (f", {a['nics_per_node']} NICs/node" if a["nics_per_node"] != 8 else ""))


def _table(findings: list[dict]) -> str:
    lines = ["| model | GPUs | seq | NICs/node | FSDP alone (MFU) | best plan (MFU) | FSDP vs best (p10–p90) | "
             "FSDP enough? |", "|" + "---|" * 8]
    for f in findings:
        a = f["axes"]
        fsdp = f"{f['fsdp_plan']} ({f['fsdp_mfu']:.1%})" if f["fsdp_plan"] else f"— ({f['why_not']})"
        free = f"{f['free_plan']} ({f['free_mfu']:.1%})" if f["free_plan"] else "no fit"
        m = (f"{f['margin']:+.1%} ({f['margin_p10']:+.1%}…{f['margin_p90']:+.1%}); error {f['error']:.1%}"
             if "margin" in f else "—")
        enough = "—" if f["enough"] is None else "yes" if f["enough"] else "no"
        lines.append(f"| {model_label(a['model'])} | {a['gpus']:,} | {seq_label(a['seq'])} | {a['nics_per_node']} | "
                     f"{fsdp} | {free} | {m} | {enough} |")
    return "\n".join(lines) + "\n"


def figure(results: dict) -> bytes:
    plt = pyplot()
    g = results["grid"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    points = [p for p in results["points"] if p["status"] == "ok"]
    _mfu_vs(axes[0], [p for p in points if p["seq"] == g["seq"] and p["axes"]["nics_per_node"] == 8], "gpus",
            "GPUs (H100, log scale)", by_model=True)
    axes[0].set_xscale("log", base=2)
    axes[0].set_xticks(list(g["gpus"]))
    axes[0].set_xticklabels([f"{n:,}" for n in g["gpus"]])
    axes[0].minorticks_off()
    seq_pts = [p for p in points if p["axes"]["model"] == g["seq_model"] and p["axes"]["gpus"] == g["seq_gpus"]
               and p["axes"]["nics_per_node"] == 8]
    _mfu_vs(axes[1], seq_pts, "seq", "", by_model=False)
    seq_axis(axes[1], g["seqs"], f"sequence length (tokens), {g['seq_model']} on {g['seq_gpus']:,} GPUs")
    _network(axes[2], results["findings"], g, results["leans_on"])
    fig.suptitle(results["title"] + f" ({g['tokens'] / 2 ** 20:g}M tokens per step; solid: FSDP alone, dashed: best "
                 "plan; p10–p90 shaded, by GPUs for FSDP alone only)",
                 fontsize=10)
    fig.tight_layout()
    return png_bytes(fig)


def _mfu_vs(ax: Any, points: list[dict], x: str, xlabel: str, *, by_model: bool) -> None:
    models = dict.fromkeys(p["axes"]["model"] for p in points) if by_model else {None: None}
    for i, model in enumerate(models):
        for arm, style in (("fsdp", "-"), ("free", "--")):
            ps = sorted((p for p in points if p["arm"] == arm and (model is None or p["axes"]["model"] == model)),
                        key=lambda p: p["axes"][x])
            if not ps:
                continue
            color = f"C{i}" if by_model else COLORS[arm]
            label = (model_label(model) + " " if model else "") + ("FSDP alone" if arm == "fsdp" else "best plan")
            band_line(ax, [p["axes"][x] for p in ps], [p["mfu"] * 100 for p in ps],
                      [p["band"]["mfu_p10"] * 100 for p in ps], [p["band"]["mfu_p90"] * 100 for p in ps],
                      label=label, color=color, linestyle=style,
                      alpha=0.18 if arm == "fsdp" or not by_model else 0.0)   # by model: FSDP's band only
    low, high = MFU_BAND["dense"]
    ax.axhspan(low * 100, high * 100, color="#2da44e", alpha=0.06, linewidth=0, label="explain's dense MFU band")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("MFU (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)


def _network(ax: Any, findings: list[dict], g: dict, leaning: list[dict]) -> None:
    fs = sorted((f for f in findings if f["axes"]["model"] == g["seq_model"] and f["axes"]["gpus"] == g["seq_gpus"]
                 and f["axes"]["seq"] == g["seq"] and "margin" in f), key=lambda f: -f["axes"]["nics_per_node"])
    worst = max((x["out_of_sample_mean"] for x in leaning), default=0.0)
    error_band(ax, worst, f"±{worst:.1%}: largest out-of-sample error leaned on")
    xs = list(range(len(fs)))
    ax.bar(xs, [f["margin"] * 100 for f in fs], color=COLORS["fsdp"],
           yerr=[[max(0.0, (f["margin"] - f["margin_p10"]) * 100) for f in fs],
                 [max(0.0, (f["margin_p90"] - f["margin"]) * 100) for f in fs]], capsize=3)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{f['axes']['nics_per_node']} × 400G" for f in fs])
    ax.set_xlabel(f"NICs per 8-GPU node (400 Gb/s each), {g['seq_model']} on {g['seq_gpus']:,} GPUs at "
                  f"{seq_label(g['seq'])}")
    ax.set_ylabel("FSDP alone vs best plan (% step time)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=6)
