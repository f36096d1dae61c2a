"""Robust ranking: order candidate plans by what they are worth when the cost model is wrong.

Every candidate carries a ``Band``: its step time on the run's paired samples of the uncertain
parameters (``cost/uncertainty.py``).  Objectives (smaller is better):

* ``point``: the point estimate (the ranking without bands);
* ``p50`` / ``p90``: the median / 90th percentile of the step time over the samples;
* ``regret`` (the default): the worst regret over the samples, maxₛ t(plan, s) / minₚ t(p, s) − 1,
  the minimum over the candidate pool on the same sample s (Savage's minimax regret).  It asks
  "whichever of the plausible models is the true one, how far from that model's best plan can
  I be?" — the question a plan must answer when the cost model is wrong.  Unlike p90 it does
  not reward a plan for being slow everywhere alike (insensitive), and unlike p50 it does not
  let a plan that collapses under one plausible model (a NIC at 80 %, a slow split W pass) win
  on the median.  The samples are paired, so the regret is a per-model comparison, not a
  comparison of two bands.

Near-duplicates are folded: walking the ranking, a candidate whose step time stays within
``FOLD_TOLERANCE`` of an already kept one on *every* sample (the model cannot tell them apart,
whatever its parameters) is listed under that one instead of taking a row, and its mesh counts
as answered.  The ``point``
objective folds nothing, so it reproduces the ranking without bands.

Each returned plan says how often it is the fastest of the returned set (``p_best``, ties to
the better ranked) and its worst regret over the samples against the whole ranked pool
(``worst_regret``) — the reference the ``regret`` objective ranks by, so under that objective
``worst_regret`` is the score and the returned plans are in its order.  (Against the returned
set alone, a plan beaten on some sample only by a plan that is not returned — another variant of
its mesh, a mesh ranked below the top K — would look better than one ranked above it.)
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from autoplan.cost.uncertainty import Band

Objective = Literal["point", "p50", "p90", "regret"]   # the module docstring's
OBJECTIVES: tuple[Objective, ...] = get_args(Objective)
DEFAULT_OBJECTIVE: Objective = "regret"
FOLD_TOLERANCE = 0.005


@dataclass(frozen=True)
class Robust:
    """What the bands say about one returned plan."""

    objective: str
    score: float               # its value of the objective (seconds; regret: a fraction)
    p_best: float              # share of samples where it is the fastest of the returned set
    worst_regret: float        # max over samples of t / min over the whole ranked pool − 1
    folded: tuple[str, ...]    # plans within FOLD_TOLERANCE of it on every sample

    def to_dict(self) -> dict[str, object]:
        return {"objective": self.objective, "score": self.score, "p_best": self.p_best,
                "worst_regret": self.worst_regret, "folded": list(self.folded)}


def scores(bands: list[Band], objective: str) -> list[float]:
    """The objective of each band (same order); regret is taken against the whole list."""
    if objective == "point":
        return [b.point_step_s for b in bands]
    if objective in ("p50", "p90"):
        q = 0.5 if objective == "p50" else 0.9
        return [b.step(q) for b in bands]
    best = [min(col) for col in zip(*(b.step_s for b in bands))]
    return [max(t / m - 1.0 for t, m in zip(b.step_s, best)) for b in bands]


def rank(keys: list[str], bands: list[Band], objective: str, top_k: int,
         groups: Sequence[Hashable] | None = None) -> list[tuple[int, Robust]]:
    """Indices of the ``top_k`` kept candidates in objective order, each with its Robust record.

    ``keys`` (plan strings) break ties, so the order is total and deterministic; ``groups``
    (mesh keys): at most one candidate of a group is kept, the best by the objective."""
    s = scores(bands, objective)
    regrets = s if objective == "regret" else scores(bands, "regret")
    order = sorted(range(len(bands)), key=lambda i: (s[i], bands[i].point_step_s, keys[i]))
    kept: list[int] = []
    folded: dict[int, list[str]] = {}
    taken = set()
    for i in order:
        group = groups[i] if groups is not None else i
        if group in taken:
            continue
        twin = None if objective == "point" else next((k for k in kept if _same(bands[i], bands[k])), None)
        if twin is not None:
            folded[twin].append(keys[i])
            taken.add(group)          # that mesh is the kept plan's answer
        elif len(kept) < top_k:
            kept.append(i)
            taken.add(group)
            folded[i] = []
    columns = list(zip(*(bands[i].step_s for i in kept)))
    out = []
    for pos, i in enumerate(kept):
        wins = sum(1 for col in columns if _winner(col) == pos)
        out.append((i, Robust(objective, s[i], wins / len(columns), regrets[i], tuple(folded[i]))))
    return out


def _same(a: Band, b: Band) -> bool:
    return all(abs(x / y - 1.0) <= FOLD_TOLERANCE for x, y in zip(a.step_s, b.step_s))


def _winner(column: tuple[float, ...]) -> int:
    """Position of the fastest (first on ties)."""
    return min(range(len(column)), key=lambda j: (column[j], j))
