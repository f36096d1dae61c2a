"""Q5: can recomputation replace SP/CP at long context, and from which length does context
parallelism become necessary (the memory wall) or faster?

Each scenario (a model, its cluster, a sequence length; 4M tokens per step, at least one
sequence per data-parallel rank) is searched three times:

* ``recompute``: no CP and no SP (cp = 1, SP off) — only recomputation, a smaller micro-batch,
  ZeRO-3, TP or PP to make long sequences fit;
* ``recompute+sp``: no CP, SP allowed;
* ``free``: CP allowed too (ring, Ulysses or USP, any degree the rules allow).

CP is *necessary* where neither arm without it fits, and *faster* where the free plan uses it
and the best plan without it is slower by more than the out-of-sample error of the regimes the
two plans lean on.
"""
from __future__ import annotations

from typing import Any

from autoplan.explain.rules import CP_ATTENTION_SHARE, CP_SEQ
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
    ranked,
    rule_sentence,
    seq_label,
)
from autoplan.study.output import COLORS, band_line, error_band, png_bytes, pyplot, seq_axis

TITLE = "Q5 · Can recomputation replace SP/CP at long context; when CP becomes necessary or faster"
ARMS = {"recompute": Constraints(cp=(1,), sp=(False,)), "recompute+sp": Constraints(cp=(1,)), "free": Constraints()}
TINY_MODEL = "llama:layers=4,hidden=768,heads=12,kv_heads=4,ffn=2048,vocab=32000"
GRIDS: dict[str, dict[str, Any]] = {   # models: name -> cluster
    "full": {"models": {"llama3-8b": "h100x64", "llama3-70b": "h100x256"},
             "seqs": (8192, 32768, 131072, 262144), "tokens": 4 * 2 ** 20},
    "quick": {"models": {"llama3-8b": "h100x64"}, "seqs": (16384, 65536, 131072), "tokens": 4 * 2 ** 20},
    "tiny": {"models": {TINY_MODEL: "h100x16"}, "seqs": (16384, 65536), "tokens": 2 ** 18},   # smoke test
}


def grid(size: str) -> tuple[dict, list[Setting]]:
    return model_seq_grid(GRIDS[size], ARMS)


def study(sweep: Sweep, errors: dict[str, dict], *, size: str) -> Study:
    return grid_study("q5", TITLE, sweep, errors, grid(size), finding=_finding, rules=_rules, answer=_answer,
                      table=_table, headline=lambda findings, _rules: _headline(findings))


def _finding(axes: dict, arms: dict[str, dict], errors: dict[str, dict]) -> dict:
    free = arms.get("free")
    without = ranked({a: p for a, p in arms.items() if a != "free"})
    out: dict[str, Any] = {"axes": axes, "free_plan": free["compact"] if ok(free) else None,
                           "free_cp": free["cp"] if ok(free) else None,
                           "attention_share": free["attention_share"] if ok(free) else None,
                           "fits": {a: ok(p) for a, p in arms.items()},
                           "plans": {a: p["compact"] for a, p in arms.items() if ok(p)},
                           "recompute": {a: p["recompute"] for a, p in arms.items() if ok(p)},
                           "best_without_cp": without[0][0] if without else None}
    if ok(free) and without:
        out.update(margin(without[0][1], free, errors))
    out["cp_necessary"] = ok(free) and not without
    out["cp_faster"] = bool(ok(free) and without and free["cp"] > 1 and not out["inside_error"])
    if ok(free) and ok(arms.get("recompute")):
        out["recompute_alone"] = margin(arms["recompute"], free, errors)
    return out


def _rules(findings: list[dict]) -> list[dict]:
    """"CP at attention > 50 % or seq ≥ 32K" against the search's choice, scenario by scenario,
    with what going the other way costs (and whether that is inside the error)."""
    out = []
    for f in findings:
        if f["free_plan"] is None:
            continue
        share, seq = f["attention_share"], f["axes"]["seq"]
        says = share > CP_ATTENTION_SHARE or seq >= CP_SEQ
        picks = f["free_cp"] > 1
        finds = f"the search picks {f['free_plan']} (cp = {f['free_cp']})"
        if f["cp_necessary"]:
            finds += "; no plan without CP fits"
        elif "margin" in f:
            finds += (f"; the best plan without CP is {f['margin']:+.1%} "
                      f"({'inside' if f['inside_error'] else 'outside'} the {f['error']:.1%} out-of-sample error)")
        out.append({"rule": "cp-long-context", "scenario": f"{model_label(f['axes']['model'])} at {seq_label(seq)}",
                    "says": f"attention {share:.0%}, seq {seq_label(seq)}: CP {'expected' if says else 'not needed'}",
                    "finds": finds, "agrees": says == picks,
                    "matters": bool(f["cp_necessary"] or ("margin" in f and not f["inside_error"]))})
    return out


def _answer(findings: list[dict], leaning: list[dict], rules: list[dict], g: dict) -> str:
    tokens = g["tokens_per_step"]
    models = dict.fromkeys(f["axes"]["model"] for f in findings)
    text = "Over " + ", ".join(f"{model_label(m)} on {sum(f['axes']['model'] == m for f in findings)} sequence lengths"
                               for m in models)
    text += f" ({tokens / 2 ** 20:g}M tokens per step): "
    parts = [_model_sentence(model, sorted((f for f in findings if f["axes"]["model"] == model),
                                           key=lambda f: f["axes"]["seq"]))
             for model in dict.fromkeys(f["axes"]["model"] for f in findings)]
    text += "; ".join(parts) + ". "
    inside = [f for f in findings if "margin" in f and f["inside_error"] and f["free_cp"] and f["free_cp"] > 1]
    if inside:
        text += ("Recomputation replaces CP within the error at " + ", ".join(
            f"{_where(f)} (with {'SP' if f['best_without_cp'] == 'recompute+sp' else 'no SP'})" for f in inside)
            + ": the free plan uses CP, but the best plan without it is within the out-of-sample error. ")
    text += rule_sentence("CP at attention > 50 % or ≥ 32K", rules)
    return text + f"Leans on: {leans_text(leaning)}."


def _model_sentence(model: str, fs: list[dict]) -> str:
    """One model's answer: its memory wall, where the search first picks CP, where CP is faster."""
    wall = next((f for f in fs if f["cp_necessary"]), None)
    faster = next((f for f in fs if f["cp_faster"]), None)
    chosen = next((f for f in fs if f["free_cp"] and f["free_cp"] > 1), None)
    ok_without = [f for f in fs if not f["cp_necessary"] and "margin" in f]
    s = f"{model_label(model)}: "
    s += (f"recomputation (with or without SP) stops fitting at {seq_label(wall['axes']['seq'])} — the memory "
          "wall, CP necessary from there" if wall else
          f"a plan without CP fits at every length up to {seq_label(fs[-1]['axes']['seq'])}")
    s += (f"; the search first picks CP at {seq_label(chosen['axes']['seq'])} ({chosen['free_plan']})"
          if chosen else "; the search never picks CP")
    s += (f"; CP is faster beyond the error from {seq_label(faster['axes']['seq'])} ({faster['margin']:+.1%} "
          f"without it, error {faster['error']:.1%})" if faster else
          "; nowhere is CP faster by more than the out-of-sample error" if ok_without else "")
    if ok_without:
        s += (f"; where a plan without CP fits, going without costs {min(f['margin'] for f in ok_without):+.1%} "
              f"to {max(f['margin'] for f in ok_without):+.1%}")
    alone = [f for f in fs if "recompute_alone" in f]
    beyond = [f for f in alone if not f["recompute_alone"]["inside_error"]]
    if alone:
        worst = max(alone, key=lambda f: f["recompute_alone"]["margin"])
        s += (f"; recomputation alone (no SP either) costs up to {worst['recompute_alone']['margin']:+.1%} "
              f"(at {seq_label(worst['axes']['seq'])}, {worst['plans']['recompute']})"
              + (f", beyond the error from {seq_label(beyond[0]['axes']['seq'])}" if beyond else ", inside the error"))
    return s


def _headline(findings: list[dict]) -> str:
    parts = []
    for model in dict.fromkeys(f["axes"]["model"] for f in findings):
        fs = sorted((f for f in findings if f["axes"]["model"] == model), key=lambda f: f["axes"]["seq"])
        wall = next((f for f in fs if f["cp_necessary"]), None)
        faster = next((f for f in fs if f["cp_faster"]), None)
        alone = [f["recompute_alone"]["margin"] for f in fs if "recompute_alone" in f]
        parts.append(f"{model_label(model)}: " + (f"memory wall at {seq_label(wall['axes']['seq'])}" if wall else
                                                  f"no memory wall up to {seq_label(fs[-1]['axes']['seq'])}")
                     + (f", CP faster beyond the error from {seq_label(faster['axes']['seq'])}" if faster else
                        ", CP never faster beyond the error")
                     + (f", recompute alone up to {max(alone):+.1%}" if alone else ""))
    return "; ".join(parts)


def _where(f: dict) -> str:
    return f"{model_label(f['axes']['model'])} at {seq_label(f['axes']['seq'])}"


def _table(findings: list[dict]) -> str:
    lines = ["| model | seq | attention share | best plan (free) | recompute only (cp = 1, SP off) | "
             "recompute + SP (cp = 1) | recompute only vs free | best without CP vs free (p10–p90) | "
             "CP necessary / faster? |", "|" + "---|" * 9]
    for f in findings:
        m = (f"{f['margin']:+.1%} ({f['margin_p10']:+.1%}…{f['margin_p90']:+.1%}); error {f['error']:.1%}"
             if "margin" in f else "—")
        verdict = "necessary" if f["cp_necessary"] else "faster" if f["cp_faster"] else "no"
        share = f"{f['attention_share']:.0%}" if f["attention_share"] is not None else "—"
        alone = f"{f['recompute_alone']['margin']:+.1%}" if "recompute_alone" in f else "—"
        lines.append(f"| {model_label(f['axes']['model'])} | {seq_label(f['axes']['seq'])} | {share} | "
                     f"{f['free_plan'] or 'no fit'} | {f['plans'].get('recompute', 'no fit')} | "
                     f"{f['plans'].get('recompute+sp', 'no fit')} | {alone} | {m} | {verdict} |")
    return "\n".join(lines) + "\n"


def figure(results: dict) -> bytes:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    findings = results["findings"]
    points = [p for p in results["points"] if p["status"] == "ok"]
    worst = max((x["out_of_sample_mean"] for x in results["leans_on"]), default=0.0)
    error_band(axes[0], worst, f"±{worst:.1%}: largest out-of-sample error leaned on")
    for i, model in enumerate(results["grid"]["models"]):
        fs = [f for f in findings if f["axes"]["model"] == model and "margin" in f]
        if fs:
            band_line(axes[0], [f["axes"]["seq"] for f in fs], [f["margin"] * 100 for f in fs],
                      [f["margin_p10"] * 100 for f in fs], [f["margin_p90"] * 100 for f in fs],
                      label=f"{model_label(model)}: best without CP vs best", color=f"C{i}")
        for f in findings:
            if f["axes"]["model"] == model and f["cp_necessary"]:
                axes[0].scatter([f["axes"]["seq"]], [0], marker="x", s=70, color=f"C{i}", zorder=5)
    seq_axis(axes[0], results["grid"]["seqs"], "sequence length (tokens; ×: no plan without CP fits)")
    axes[0].set_ylabel("step time without CP vs with it allowed (%)")
    axes[0].set_title("when CP pays (p10–p90 shaded)", fontsize=9)
    axes[0].legend(fontsize=7)
    _mfu(axes[1], points, results)
    fig.suptitle(results["title"], fontsize=10)
    fig.tight_layout()
    return png_bytes(fig)


def _mfu(ax: Any, points: list[dict], results: dict) -> None:
    """MFU of each arm's best plan against the sequence (p10–p90 shaded), each point labelled
    with its recompute policy: what recomputation instead of CP costs, until it stops fitting."""
    styles = {"recompute": ("s", ":", COLORS["recompute"]), "recompute+sp": ("^", "--", COLORS["recompute+sp"]),
              "free": ("o", "-", COLORS["free"])}
    several = len(results["grid"]["models"]) > 1     # colour by model, line style by arm, only free's band
    for i, model in enumerate(results["grid"]["models"]):
        for arm, (marker, style, color) in styles.items():
            ps = sorted((p for p in points if p["axes"]["model"] == model and p["arm"] == arm), key=lambda p: p["seq"])
            if not ps:
                continue
            band_line(ax, [p["seq"] for p in ps], [p["mfu"] * 100 for p in ps],
                      [p["band"]["mfu_p10"] * 100 for p in ps], [p["band"]["mfu_p90"] * 100 for p in ps],
                      label=f"{model_label(model)} {arm}", color=f"C{i}" if several else color, marker=marker,
                      linestyle=style if several else "-", alpha=0.18 if arm == "free" or not several else 0.0)
            for p in ps:
                if p["recompute"] != ["none"]:
                    ax.annotate("rc=" + "/".join(p["recompute"]), (p["seq"], p["mfu"] * 100), fontsize=6,
                                xytext=(3, -9), textcoords="offset points")
    seq_axis(ax, results["grid"]["seqs"], "sequence length (tokens)")
    ax.set_ylabel("MFU of the best plan (%)")
    ax.set_title("each arm's best plan (rc: the recompute it needs; missing: fits nowhere"
                 + ("; p10–p90 shaded for free)" if several else "; p10–p90 shaded)"), fontsize=9)
    ax.legend(fontsize=6, ncol=2)
