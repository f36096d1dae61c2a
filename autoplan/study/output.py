"""A study's files: ``results.json``, ``table.md``, the figure (PNG), ``answer.md`` and a
self-contained ``report.html`` (the figure inlined, the answer, the table, the regimes it leans
on and the rules it checks), all written whole or not at all (``autoplan.atomic``).

Figures use matplotlib's Agg backend (no display); ``axes(...)`` gives a study its panels and
``band_line`` draws one series with its p10–p90 band shaded.
"""
from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import Callable
from html import escape
from typing import Any

from autoplan.atomic import write_text
from autoplan.errors import UserError

COLORS = {"ring": "#1f6feb", "ulysses": "#d29922", "usp": "#2da44e", "free": "#1f6feb", "no-sp": "#cf222e",
          "sp": "#2da44e", "fsdp": "#a475f9", "recompute": "#cf222e", "recompute+sp": "#d29922", "auto": "#1f6feb",
          "hand": "#6e7781", "published": "#0a3069"}


def check_out(path: str) -> str:
    """``path`` as an output folder: created if missing; a UserError (exit 2) where it is a file or
    cannot be created or written."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"--out {path} is a file, not a folder", "give --out a folder path (it is created if missing)")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create --out {path}: {e.strerror or e}",
                        "give --out a folder in a writable place") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"cannot write into --out {path}: permission denied", "give --out a folder you can write")
    return path


def pyplot() -> Any:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def png_bytes(fig: Any) -> bytes:
    """The figure as PNG bytes, with no timestamp in its metadata (the same results, the same file)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    pyplot().close(fig)
    return buf.getvalue()


def band_line(ax: Any, xs: list[float], ys: list[float], lo: list[float], hi: list[float], *, label: str,
              color: str, marker: str = "o") -> None:
    """One series and its p10–p90 band (shaded)."""
    ax.plot(xs, ys, marker=marker, color=color, label=label, linewidth=1.6, markersize=4)
    ax.fill_between(xs, lo, hi, color=color, alpha=0.18, linewidth=0)


def seq_axis(ax: Any, seqs: list[int], label: str) -> None:
    """A log-2 x axis of sequence lengths, ticked at ``seqs`` as 16K, 32K, …"""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(seqs))
    ax.set_xticklabels([f"{s // 1024}K" if s % 1024 == 0 else str(s) for s in seqs])
    ax.minorticks_off()
    ax.set_xlabel(label)
    ax.grid(alpha=0.3)


def error_band(ax: Any, error: float, label: str) -> None:
    """The ± out-of-sample error of a regime around 0 % (what a margin must clear), in grey."""
    ax.axhspan(-error * 100, error * 100, color="#888888", alpha=0.12, linewidth=0, label=label)
    ax.axhline(0, color="#555555", linewidth=0.8)


def write_study(out: str, name: str, results: dict, table: str, figure: bytes, *,
                say: Callable[[str], None]) -> dict[str, str]:
    """Every file of one study under ``out``; returns {kind: path}."""
    paths = {"results": os.path.join(out, "results.json"), "table": os.path.join(out, "table.md"),
             "figure": os.path.join(out, f"{name}.png"), "answer": os.path.join(out, "answer.md"),
             "report": os.path.join(out, "report.html")}
    _write_bytes(paths["figure"], figure)
    write_text(paths["table"], table, flag="--out")
    write_text(paths["answer"], f"## {results['title']}\n\n{results['answer']}\n\n`{results['command']}`\n",
               flag="--out")
    write_text(paths["results"], json.dumps(results, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
               flag="--out")
    write_text(paths["report"], html(results, table, figure, f"{name}.png"), flag="--out")
    say(f"wrote {', '.join(sorted(os.path.basename(p) for p in paths.values()))} to {out}")
    return paths


def _write_bytes(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}", "give --out a writable folder") from None


def html(results: dict, table: str, figure: bytes, alt: str) -> str:
    """The study as one self-contained HTML page."""
    from autoplan.explain.report import CSS

    img = base64.b64encode(figure).decode()
    lean = "".join(f"<tr><td>{escape(x['regime'])}</td><td>{escape(x['title'])}</td><td class=n>{x['points']}</td>"
                   f"<td class=n>{x['out_of_sample_mean']:.1%}</td><td class=n>{x['out_of_sample_max']:.1%}</td></tr>"
                   for x in results["leans_on"])
    rules = "".join(f"<tr><td>{escape(r['rule'])}</td><td>{escape(r['says'])}</td><td>{escape(r['finds'])}</td>"
                    f"<td>{'agrees' if r['agrees'] else 'disagrees' if r['agrees'] is False else '—'}</td></tr>"
                    for r in results["rules"])
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{escape(results['title'])}</title>"
            f"<style>{CSS}</style></head><body><h1>{escape(results['title'])}</h1>"
            f"<p class=note>{escape(results['command'])} · {len(results['points'])} points, "
            f"{results['searches']} searches, {results['seconds']:.0f} s wall, {results.get('cpu_s', 0):.0f} s CPU</p>"
            f"<h2>Answer</h2><p>{escape(results['answer'])}</p>"
            f"<img alt='{escape(alt)}' style='max-width:100%' src='data:image/png;base64,{img}'>"
            f"<h2>Regimes it leans on (leave-one-source-out error of the step time)</h2><table><tr><th>regime</th>"
            f"<th>runs it covers</th><th>points</th><th>out-of-sample mean</th><th>max</th></tr>{lean}</table>"
            f"<h2>Practitioner rules</h2><table><tr><th>rule</th><th>says</th><th>the search finds</th><th></th></tr>"
            f"{rules}</table><h2>Points</h2>{markdown_table_html(table)}</body></html>\n")


def results_section(results: dict, table: str, paths: dict[str, str], results_md: str) -> str:
    """The study's section of RESULTS.md: command, run time, answer, figure, regimes, rules, table."""
    here = os.path.dirname(os.path.abspath(results_md))
    rel = {k: os.path.relpath(os.path.abspath(v), here) for k, v in paths.items()}
    lean = "\n".join(f"| {x['regime']} | {x['title']} | {x['points']} | {x['out_of_sample_mean']:.1%} | "
                     f"{x['out_of_sample_max']:.1%} |" for x in results["leans_on"])
    rules = "\n".join(f"| {r['rule']} | {r.get('scenario', '')} | {r['says']} | {r['finds']} | "
                      f"{'agrees' if r['agrees'] else 'disagrees' if r['agrees'] is False else '—'} |"
                      for r in results["rules"])
    return (f"### {results['title']}\n\nCommand: `{results['command']}` — {results['searches']} searches, "
            f"{results['seconds']:.0f} s wall, {results['cpu_s']:.0f} s CPU on {results['cores']} cores "
            f"(a shared machine: the wall time depends on its load).\n\n{results['answer']}\n\n"
            f"![{results['title']}]({rel['figure']})\n\nRegimes the plans lean on (leave-one-source-out error of "
            "the step time, `costmodels/cross_validation.json`):\n\n| regime | published runs | points | "
            f"out-of-sample mean | max |\n|---|---|---|---|---|\n{lean}\n\nPractitioner rules "
            f"(`autoplan explain`'s) against the search:\n\n| rule | scenario | says | the search finds | |\n"
            f"|---|---|---|---|---|\n{rules}\n\n<details><summary>Every scenario</summary>\n\n{table}\n"
            f"</details>\n\nFiles: `{rel['results']}`, `{rel['table']}`, `{rel['report']}`.\n")


def markdown_table_html(text: str) -> str:
    """The Markdown pipe tables of ``text`` as HTML tables, other lines as paragraphs."""
    out, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                rows.append(cells)
            continue
        if rows:
            head, *body = rows
            out.append("<table><tr>" + "".join(f"<th>{escape(c)}</th>" for c in head) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in body)
                       + "</table>")
            rows = []
        if line.strip():
            out.append(f"<p>{escape(line)}</p>")
    return "".join(out)
