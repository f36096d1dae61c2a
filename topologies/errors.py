"""The one error type of the hardware layer.

``topologies`` sits at the bottom of the dependency chain (topologies ← costmodels ← autoplan)
and so cannot raise ``autoplan.errors.UserError``.  It raises ``TopologyError`` instead, with the
same two parts (``problem`` and ``fix``) so the CLI layer converts it one-to-one.
"""
from __future__ import annotations


class TopologyError(ValueError):
    """A cluster name, shorthand or cluster YAML file that cannot be understood.

    ``str(err)`` is the whole message: the problem, then ``fix: ...`` on a second line.
    """

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(problem if not fix else f"{problem}\n  fix: {fix}")
