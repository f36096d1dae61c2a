"""Output files written whole or not at all.

``write_text(path, text)`` writes to a temporary file in the target's folder and
renames it over ``path`` (``os.replace``, atomic on POSIX), so an interrupted
command (SIGINT, a crash, a full disk) never leaves a partial file behind, and
a reader never sees half a file.  ``write_section(path, tag, body)`` rewrites one marked
section of a Markdown file that way (``autoplan bench`` and ``autoplan study``'s
``--results-md``, the experiments' RESULTS.md and README blocks).
"""
from __future__ import annotations

import os
import tempfile

from autoplan import interrupts
from autoplan.errors import UserError


def write_text(path: str, text: str, *, flag: str = "-o") -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically; an unwritable path is a UserError."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = registered = None
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
        registered = tmp
        interrupts.register_temporary(tmp)         # removed even where a signal's watchdog ends the process
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())           # mkstemp makes 0600; an output file is 0644-like
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}",
                        f"give {flag} a path in an existing, writable folder") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        interrupts.release_temporary(registered)


def write_section(path: str, tag: str, body: str, *, flag: str = "--results-md") -> None:
    """Replace the text between ``<!-- tag:start -->`` and ``<!-- tag:end -->`` of ``path`` with
    ``body`` (the section appended when absent; a missing file starts as ``# Results``); every
    other byte of the file is left as it was.  Written whole or not at all (``write_text``)."""
    start, end = f"<!-- {tag}:start -->", f"<!-- {tag}:end -->"
    try:
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else "# Results\n"
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}", f"give {flag} a readable Markdown file") from None
    section = f"{start}\n{body.rstrip()}\n{end}"
    if start in old and end in old:
        new = old[:old.index(start)] + section + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + section + "\n"
    write_text(path, new, flag=flag)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
