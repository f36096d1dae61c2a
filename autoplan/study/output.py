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
    """The figure as PNG bytes, with no timestamp in its metadata (the same results, the same file);
    its ``Description`` text chunk holds every panel's axis labels (``axis_labels``), so that a
    reader of the PNG alone (the report's tests) can check each axis says what it measures."""
    buf = io.BytesIO()
    labels = json.dumps([[ax.get_xlabel(), ax.get_ylabel()] for ax in fig.axes], ensure_ascii=False)
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None, "Description": labels})
    pyplot().close(fig)
    return buf.getvalue()


def axis_labels(png: bytes) -> list[list[str]]:
    """The [x label, y label] of every panel of a study's PNG (``png_bytes``'s ``Description``
    chunk; [] where the PNG has none)."""
    import struct
    import zlib

    pos, chunks = 8, {}
    while pos + 8 <= len(png):
        size, kind = struct.unpack(">I4s", png[pos:pos + 8])
        data = png[pos + 8:pos + 8 + size]
        key, _, rest = data.partition(b"\0")
        if kind == b"iTXt":        # flag, method, language \0, translated keyword \0, UTF-8 text
            text = rest[2:].split(b"\0", 2)[-1]
            chunks[key.decode("latin-1")] = (zlib.decompress(text) if rest[0] else text).decode("utf-8")
        elif kind in (b"tEXt", b"zTXt"):
            chunks[key.decode("latin-1")] = (zlib.decompress(rest[1:]) if kind == b"zTXt" else rest).decode("latin-1")
        pos += 12 + size
    return json.loads(chunks["Description"]) if "Description" in chunks else []


def band_line(ax: Any, xs: list[float], ys: list[float], lo: list[float], hi: list[float], *, label: str,
              color: str, marker: str = "o", linestyle: str = "-", alpha: float = 0.18) -> None:
    """One series and its p10–p90 band (shaded, ``alpha`` opaque)."""
    ax.plot(xs, ys, marker=marker, color=color, label=label, linewidth=1.6, markersize=4, linestyle=linestyle)
    ax.fill_between(xs, lo, hi, color=color, alpha=alpha, linewidth=0)


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


def read_study(folder: str, name: str) -> tuple[dict, str, bytes] | None:
    """A study written by ``write_study`` under ``folder``: (results, table, figure), or None
    where one of the three files is missing; a results.json that does not parse is a UserError."""
    paths = [os.path.join(folder, f) for f in ("results.json", "table.md", f"{name}.png")]
    if not all(os.path.isfile(p) for p in paths):
        return None
    try:
        with open(paths[0], encoding="utf-8") as f:
            results = json.load(f)
        with open(paths[1], encoding="utf-8") as f:
            table = f.read()
        with open(paths[2], "rb") as fb:
            figure = fb.read()
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read the study in {folder}: {e}",
                        f"rerun it: autoplan study {name} --out {folder}") from None
    if not isinstance(results, dict) or results.get("question") != name:
        raise UserError(f"{paths[0]} is not the results of study {name}",
                        f"rerun it: autoplan study {name} --out {folder}")
    return results, table, figure


def verdict(rule: dict) -> str:
    """A practitioner rule's row against the search: agrees, disagrees, or — (does not apply)."""
    return "agrees" if rule["agrees"] else "disagrees" if rule["agrees"] is False else "—"


def error_band_text(results: dict) -> str:
    """The error band a study's margins must clear: the largest out-of-sample mean error of the
    regimes its plans lean on (``±13.9 % (cp)``), and the others beside it."""
    lean = sorted(results["leans_on"], key=lambda x: -x["out_of_sample_mean"])
    if not lean:
        return "no plan found, no error band"
    return (f"±{lean[0]['out_of_sample_mean']:.1%} ({lean[0]['regime']}, the largest out-of-sample error leaned on"
            + "".join(f"; {x['regime']} ±{x['out_of_sample_mean']:.1%}" for x in lean[1:]) + ")")


def section_html(results: dict, table: str, figure: bytes, alt: str, *, level: int = 1) -> str:
    """One study as an HTML section (its heading at ``level``): the command and run time, the
    answer with its error band, the figure (PNG inlined), the regimes it leans on, the rules it
    checks and the table of every scenario.  Styled by ``explain.report.CSS``."""
    h, sub = f"h{level}", f"h{level + 1}"
    img = base64.b64encode(figure).decode()
    lean = "".join(f"<tr><td>{escape(x['regime'])}</td><td>{escape(x['title'])}</td><td class=n>{x['points']}</td>"
                   f"<td class=n>{x['out_of_sample_mean']:.1%}</td><td class=n>{x['out_of_sample_max']:.1%}</td></tr>"
                   for x in results["leans_on"])
    rules = "".join(f"<tr><td>{escape(r['rule'])}</td><td>{escape(r.get('scenario', ''))}</td><td>{escape(r['says'])}"
                    f"</td><td>{escape(r['finds'])}</td><td>{verdict(r)}</td></tr>" for r in results["rules"])
    return (f"<section class=study id='{escape(results['question'])}'><{h}>{escape(results['title'])}</{h}>"
            f"<p class=note><code>{escape(results['command'])}</code> · {len(results['points'])} points, "
            f"{results['searches']} searches, {results['seconds']:.0f} s wall, {results.get('cpu_s', 0):.0f} s CPU</p>"
            f"<{sub}>Answer</{sub}><p class=answer>{escape(results['answer'])}</p>"
            f"<p class=band><b>Error band</b>: {escape(error_band_text(results))}</p>"
            f"<img alt='{escape(alt)}' style='max-width:100%' src='data:image/png;base64,{img}'>"
            f"<{sub}>Regimes it leans on (leave-one-source-out error of the step time)</{sub}><table><tr><th>regime"
            f"</th><th>runs it covers</th><th>points</th><th>out-of-sample mean</th><th>max</th></tr>{lean}</table>"
            f"<{sub}>Practitioner rules</{sub}><table><tr><th>rule</th><th>scenario</th><th>says</th>"
            f"<th>the search finds</th><th></th></tr>{rules}</table>"
            f"<{sub}>Points</{sub}>{markdown_table_html(table)}</section>")


def page_html(title: str, body: str) -> str:
    """A self-contained HTML page (no network, no external file) in the explain report's style."""
    from autoplan.explain.report import CSS

    return (f"<!doctype html><html><head><meta charset=utf-8><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body>{body}</body></html>\n")


def html(results: dict, table: str, figure: bytes, alt: str) -> str:
    """The study as one self-contained HTML page."""
    return page_html(results["title"], section_html(results, table, figure, alt))


def report_html(studies: list[tuple[dict, str, bytes]], missing: list[str]) -> str:
    """Every study of ``studies`` (results, table, figure) on one page: a heading, one line per
    study (its headline and error band, linked to its section), then each study's section.
    ``missing``: the command that would make each study not found."""
    title = "What autoplan finds: the open questions of 4D-parallel practice"
    toc = "".join(f"<li><a href='#{escape(r['question'])}'>{escape(r['title'])}</a>: {escape(r.get('headline', ''))} "
                  f"(error band {escape(error_band_text(r))})</li>" for r, _, _ in studies)
    gap = ("<p class=note>Not run yet: " + ", ".join(f"<code>{escape(c)}</code>" for c in missing) + "</p>"
           if missing else "")
    body = (f"<h1>{escape(title)}</h1><p class=note>Each point of a study is the search's best plan under that "
            "point's constraint; each answer quotes the leave-one-source-out error of the regimes its plans lean "
            f"on.</p><ul>{toc}</ul>{gap}"
            + "".join(section_html(r, t, f, f"{r['question']}.png", level=2) for r, t, f in studies))
    return page_html(title, body)


def results_section(results: dict, table: str, paths: dict[str, str], results_md: str) -> str:
    """The study's section of RESULTS.md: command, run time, answer, figure, regimes, rules, table."""
    here = os.path.dirname(os.path.abspath(results_md))
    rel = {k: os.path.relpath(os.path.abspath(v), here) for k, v in paths.items()}
    lean = "\n".join(f"| {x['regime']} | {x['title']} | {x['points']} | {x['out_of_sample_mean']:.1%} | "
                     f"{x['out_of_sample_max']:.1%} |" for x in results["leans_on"])
    rules = "\n".join(f"| {r['rule']} | {r.get('scenario', '')} | {r['says']} | {r['finds']} | {verdict(r)} |"
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
