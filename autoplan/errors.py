"""User-facing errors: one clear message naming the problem and the fix, exit code 2.

Anything a user can cause by bad input (a model file that does not import, an
unknown cluster, a bad plan string, a model that fits nowhere) raises
``UserError``.  The CLI prints ``error: <message>`` and exits with 2, never a
traceback.  Bugs stay ordinary exceptions.
"""
from __future__ import annotations


class UserError(Exception):
    """Bad input.  ``str(err)`` is the whole message shown to the user."""

    exit_code = 2

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(problem if not fix else f"{problem}\n  fix: {fix}")
