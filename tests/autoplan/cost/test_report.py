"""The step breakdown: a bubble below the extrapolation's precision is rounding, reported as zero."""
from types import SimpleNamespace

import pytest

from autoplan.cost.report import BUBBLE_NOISE, breakdown


def _pipe(step: float, busy: float, p2p: float = 0.0):
    return SimpleNamespace(step_s=step, sim=SimpleNamespace(busy=[busy]), p2p_exposed_s=p2p,
                           engine_host_seconds=lambda rank, microbatches: 0.0)


@pytest.mark.parametrize("step, busy, p2p, bubble", [
    (4.0, 4.0 - 1.15e-14, 0.0, 0.0),            # float noise of the extrapolated step
    (4.0, 3.5, 0.1, 0.4),                       # a real bubble: step − busy − exposed P2P
    (4.0, 4.0 + 1e-12, 0.0, 0.0),               # never negative
])
def test_pp_bubble(step, busy, p2p, bubble):
    b = breakdown([], compute=busy, pipe=_pipe(step, busy, p2p), rank=0, dp_exposed=0.0, embed_s=0.0,
                  optimizer_s=0.0, microbatches=1)
    assert b["pp_bubble"] == pytest.approx(bubble, abs=1e-15)
    assert BUBBLE_NOISE * step > 1.15e-14


def test_the_pipeline_engines_host_time_is_its_own_cause():
    """k·host_s in each F and B of a virtual stage with k boundaries (1 at the ends, 2 inside),
    once per micro-batch: rank 1 of 4 at 3 micro-batches carries 2 (F, B) · 3 · 2 · h."""
    from autoplan.cost.pp import Pipeline, engine_host, engine_instructions

    h = 3e-4
    assert engine_host(4, h) == [h, 2 * h, 2 * h, h] and engine_host(1, h) == [0.0] and engine_host(4, 0.0) == [0.0] * 4
    assert engine_instructions([1.0, 1.0], [2.0, 2.0], h) == ([1.0 + h, 1.0 + h], [2.0 + h, 2.0 + h])
    pipe = Pipeline((), ((0,), (1,), (2,), (3,)), (), (), (), 0.0, 0.0, SimpleNamespace(), 0.0,
                    engine_host_s=tuple(engine_host(4, h)))
    assert pipe.engine_host_seconds(1, 3) == pytest.approx(2 * 3 * 2 * h)
    assert pipe.engine_host_seconds(0, 3) == pytest.approx(2 * 3 * h)
