"""``peak_live`` against the walk it vectorises: every rank's peak bytes bit for bit and the
same alive micro-batches per stage, for every schedule, pp, vpp and m, at equal, random and
zero stage bytes; ``peak_bytes`` (the bytes alone) equal to ``peak_live``'s."""
from __future__ import annotations

import numpy as np
import pytest

from costmodels.pipeline.live import _events, peak_bytes, peak_live
from costmodels.pipeline.schedules import BW, SCHEDULES, B, F, W, build_orders
from costmodels.pipeline.steady import reduced_sizes

CHUNKS = {"1f1b": (1,), "gpipe": (1,), "zb-h1": (1,), "zb-h2": (1,), "zbv": (2,), "dualpipev": (2,),
          "interleaved": (2, 3, 4)}


def _walked(schedule, p, m, v, stage_bytes):
    """The reference: one change at a time, the first strict maximum after each action's forwards."""
    size = min([m, *reduced_sizes(schedule, p, m, v)])
    out = []
    for events in _events(schedule, p, size, v):
        alive, live, best, best_alive = {}, 0.0, 0.0, {}
        for starts, ends in events:
            for s in starts:
                alive[s] = alive.get(s, 0) + 1
                live += stage_bytes[s]
            if live > best:
                best, best_alive = live, dict(alive)
            for s in ends:
                alive[s] -= 1
                live -= stage_bytes[s]
        out.append((best, {s: n for s, n in sorted(best_alive.items()) if n}))
    return out


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_peak_live_is_the_walk_bit_for_bit(schedule):
    rng = np.random.default_rng(3)
    checked = 0
    for p in (2, 3, 4, 8):
        for v in CHUNKS[schedule]:
            step = p if schedule == "interleaved" else 1
            lo = max(SCHEDULES[schedule].min_microbatches(p), step)
            for m in sorted({lo, lo + step, 2 * p, 4 * p + step, 16 * p} - {0}):
                if schedule == "interleaved" and m % p:
                    continue
                for weights in ([1.0] * (p * v), list(rng.uniform(1e8, 9e9, p * v)),
                                list(rng.choice([0.0, 1e9 / 3, 7e8 / 7], p * v)), [0.0] * (p * v)):
                    got = [(x.bytes, x.alive) for x in peak_live(schedule, p, m, v, weights)]
                    assert got == _walked(schedule, p, m, v, weights), (schedule, p, v, m, weights)
                    assert peak_bytes(schedule, p, m, v, weights) == tuple(x for x, _ in got)
                    checked += 1
    assert checked >= 40


def _walked_split(schedule, p, m, v, saved, held, freed, loss=None):
    """The reference under a split backward: an action's additions in op order (F: + saved;
    B: + the loss buffers of its stage, − them, + held, then − freed), its frees after (a BW
    opening with + loss, − loss; then − (saved − freed), then BW: − freed, W: − held); the first
    strict maximum at each addition a free follows (a loss's, a B's, and the action's last)."""
    size = min([m, *reduced_sizes(schedule, p, m, v)])
    loss = loss or [0.0] * (p * v)
    last = p * v - 1
    out = []
    for acts in build_orders(schedule, p, size, v):
        live, best = 0.0, 0.0
        for act in acts:
            adds = [op for op in act if op[0] in (F, B)]
            for i, (kind, _, s) in enumerate(adds):
                if kind == B and s == last:
                    live += loss[s]
                    best = max(best, live)
                    live -= loss[s]
                live += saved[s] if kind == F else held[s]
                if (kind == B or i == len(adds) - 1) and live > best:
                    best = live
                if kind == B:
                    live -= freed[s]
            for kind, _, s in act:
                if kind == BW and s == last:
                    live += loss[s]
                    best = max(best, live)
                    live -= loss[s]
                if kind in (BW, W):
                    live -= saved[s] - freed[s]
                    live -= freed[s] if kind == BW else held[s]
        out.append(best)
    return tuple(out)


@pytest.mark.parametrize("schedule", sorted(s for s in SCHEDULES if SCHEDULES[s].split_backward))
def test_split_backward_walk_adds_the_held_gradients_at_b_and_frees_the_loss_there(schedule):
    rng = np.random.default_rng(5)
    for p in (2, 3, 4):
        for v in CHUNKS[schedule]:
            for m in sorted({max(SCHEDULES[schedule].min_microbatches(p), 1), 2 * p, 4 * p + 1}):
                saved = list(rng.uniform(1e8, 9e9, p * v))
                held = list(rng.uniform(0, 3e9, p * v))
                freed = [x * f for x, f in zip(saved, rng.uniform(0, 1, p * v))]
                want = _walked_split(schedule, p, m, v, saved, held, freed)
                assert peak_bytes(schedule, p, m, v, saved, held, freed) == want, (schedule, p, v, m)
                assert tuple(x.bytes for x in peak_live(schedule, p, m, v, saved, held, freed)) == want
                loss = [0.0] * (p * v - 1) + [float(rng.uniform(1e9, 2e10))]
                want = _walked_split(schedule, p, m, v, saved, held, freed, loss)
                assert peak_bytes(schedule, p, m, v, saved, held, freed, loss) == want, (schedule, p, v, m)
                assert tuple(x.bytes for x in peak_live(schedule, p, m, v, saved, held, freed, loss)) == want
                huge = [0.0] * (p * v - 1) + [1e13]      # the loss moment is the peak of the rank holding it
                assert max(peak_bytes(schedule, p, m, v, saved, held, freed, huge)) > 1e13
                plain = peak_bytes(schedule, p, m, v, saved)
                with_held = peak_bytes(schedule, p, m, v, saved, held, [0.0] * (p * v))
                assert all(a >= b * (1 - 1e-12) for a, b in zip(with_held, plain))      # held gradients only add
