"""The three PNG plots of a benchmark run (matplotlib, Agg backend: no display needed).

* ``mfu.png``: MFU per case, one bar per contender (auto, grid, each recipe); a recipe that
  cannot apply or does not fit has no bar, one that breaks the NVLink rule is hatched.
* ``ratio.png``: auto/hand throughput ratio vs GPU count (against the best rule-respecting
  recipe and against the Megatron grid), with the survey's 90–95 % band.
* ``search_time.png``: search seconds vs GPU count.

``write_plots(records, out_dir) -> {title: file name}``.
"""
from __future__ import annotations

import os

from autoplan.bench.case import CONTENDERS

COLORS = {"auto": "#1f6feb", "grid": "#6e7781", "megatron": "#d29922", "megascale": "#bf8700",
          "llama3": "#2da44e", "fsdp": "#a475f9", "deepseek": "#cf222e", "published": "#0a3069"}
FILES = {"MFU per case": "mfu.png", "auto/hand throughput vs GPUs": "ratio.png",
         "search time vs GPUs": "search_time.png"}


def write_plots(records: list[dict], out_dir: str) -> dict[str, str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if r.get("contenders")]
    _mfu(plt, ok, os.path.join(out_dir, FILES["MFU per case"]))
    _ratio(plt, ok, os.path.join(out_dir, FILES["auto/hand throughput vs GPUs"]))
    _search_time(plt, ok, os.path.join(out_dir, FILES["search time vs GPUs"]))
    return dict(FILES)


def _save(plt, fig, path: str) -> None:
    # no timestamps in the PNG metadata: the same results give the same file
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)


def _mfu(plt, records: list[dict], path: str) -> None:
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(records) + 2), 4.2))
    width = 0.8 / len(CONTENDERS)
    for j, name in enumerate(CONTENDERS):
        for i, r in enumerate(records):
            row = next(c for c in r["contenders"] if c["contender"] == name)
            if row["status"] != "ok" or not row["fits"]:
                continue
            ax.bar(i + (j - (len(CONTENDERS) - 1) / 2) * width, row["mfu"] * 100, width, color=COLORS[name],
                   hatch="//" if not row["respects_nvlink"] else None, edgecolor="white", linewidth=0.3,
                   label=name if i == next(k for k, rr in enumerate(records) if _has(rr, name)) else None)
    ax.set_xticks(range(len(records)))
    ax.set_xticklabels([r["case"]["name"] for r in records], rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("predicted MFU (%)")
    ax.set_title("MFU per case (hatched: breaks the NVLink rule; no bar: n/a or does not fit)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=len(CONTENDERS), loc="upper center", bbox_to_anchor=(0.5, -0.42), frameon=False)
    _save(plt, fig, path)


def _has(record: dict, name: str) -> bool:
    row = next(c for c in record["contenders"] if c["contender"] == name)
    return row["status"] == "ok" and bool(row["fits"])


def _numbered(records: list[dict]) -> tuple[dict[str, int], dict[str, float]]:
    """(case → its number in the key, case → x position): cases on the same GPU count are spread
    a little sideways (on the log₂ axis) so that their points do not hide each other."""
    numbers = {r["case"]["name"]: i for i, r in enumerate(records, 1)}
    seen: dict[int, int] = {}
    xs = {}
    for r in records:
        k = seen.get(r["gpus"], 0)
        seen[r["gpus"]] = k + 1
        xs[r["case"]["name"]] = r["gpus"] * 2 ** (0.09 * k)
    return numbers, xs


def _key(ax, records: list[dict], numbers: dict[str, int]) -> None:
    """The numbered list of cases, right of the axes."""
    text = "\n".join(f"{numbers[r['case']['name']]:>2}  {r['case']['name']}" for r in records)
    ax.text(1.02, 1.0, text, transform=ax.transAxes, fontsize=7, va="top", family="monospace")


def _ratio(plt, records: list[dict], path: str) -> None:
    fig, ax = plt.subplots(figsize=(8.8, 4.4))
    numbers, xs = _numbered(records)
    series = (("auto_vs_hand", "o", "#1f6feb", "vs best recipe within the NVLink rule"),
              ("auto_vs_hand_any", "^", "#cf222e", "vs best recipe, rule or not (where different)"),
              ("auto_vs_grid", "s", "#6e7781", "vs Megatron grid"))
    values = [r[k] for r in records for k, *_ in series if r.get(k) is not None]
    # the y range covers the ordinary spread; a far outlier is drawn on the top edge with its value
    ordinary = sorted(v for v in values if v <= 3.0) or [1.0]
    top = max(1.1, ordinary[-1] * 1.08)
    bottom = min(0.85, min(values, default=1.0) * 0.95)
    ax.axhspan(0.90, 0.95, color="#ffd33d", alpha=0.35, label="90–95 % of hand")
    ax.axhline(1.0, color="black", linewidth=0.8)
    for key, marker, color, label in series:
        pts = [(xs[r["case"]["name"]], r[key], r["case"]["name"]) for r in records if r.get(key) is not None
               and not (key == "auto_vs_hand_any" and r.get("best_hand_any") == r.get("best_hand"))]
        if not pts:
            continue
        ax.scatter([x for x, _, _ in pts], [min(y, top) for _, y, _ in pts], marker=marker, color=color,
                   facecolors="none" if marker == "s" else color, label=label, zorder=3)
        for x, y, name in pts:
            if key == "auto_vs_hand":
                ax.annotate(str(numbers[name]), (x, min(y, top)), fontsize=7, xytext=(4, 3),
                            textcoords="offset points")
            if y > top:
                ax.annotate(f"{y:.1f}× ↑", (x, top), fontsize=7, xytext=(4, -10), textcoords="offset points")
    ax.set_ylim(bottom, top * 1.02)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("auto tokens/s ÷ hand tokens/s")
    ax.set_title("Automatic plan vs hand-written 4D (same cost model; above 1: auto faster)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    _key(ax, records, numbers)
    _save(plt, fig, path)


def _search_time(plt, records: list[dict], path: str) -> None:
    fig, ax = plt.subplots(figsize=(8.8, 4.4))
    numbers, xs = _numbered(records)
    pts = [(xs[r["case"]["name"]], r["search_s"], r["case"]["name"], r["status"] == "ok") for r in records
           if r.get("search_s") is not None]
    for done, color, label in ((True, "#1f6feb", "search finished"), (False, "#cf222e", "search failed")):
        sel = [p for p in pts if p[3] == done]
        if sel:
            ax.scatter([p[0] for p in sel], [p[1] for p in sel], color=color, label=label, zorder=3)
    for x, y, name, _ in pts:
        ax.annotate(str(numbers[name]), (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    cpus = sorted({r.get("search_stats", {}).get("cpus") for r in records if r.get("search_stats")} - {None})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("search seconds")
    ax.set_title(f"Search time vs GPU count ({'/'.join(map(str, cpus)) or '?'} CPU cores)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    _key(ax, records, numbers)
    _save(plt, fig, path)
