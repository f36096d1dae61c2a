"""A band's samples priced at once (costmodels.pipeline.paired) give each sample's own
extrapolation bit for bit, and the paired simulator each sample's own ``simulate``."""
from __future__ import annotations

import numpy as np
import pytest

from costmodels.pipeline import simulate, simulate_many, steady
from costmodels.pipeline.events import StageTimes
from costmodels.pipeline.paired import extrapolate_many
from costmodels.pipeline.simulator import _boundaries

# long enough that the period matrix pays off (``steady._pays_off``): the matrix path is exercised
SHAPES = [("1f1b", 8, 256, 1), ("zb-h1", 6, 160, 1), ("zbv", 8, 96, 2), ("dualpipev", 6, 240, 2),
          ("zb-h2", 4, 192, 1), ("interleaved", 4, 176, 2), ("interleaved", 8, 208, 3), ("1f1b", 16, 256, 1)]


def _times(rng, schedule: str, n: int, trial: int) -> StageTimes:
    f = rng.uniform(0.5, 1.5, n) if trial % 3 else np.ones(n)
    if trial % 3 == 2:            # one light stage: a transient that drains for many periods
        f = np.ones(n)
        f[0] = 0.9
    comm = 0.3 * f if schedule == "dualpipev" else np.zeros(n)
    return StageTimes(f, 2 * f, 0.5 * f, comm, 1.3 * comm, _boundaries(rng.uniform(0, 0.05, n - 1), n))


def _takes_the_matrix(schedule: str, p: int, m: int, v: int) -> bool:
    """Whether the shape's extrapolation builds the period matrix (``steady._pays_off``)."""
    c = steady.period_microbatches(schedule, p, m)
    m_s = steady.reduced_sizes(schedule, p, m, v)[0]
    return steady._pays_off(steady.find_period(schedule, p, m_s, v, c), m, m_s, c)


@pytest.mark.parametrize("schedule,p,m,v", SHAPES)
def test_paired_extrapolation_is_each_samples_own_bit_for_bit(schedule, p, m, v):
    rng = np.random.default_rng(p * 100 + m + v)
    times = [_times(rng, schedule, p * v, trial) for trial in range(7)]
    assert _takes_the_matrix(schedule, p, m, v)
    got = extrapolate_many(schedule, p, m, v, times)
    want = [steady.extrapolate(schedule, p, m, v, t) for t in times]
    assert all(w is not None for w in want)       # the shapes extrapolate: the paired path is exercised
    assert got == want


PERIOD_BY_PERIOD = [("interleaved", 8, 40, 2), ("1f1b", 8, 12, 1), ("zbv", 4, 12, 2), ("dualpipev", 4, 13, 2)]


@pytest.mark.parametrize("schedule,p,m,v", PERIOD_BY_PERIOD)
def test_these_shapes_run_their_periods_one_by_one(schedule, p, m, v):
    assert not _takes_the_matrix(schedule, p, m, v)


@pytest.mark.parametrize("schedule,p,m,v", SHAPES + PERIOD_BY_PERIOD + [("gpipe", 4, 16, 1), ("1f1b", 4, 5, 1)])
def test_simulate_many_is_simulate_per_sample(schedule, p, m, v):
    rng = np.random.default_rng(7)
    n = p * v
    runs = []
    for _trial in range(3):
        f = rng.uniform(0.5, 1.5, n).tolist()
        comm = [0.2 * x for x in f] if schedule == "dualpipev" else None
        runs.append(dict(f=f, b=[2 * x for x in f], w=[0.5 * x for x in f], p2p=float(rng.uniform(0, 0.05)),
                         f_comm=comm, b_comm=comm))
    got = simulate_many(schedule, stages=p, microbatches=m, chunks=v, runs=runs)
    assert got == [simulate(schedule, stages=p, microbatches=m, chunks=v, **r) for r in runs]


WHOLE = [("gpipe", 4, 16, 1), ("1f1b", 4, 5, 1), ("interleaved", 8, 16, 2), ("zbv", 4, 8, 2),
         ("dualpipev", 4, 9, 2), ("zb-h2", 4, 6, 1)]


@pytest.mark.parametrize("schedule,p,m,v", WHOLE)
def test_a_shape_that_does_not_extrapolate_is_simulated_whole_for_every_sample_at_once(schedule, p, m, v):
    """``paired.simulate_all`` (the whole step's levels, every sample at once) gives each
    sample's own event-by-event simulation to the bit: uneven stages, a p2p per boundary."""
    rng = np.random.default_rng(p * 10 + m)
    times = [_times(rng, schedule, p * v, trial) for trial in range(5)]
    assert steady.extrapolate(schedule, p, m, v, times[0]) is None      # the whole-step path runs
    runs = [dict(f=t.f.tolist(), b=t.b.tolist(), w=t.w.tolist(), p2p=t.p2p[:p * v - 1].tolist(),
                 f_comm=t.f_comm.tolist(), b_comm=t.b_comm.tolist()) for t in times]
    got = simulate_many(schedule, stages=p, microbatches=m, chunks=v, runs=runs)
    want = [simulate(schedule, stages=p, microbatches=m, chunks=v, exact=True, **r) for r in runs]
    assert got == want
