"""User-facing errors: one clear message naming the problem and the fix, exit code 2.

Anything a user can cause by bad input (a model file that does not import, an
unknown cluster, a bad plan string, a model that fits nowhere) raises
``UserError(problem, fix)``.  The CLI prints ``error: <problem>`` and
``  fix: <fix>`` and exits with 2, never a traceback.  Bugs stay ordinary
exceptions.  Every construction names a fix (``tests/autoplan/test_errors.py``
checks the sources); ``fix`` keeps a default only so that a missing one is a
test failure, not a ``TypeError`` in front of the user.
"""
from __future__ import annotations

import reprlib

EXIT_USER = 2          # bad input
EXIT_INTERRUPTED = 130  # SIGINT (128 + 2), as a shell reports it

_SHORT = reprlib.Repr()
_SHORT.maxstring = 60
_SHORT.maxother = 60
_SHORT.maxlevel = 2
_SHORT.maxlist = _SHORT.maxdict = _SHORT.maxtuple = _SHORT.maxset = 4


def short_repr(value: object) -> str:
    """``repr(value)`` cut to about 60 characters and two levels of nesting, for messages
    about user-supplied values (a YAML alias bomb must not be expanded into the message)."""
    return _SHORT.repr(value)


class UserError(Exception):
    """Bad input.  ``str(err)`` is the whole message shown to the user."""

    exit_code = EXIT_USER

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(problem if not fix else f"{problem}\n  fix: {fix}")


# --- a KeyboardInterrupt the user sent, or one the model's code raised --------------------------

_SIGINT = {"tracked": False, "seen": False}


def track_sigint() -> None:
    """The CLI's SIGINT handler is installed: from now on a real SIGINT is recorded (``note_sigint``)."""
    _SIGINT.update(tracked=True, seen=False)


def note_sigint() -> None:
    _SIGINT["seen"] = True


def raised_by_code() -> bool:
    """A KeyboardInterrupt caught now came from code (a model's ``raise KeyboardInterrupt``), not
    from the user: SIGINT is tracked and none arrived.  Untracked (the Python API), never."""
    return _SIGINT["tracked"] and not _SIGINT["seen"]
