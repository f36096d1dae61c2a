"""Write one marked section of experiments/RESULTS.md (or the README), leaving the other sections
untouched: ``autoplan.atomic.write_section`` with a ``### title`` heading."""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "RESULTS.md")
sys.path.insert(0, os.path.dirname(HERE))

from autoplan.atomic import write_section as _write_section  # noqa: E402


def write_section(tag: str, title: str, text: str, path: str = RESULTS) -> None:
    """Replace the text between ``<!-- tag:start -->`` and ``<!-- tag:end -->`` with ``### title``
    and ``text`` (append if absent)."""
    _write_section(path, tag, f"### {title}\n\n{text}", flag=path)
