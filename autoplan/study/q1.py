"""Q1: at 100B+ parameters and more than 1,000 GPUs, does an automatic plan reach 90–95 % of a
hand-written 4D plan's throughput — with a hand baseline a careful engineer would run?

The cases are the benchmark's (``autoplan.bench``, ``run_case``): the search's best plan
(``auto``) against the hand-written recipes, each tuned within its family (micro-batch, virtual
stages, recompute: ``baselines.tuning``), and the layout a published run used, which counts
as a hand baseline whatever the memory model says (a run that happened; where the model prices
it above HBM the row is flagged ``memory_model_miss``).  Llama 3 405B's rows therefore use the
published layout.  Each case is two points: ``auto`` and ``hand`` (the best credible hand plan
that keeps per-layer collectives in NVLink), each with its step-time band over the paired
samples; the margin auto/hand is set beside the out-of-sample error of the regimes the two
plans lean on.  The explainer's zero-bubble rule is checked on every auto plan with a pipeline
(the same plan re-priced with a zero-bubble schedule), and its MFU band on both plans.
"""
from __future__ import annotations

from statistics import median
from typing import Any

from autoplan.bench import SUITES, run_case
from autoplan.bench.report import compact_plan
from autoplan.explain.rules import MFU_BAND, ZERO_BUBBLE
from autoplan.plan import Plan
from autoplan.study.common import Study, Sweep, error_of, leans_on, leans_text, regimes

TITLE = "Q1 · Auto vs hand-written 4D at 100B+ parameters and > 1K GPUs (published layouts as hand baselines)"
BIG = ("gpt3-175b-h100x1024", "llama3-405b-h100x8192", "llama3-405b-h100x16384", "llama3-405b-gb200x2304",
       "gpt-1t-a100x3072")
CASE_AXIS = "benchmark case (model-GPU×count)"
GRIDS: dict[str, dict[str, Any]] = {
    "full": {"suite": "default", "cases": BIG},
    "quick": {"suite": "default", "cases": ("gpt3-175b-h100x1024", "llama3-405b-h100x8192")},
    "tiny": {"suite": "quick", "cases": ("gpt-1.7b-h100x64",)},        # smoke test: 1.7B on 64 GPUs
}


def study(sweep: Sweep, errors: dict[str, dict], *, size: str) -> Study:
    g = GRIDS[size]
    cases = [c for c in SUITES[g["suite"]] if c.name in g["cases"]]
    records = []
    for case in cases:
        sweep.say(f"  {case.name}: {case.model} on {case.cluster} …")
        sweep.searches += 1
        record = run_case(case, workers=sweep.workers)
        records.append(record)
        sweep.say(f"  {case.name}: auto/hand {record.get('auto_vs_hand') or float('nan'):.2f} "
                  f"({record.get('best_hand')})")
    points = [p for r in records for p in _points(r)]
    findings = [_finding(r, errors) for r in records]
    leaning = leans_on(points, errors)
    rules = _rules(findings)
    grid = {"suite": g["suite"], "cases": [c.to_dict() for c in cases],
            "hand": "the fastest credible recipe tuned within its family, or the published layout (as published, "
                    "counted whatever the memory model says), that keeps per-layer collectives in NVLink"}
    return Study("q1", TITLE, _answer(findings, leaning, rules), grid, points, leaning, rules, findings,
                 _table(findings), _headline(findings))


def _rows(record: dict) -> dict[str, dict]:
    return {row["contender"]: row for row in record.get("contenders") or []}


def _points(record: dict) -> list[dict]:
    """The case's auto and best hand plans as study points (with their step-time bands)."""
    rows, out = _rows(record), []
    moe = _moe(record)
    for arm, name in (("auto", "auto"), ("hand", record.get("band_hand"))):
        row = rows.get(name or "")
        if row is None or row["status"] != "ok":
            continue
        lo, hi = record.get(f"{arm}_step_s_p10"), record.get(f"{arm}_step_s_p90")
        plan = Plan.parse(row["plan"])
        band = None if lo is None else {"step_time_s_p10": lo, "step_time_s_p90": hi,
                                        "mfu_p10": row["mfu"] * row["step_time_s"] / hi,
                                        "mfu_p90": row["mfu"] * row["step_time_s"] / lo}
        out.append({"axes": {"case": record["case"]["name"]}, "arm": arm, "contender": name,
                    "model": record["case"]["model"], "model_name": record.get("model_name"),
                    "cluster": record.get("cluster_name"), "gpus": record.get("gpus"), "gpu": record.get("gpu"),
                    "seq": record["case"]["seq"], "global_batch": record["case"]["global_batch"],
                    "constraint": "none" if arm == "auto" else f"{name} (hand)", "status": "ok", "error": None,
                    "plan": row["plan"], "compact": compact_plan(row["plan"]), "step_time_s": row["step_time_s"],
                    "mfu": row["mfu"], "memory_gib": row["memory_gib"], "hbm_gib": row["hbm_gib"],
                    "tokens_per_s": row["tokens_per_s"], "fits": row["fits"],
                    "memory_model_miss": bool(row.get("memory_model_miss")), "band": band,
                    "bubble_fraction": row.get("bubble_fraction"), "regimes": list(regimes(plan, moe=moe))})
    return out


def _moe(record: dict) -> bool:
    """Whether the case's model has experts (the record names the model, not its structure)."""
    model = record["case"]["model"]
    return record["case"]["group"] == "moe" or model.startswith("moe:") or model.startswith(("mixtral", "deepseek"))


def _finding(record: dict, errors: dict[str, dict]) -> dict:
    rows, name = _rows(record), record["case"]["name"]
    hand = record.get("band_hand")
    out: dict[str, Any] = {"case": name, "params": record.get("params"), "gpus": record.get("gpus"),
                           "status": record["status"], "error": record.get("error"), "hand": hand,
                           "auto_vs_hand": record.get("auto_vs_hand") if hand == record.get("best_hand")
                           else record.get("auto_vs_hand_any"),
                           **{k: record.get(k) for k in ("auto_vs_grid", "auto_vs_hand_fits", "best_hand_fits")},
                           **{k: record.get(k) for k in ("auto_vs_hand_p10", "auto_vs_hand_p50", "auto_vs_hand_p90",
                                                         "p_auto_beats_hand")}}
    auto, best = rows.get("auto"), rows.get(hand or "")
    if auto and auto.get("plan"):
        out.update(auto_plan=compact_plan(auto["plan"]), auto_mfu=auto["mfu"], auto_bubble=auto.get("bubble_fraction"),
                   auto_schedule=Plan.parse(auto["plan"]).schedule, auto_pp=Plan.parse(auto["plan"]).pp)
    if best and best.get("plan"):
        out.update(hand_plan=compact_plan(best["plan"]), hand_mfu=best["mfu"],
                   memory_model_miss=bool(best.get("memory_model_miss")), hand_memory_gib=best["memory_gib"],
                   hand_hbm_gib=best["hbm_gib"])
    if out["auto_vs_hand"] is not None and auto and best:
        moe = _moe(record)
        names = sorted(set(regimes(Plan.parse(auto["plan"]), moe=moe)) | set(regimes(Plan.parse(best["plan"]),
                                                                                    moe=moe)))
        error, regime = error_of(names, errors)
        margin = out["auto_vs_hand"] - 1
        out.update(margin=margin, error=error, error_regime=regime, inside_error=abs(margin) < error)
    return out


def _rules(findings: list[dict]) -> list[dict]:
    """Zero-bubble by default (on each auto plan with a pipeline) and the MFU band (on auto and hand)."""
    out = []
    low, high = MFU_BAND["dense"]
    for f in findings:
        if f.get("auto_pp", 1) > 1:
            zb = f["auto_schedule"] in ZERO_BUBBLE
            out.append({"rule": "zero-bubble", "scenario": f["case"], "says": "pp > 1: a zero-bubble schedule",
                        "finds": f"the search picks {f['auto_schedule']} ({f['auto_plan']}), bubble "
                                 f"{f['auto_bubble']:.1%} of the pipeline", "agrees": zb, "matters": None})
        for who in ("auto", "hand"):
            mfu = f.get(f"{who}_mfu")
            if mfu is None:
                continue
            inside = low <= mfu <= high
            out.append({"rule": "mfu-band", "scenario": f"{f['case']} ({who})",
                        "says": f"healthy dense MFU {low:.0%}–{high:.0%}",
                        "finds": f"{who} plan {f[f'{who}_plan']} at MFU {mfu:.1%}"
                                 + ("" if inside else " (outside the band)"), "agrees": inside, "matters": None})
    return out


def _answer(findings: list[dict], leaning: list[dict], rules: list[dict]) -> str:
    done = [f for f in findings if f.get("margin") is not None]
    if not done:
        return ("No case produced both an automatic and a hand plan: " + ", ".join(
            f"{f['case']} ({f['error']})" for f in findings) + f". Leans on: {leans_text(leaning)}.")
    ratios = [f["auto_vs_hand"] for f in done]
    text = (f"Over {len(done)} cases ({', '.join(f['case'] for f in done)}), the automatic plan's predicted "
            f"throughput is {min(ratios):.2f}–{max(ratios):.2f}× (median {median(ratios):.2f}×) that of the best "
            f"hand plan, reaching 95 % of it in {sum(r >= 0.95 for r in ratios)} and 90 % in "
            f"{sum(r >= 0.90 for r in ratios)} of {len(done)}. ")
    pub = [f for f in done if f["hand"] == "published"]
    if pub:
        text += "The hand baseline is the published layout in " + ", ".join(_published(f) for f in pub) + ". "
    inside = [f for f in done if f["inside_error"]]
    text += (f"The median margin, {median(f['margin'] for f in done):+.1%}, set beside the out-of-sample error of "
             "the regimes the two plans of each case lean on, is ")
    text += ("inside it in " + ", ".join(f"{f['case']} ({f['margin']:+.1%} < {f['error_regime']} {f['error']:.1%})"
                                         for f in inside) if inside else "outside it in every case")
    outside = [f for f in done if not f["inside_error"]]
    if inside and outside:
        text += "; outside it in " + ", ".join(f"{f['case']} ({f['margin']:+.1%})" for f in outside)
    text += ". "
    zb = [r for r in rules if r["rule"] == "zero-bubble"]
    if zb:
        text += (f"Zero-bubble by default: the search picks a zero-bubble schedule for {sum(r['agrees'] for r in zb)} "
                 f"of {len(zb)} pipelined plans" + ("; elsewhere " + "; ".join(f"{r['scenario']}: {r['finds']}"
                                                                               for r in zb if not r["agrees"])
                                                     if not all(r["agrees"] for r in zb) else "") + ". ")
    return (text + "Every number is a prediction of one cost model for both sides, not a measured run. "
            f"Leans on: {leans_text(leaning)}.")


def _headline(findings: list[dict]) -> str:
    done = [f for f in findings if f.get("margin") is not None]
    if not done:
        return "no case produced both an automatic and a hand plan"
    ratios = [f["auto_vs_hand"] for f in done]
    misses = [f for f in done if f.get("memory_model_miss")]
    inside = sum(f["inside_error"] for f in done)
    return (f"auto/hand {min(ratios):.2f}–{max(ratios):.2f}× (median {median(ratios):.2f}×) over {len(done)} cases, "
            f"tuned recipes and published layouts as the hand baseline ({len(misses)} of them above HBM in the memory "
            f"model, counted as run); {inside} of {len(done)} margins inside the out-of-sample error of the regimes "
            "they lean on")


def _published(f: dict) -> str:
    if not f.get("memory_model_miss"):
        return f["case"]
    return (f"{f['case']} (the memory model prices it at {f['hand_memory_gib']:.0f} of {f['hand_hbm_gib']:.0f} GiB — "
            f"a memory-model miss: it ran; against the best recipe that fits, {f['best_hand_fits']}, auto/hand "
            f"would be {f['auto_vs_hand_fits']:.2f}×)")


def _table(findings: list[dict]) -> str:
    lines = ["| case | auto plan (MFU) | best hand (MFU) | auto/hand (p10–p90) | vs best recipe that fits | "
             "auto/grid | margin vs OOS error |", "|" + "---|" * 7]
    for f in findings:
        if f.get("margin") is None:
            lines.append(f"| {f['case']} | failed: {f.get('error')} |" + " |" * 5)
            continue
        hand = f"{f['hand']}: {f['hand_plan']} ({f['hand_mfu']:.1%})" + (" ✗ ran" if f.get("memory_model_miss")
                                                                         else "")
        band = (f"{f['auto_vs_hand']:.2f}× ({f['auto_vs_hand_p10']:.2f}–{f['auto_vs_hand_p90']:.2f}×)"
                if f.get("auto_vs_hand_p10") is not None else f"{f['auto_vs_hand']:.2f}×")
        fits = f"{f['auto_vs_hand_fits']:.2f}× ({f['best_hand_fits']})" if f.get("auto_vs_hand_fits") else "—"
        grid = f"{f['auto_vs_grid']:.2f}×" if f.get("auto_vs_grid") else "—"
        lines.append(f"| {f['case']} | {f['auto_plan']} ({f['auto_mfu']:.1%}) | {hand} | {band} | {fits} | {grid} | "
                     f"{f['margin']:+.1%} vs {f['error_regime']} {f['error']:.1%}: "
                     f"{'inside' if f['inside_error'] else 'outside'} |")
    return "\n".join(lines) + "\n\n✗ ran: a published layout the memory model prices above HBM (it ran).\n"


def figure(results: dict) -> bytes:
    from autoplan.study.output import COLORS, error_band, png_bytes, pyplot

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6))
    fs = [f for f in results["findings"] if f.get("margin") is not None]
    xs = list(range(len(fs)))
    worst = max((x["out_of_sample_mean"] for x in results["leans_on"]), default=0.0)
    error_band(left, worst, f"±{worst:.1%}: largest out-of-sample error leaned on")
    left.bar(xs, [f["margin"] * 100 for f in fs], color=COLORS["auto"],
             yerr=[[max(0.0, (f["auto_vs_hand"] - f["auto_vs_hand_p10"]) * 100) for f in fs],
                   [max(0.0, (f["auto_vs_hand_p90"] - f["auto_vs_hand"]) * 100) for f in fs]], capsize=3)
    left.hlines([f["error"] * 100 for f in fs], [x - 0.4 for x in xs], [x + 0.4 for x in xs], colors="#444",
                linestyles="--", linewidth=1, label="each case's error: its regimes' largest out-of-sample error")
    for x, f in zip(xs, fs):           # above the p90 whisker
        top = f["margin"] + max(0.0, f["auto_vs_hand_p90"] - f["auto_vs_hand"])
        left.annotate(f"vs {f['hand']}" + (" ✗ran" if f.get("memory_model_miss") else ""), (x, top * 100),
                      ha="center", fontsize=7, xytext=(0, 5), textcoords="offset points")
    left.set_xticks(xs)
    left.set_xticklabels([f["case"] for f in fs], rotation=25, ha="right", fontsize=7)
    left.set_xlabel(CASE_AXIS)
    left.set_ylabel("auto vs best hand throughput (%)")
    left.set_title("the margin (whiskers: p10–p90), and the error it must clear", fontsize=9)
    left.margins(y=0.12)
    left.grid(axis="y", alpha=0.3)
    left.legend(fontsize=7, loc="lower left")
    _mfu_bars(right, fs, xs, COLORS)
    fig.suptitle(results["title"], fontsize=10)
    fig.tight_layout()
    return png_bytes(fig)


def _mfu_bars(ax: Any, fs: list[dict], xs: list[int], colors: dict[str, str]) -> None:
    low, high = MFU_BAND["dense"]
    ax.axhspan(low * 100, high * 100, color="#2da44e", alpha=0.08, linewidth=0, label="explain's dense MFU band")
    ax.bar([x - 0.2 for x in xs], [f["auto_mfu"] * 100 for f in fs], 0.38, color=colors["auto"], label="auto")
    ax.bar([x + 0.2 for x in xs], [f["hand_mfu"] * 100 for f in fs], 0.38, color=colors["hand"],
           label="best hand (hatched: published, memory-model miss)")
    for x, f in zip(xs, fs):
        if f.get("memory_model_miss"):
            ax.bar([x + 0.2], [f["hand_mfu"] * 100], 0.38, color=colors["published"], hatch="//")
    ax.set_xticks(xs)
    ax.set_xticklabels([f["case"] for f in fs], rotation=25, ha="right", fontsize=7)
    ax.set_xlabel(CASE_AXIS)
    ax.set_ylabel("predicted MFU (%)")
    ax.set_title("MFU of each side", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
