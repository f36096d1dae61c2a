"""The step breakdown: a bubble below the extrapolation's precision is rounding, reported as zero."""
from types import SimpleNamespace

import pytest

from autoplan.cost.report import BUBBLE_NOISE, breakdown


def _pipe(step: float, busy: float, p2p: float = 0.0):
    return SimpleNamespace(step_s=step, sim=SimpleNamespace(busy=[busy]), p2p_exposed_s=p2p)


@pytest.mark.parametrize("step, busy, p2p, bubble", [
    (4.0, 4.0 - 1.15e-14, 0.0, 0.0),            # float noise of the extrapolated step
    (4.0, 3.5, 0.1, 0.4),                       # a real bubble: step − busy − exposed P2P
    (4.0, 4.0 + 1e-12, 0.0, 0.0),               # never negative
])
def test_pp_bubble(step, busy, p2p, bubble):
    b = breakdown([], compute=busy, pipe=_pipe(step, busy, p2p), rank=0, dp_exposed=0.0, embed_s=0.0,
                  optimizer_s=0.0)
    assert b["pp_bubble"] == pytest.approx(bubble, abs=1e-15)
    assert BUBBLE_NOISE * step > 1.15e-14
