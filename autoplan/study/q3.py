"""Q3: when does sequence parallelism (with selective recompute) stop being optional — by
sequence length, by attention's share of block compute, by the micro-batch floor?  Is the rule
of thumb "attention > 30 % → SP" right?

Context parallelism is held off (cp = 1: Q5 lets it in), so that SP is the only way to split
activations along the sequence.  Each scenario (a model, its cluster, a sequence length; 4M
tokens per step) is searched three times:

* ``free``: SP on or off, any recompute (the best plan without CP);
* ``no-sp``: SP off wherever there is TP, any recompute — what a plan without SP can do, by a
  smaller micro-batch, more recomputation, more TP or PP, or ZeRO-3;
* ``sp-selective``: SP on wherever there is TP and at most selective recompute (Korthikanti et
  al.'s recipe): whether it still fits, or the micro-batch floor forces full recomputation.

SP stops being optional where ``no-sp`` is slower than ``free`` by more than the out-of-sample
error of the regimes the two plans lean on, or fits nowhere.
"""
from __future__ import annotations

from typing import Any

from autoplan.explain.rules import SP_ATTENTION_SHARE
from autoplan.search import Constraints
from autoplan.study.common import (
    Setting,
    Study,
    Sweep,
    grid_study,
    leans_text,
    margin,
    model_label,
    model_seq_grid,
    ok,
    rule_sentence,
    seq_label,
)
from autoplan.study.output import COLORS, band_line, error_band, png_bytes, pyplot, seq_axis

TITLE = "Q3 · When sequence parallelism (with selective recompute) stops being optional"
ARMS = {"free": Constraints(cp=(1,)), "no-sp": Constraints(cp=(1,), sp=(False,)),
        "sp-selective": Constraints(cp=(1,), sp=(True,), recompute=("none", "selective"))}
TINY_MODEL = "llama:layers=4,hidden=768,heads=12,kv_heads=4,ffn=2048,vocab=32000"
# GPT-3 175B's shape with learned positions as long as the sequence (the zoo's gpt3-175b has 2,048)
GPT3_LIKE = "gpt:layers=96,hidden=12288,heads=96,vocab=51200"
GRIDS: dict[str, dict[str, Any]] = {   # models: name -> cluster
    "full": {"models": {"llama3-8b": "h100x64", "llama3-70b": "h100x256", GPT3_LIKE: "h100x1024"},
             "seqs": (2048, 8192, 32768), "tokens": 4 * 2 ** 20},
    "quick": {"models": {"llama3-8b": "h100x64", "llama3-70b": "h100x256"}, "seqs": (4096, 32768),
              "tokens": 4 * 2 ** 20},
    "tiny": {"models": {TINY_MODEL: "h100x16"}, "seqs": (4096, 32768), "tokens": 2 ** 18},   # smoke test
}


def grid(size: str) -> tuple[dict, list[Setting]]:
    return model_seq_grid(GRIDS[size], ARMS)


def study(sweep: Sweep, errors: dict[str, dict], *, size: str) -> Study:
    return grid_study("q3", TITLE, sweep, errors, grid(size), finding=_finding, rules=_rules, answer=_answer,
                      table=_table, headline=_headline)


def _finding(axes: dict, arms: dict[str, dict], errors: dict[str, dict]) -> dict:
    free, nosp, sel = arms.get("free"), arms.get("no-sp"), arms.get("sp-selective")
    out: dict[str, Any] = {"axes": axes, "attention_share": free["attention_share"] if ok(free) else None,
                           "free_plan": free["compact"] if ok(free) else None,
                           "free_tp": free["tp"] if ok(free) else None, "free_sp": bool(ok(free) and free["sp"]),
                           "no_sp_fits": ok(nosp), "no_sp_plan": nosp["compact"] if ok(nosp) else None,
                           "no_sp_mbs": nosp["mbs"] if ok(nosp) else None,
                           "no_sp_recompute": nosp["recompute"] if ok(nosp) else None,
                           "selective_fits": ok(sel), "selective_plan": sel["compact"] if ok(sel) else None}
    if ok(free) and ok(nosp):
        out.update(margin(nosp, free, errors))
    if ok(free) and ok(sel):
        out["selective_vs_free"] = sel["step_time_s"] / free["step_time_s"] - 1
    # SP needed: without it no plan fits, or the best plan without it is slower than the error
    out["sp_needed"] = None if not ok(free) else (not ok(nosp) or not out["inside_error"])
    out["floor"] = bool(ok(nosp) and nosp["mbs"] == 1 and set(nosp["recompute"]) - {"none", "selective"})
    return out


def _rules(findings: list[dict]) -> list[dict]:
    """"SP at attention > 30 %" against the search's choice, scenario by scenario, with what
    going without SP costs (and whether that is inside the error).  Where the best plan has no
    TP there is no SP to turn on: the rule does not apply (``agrees`` None)."""
    out = []
    for f in findings:
        share = f["attention_share"]
        if share is None:
            continue
        says = share > SP_ATTENTION_SHARE
        finds = f"the search picks {f['free_plan']} (SP {'on' if f['free_sp'] else 'off'})"
        finds += ("; no plan without SP fits" if not f["no_sp_fits"] else
                  f"; the best plan without SP is {f['margin']:+.1%} "
                  f"({'inside' if f['inside_error'] else 'outside'} the {f['error']:.1%} out-of-sample error)")
        out.append({"rule": "sp-attention-share", "scenario": _where(f),
                    "says": f"attention {share:.0%} {'>' if says else '≤'} 30 %: SP {'on' if says else 'optional'}",
                    "finds": finds, "agrees": None if f["free_tp"] == 1 else says == f["free_sp"],
                    "matters": bool(f["sp_needed"])})
    return out


def _answer(findings: list[dict], leaning: list[dict], rules: list[dict], g: dict) -> str:
    tokens = g["tokens_per_step"]
    decided = [f for f in findings if f["sp_needed"] is not None]
    needed = [f for f in decided if f["sp_needed"]]
    nofit = [f for f in decided if not f["no_sp_fits"]]
    text = (f"Without context parallelism, over {len(decided)} scenarios (model × sequence, "
            f"{tokens / 2 ** 20:g}M tokens per step), ")
    if needed:
        slower = len(needed) - len(nofit)
        text += (f"SP is needed in {len(needed)} ({', '.join(_where(f) for f in needed)}): no plan without SP fits in "
                 f"{len(nofit)} of them" + (f", and in the other {slower} the best plan without SP is slower by more "
                                           "than the out-of-sample error" if slower else "") + ". ")
    else:
        text += "SP is never needed: some plan without SP always fits and is within the out-of-sample error. "
    optional = [f["margin"] for f in decided if not f["sp_needed"]]
    if optional:
        text += (f"Where it is optional, the cost model prices going without SP at {min(optional):+.1%} to "
                 f"{max(optional):+.1%} of the best plan's step time (a smaller micro-batch, more recomputation, "
                 "ZeRO-3 or more TP/PP make up for it) — smaller than the out-of-sample error of the regimes those "
                 "plans lean on, so the model cannot tell the two apart there. ")
    floors = [f for f in decided if f["floor"]]
    if floors:
        text += (f"The micro-batch floor binds in {len(floors)} ({', '.join(_where(f) for f in floors)}): without SP "
                 "the plan is at micro-batch 1 and needs more than selective recomputation. ")
    nosel = [f for f in decided if not f["selective_fits"]]
    if nosel:
        text += (f"SP with at most selective recompute fits nowhere in {', '.join(_where(f) for f in nosel)}: "
                 "there full (or op) recomputation is what makes the plan fit, SP or not. ")
    text += rule_sentence("attention > 30 % → SP", rules)
    return text + f"Leans on: {leans_text(leaning)}."


def _headline(findings: list[dict], rules: list[dict]) -> str:
    decided = [f for f in findings if f["sp_needed"] is not None]
    needed = [f for f in decided if f["sp_needed"]]
    optional = [f["margin"] for f in decided if not f["sp_needed"]]
    judged = [r for r in rules if r["agrees"] is not None]
    text = f"without CP, SP needed in {len(needed)} of {len(decided)} scenarios"
    text += f" ({', '.join(_where(f) for f in needed)})" if needed else ""
    if optional:
        text += f"; elsewhere going without it costs {min(optional):+.1%} to {max(optional):+.1%}, inside the error"
    return text + (f"; the 30 % rule matches the search's choice in {sum(r['agrees'] for r in judged)} of "
                   f"{len(judged)}")


def _where(f: dict) -> str:
    return f"{model_label(f['axes']['model'])} at {seq_label(f['axes']['seq'])}"


def _table(findings: list[dict]) -> str:
    lines = ["| model | seq | attention share | best plan (cp = 1) | best without SP | without SP (p10–p90) | "
             "SP + ≤ selective recompute | SP needed? |", "|" + "---|" * 8]
    for f in findings:
        m = (f"{f['margin']:+.1%} ({f['margin_p10']:+.1%}…{f['margin_p90']:+.1%}); error {f['error']:.1%}"
             if "margin" in f else "no plan fits" if f["free_plan"] else "—")
        sel = (f"{f['selective_plan']} ({f['selective_vs_free']:+.1%})" if f["selective_fits"] else "fits nowhere")
        share = f"{f['attention_share']:.0%}" if f["attention_share"] is not None else "—"
        lines.append(f"| {model_label(f['axes']['model'])} | {seq_label(f['axes']['seq'])} | {share} | "
                     f"{f['free_plan'] or 'no fit'} | {f['no_sp_plan'] or 'no fit'} | {m} | {sel} | "
                     f"{'—' if f['sp_needed'] is None else 'yes' if f['sp_needed'] else 'no'} |")
    return "\n".join(lines) + "\n"


def figure(results: dict) -> bytes:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6))
    findings = results["findings"]
    worst = max((x["out_of_sample_mean"] for x in results["leans_on"]), default=0.0)
    error_band(left, worst, f"±{worst:.1%}: largest out-of-sample error leaned on")
    markers = "osD^v"
    for i, model in enumerate(results["grid"]["models"]):
        fs = [f for f in findings if f["axes"]["model"] == model and "margin" in f]
        if fs:
            band_line(left, [f["axes"]["seq"] for f in fs], [f["margin"] * 100 for f in fs],
                      [f["margin_p10"] * 100 for f in fs], [f["margin_p90"] * 100 for f in fs],
                      label=model_label(model), color=f"C{i}", marker=markers[i % len(markers)])
        for f in findings:
            if f["axes"]["model"] == model and f["free_plan"] and not f["no_sp_fits"]:
                left.scatter([f["axes"]["seq"]], [0], marker="x", s=60, color=f"C{i}", zorder=5)
    seq_axis(left, results["grid"]["seqs"], "sequence length (tokens; ×: no plan without SP fits)")
    left.set_ylabel("best plan without SP vs best plan (% step time)")
    left.set_title("the cost of going without SP (cp = 1), p10–p90 shaded", fontsize=9)
    left.legend(fontsize=7)
    _share_panel(right, findings)
    fig.suptitle(results["title"], fontsize=10)
    fig.tight_layout()
    return png_bytes(fig)


def _share_panel(ax: Any, findings: list[dict]) -> None:
    """Attention's share against the cost of no SP: the 30 % rule is a vertical line.  Labels
    alternate above and below their points (in order of the share), each tied to its point by a
    thin line, so that neighbours do not overwrite each other."""
    shown = sorted((f for f in findings if f["attention_share"] is not None), key=lambda f: f["attention_share"])
    for i, f in enumerate(shown):
        y = f["margin"] * 100 if "margin" in f else None
        color = COLORS["no-sp"] if f["sp_needed"] else COLORS["sp"]
        ax.scatter([f["attention_share"] * 100], [y if y is not None else 0], color=color,
                   marker="o" if y is not None else "x", s=36)
        ax.annotate(_where(f), (f["attention_share"] * 100, y or 0), fontsize=6, xytext=(4, (8, -14, 22)[i % 3]),
                    textcoords="offset points", arrowprops={"arrowstyle": "-", "linewidth": 0.4, "color": "#888"})
    worst = max((f["error"] for f in findings if "error" in f), default=0.0)
    error_band(ax, worst, f"±{worst:.1%}: out-of-sample error")
    ax.axvline(SP_ATTENTION_SHARE * 100, color="#555", linestyle="--", linewidth=1, label="rule: SP above 30 %")
    ax.scatter([], [], color=COLORS["no-sp"], label="search: SP needed")
    ax.scatter([], [], color=COLORS["sp"], label="search: SP optional")
    ax.set_xlabel("attention share of block compute in the best plan (%)")
    ax.set_ylabel("best plan without SP vs best plan (% step time)")
    ax.set_title("the 30 % rule against the search (×: no plan without SP fits)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
