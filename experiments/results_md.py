"""Write one marked section of experiments/RESULTS.md, leaving the other sections untouched."""
from __future__ import annotations

import os

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")


def write_section(tag: str, title: str, text: str, path: str = RESULTS) -> None:
    """Replace the text between ``<!-- tag:start -->`` and ``<!-- tag:end -->`` (append if absent)."""
    start, end = f"<!-- {tag}:start -->", f"<!-- {tag}:end -->"
    body = f"{start}\n### {title}\n\n{text}{end}"
    old = open(path).read() if os.path.exists(path) else "# Results\n"
    if start in old:
        old = old[:old.index(start)] + body + old[old.index(end) + len(end):]
    else:
        old = old.rstrip() + "\n\n" + body + "\n"
    with open(path, "w") as f:
        f.write(old)
