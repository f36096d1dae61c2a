"""The per-shape results a search's workers share (``memo(limit, shared=True)`` through
costmodels/pipeline/shared.py): a result built in one process is read, not rebuilt, in another,
and equals the one built in place."""
import multiprocessing as mp
import os
import time

import numpy as np

from costmodels.memo import memo
from costmodels.pipeline import shared
from costmodels.pipeline.events import compile_schedule
from costmodels.pipeline.simulator import simulate
from costmodels.pipeline.steady import find_period

CALLS: list[int] = []


@memo(16, shared=True)
def _square(x: int) -> int:
    CALLS.append(x)
    return x * x


def _in_child(x: int) -> int:
    return _square(x)


def test_a_result_built_in_a_forked_worker_is_read_not_rebuilt():
    CALLS.clear()
    with shared.sharing() as directory:
        with mp.get_context("fork").Pool(1) as pool:
            assert pool.map(_in_child, [7]) == [49]
        assert CALLS == []                          # built in the child only
        assert len(os.listdir(directory)) == 1
        assert _square(7) == 49 and CALLS == []     # read from the child's file
        assert _square(8) == 64 and CALLS == [8]
    assert not os.path.exists(directory)            # removed with the context
    _square.cache_clear()
    assert _square(7) == 49 and CALLS == [8, 7]     # no directory: built where asked


BUILT = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"autoplan-test-built-{os.getpid()}")


@memo(16, shared=True)
def _slow_cube(x: int) -> int:
    with open(BUILT, "a") as f:          # one line per build, whichever process builds
        f.write(f"{os.getpid()}\n")
    time.sleep(0.3)
    if x < 0:
        raise ValueError("no cube of a negative number here")
    return x ** 3


def _cube_in_child(x: int):
    try:
        return _slow_cube(x)
    except ValueError as err:
        return str(err)


def test_two_workers_asking_at_once_build_a_shape_once():
    """The second asker finds the first's claim and waits for its file instead of building."""
    if os.path.exists(BUILT):
        os.remove(BUILT)
    try:
        with shared.sharing() as directory:
            with mp.get_context("fork").Pool(2) as pool:
                assert pool.map(_cube_in_child, [3, 3], chunksize=1) == [27, 27]
            assert not [n for n in os.listdir(directory) if n.endswith(".claim")]
        with open(BUILT) as f:
            assert len(f.readlines()) == 1
    finally:
        os.remove(BUILT)


def test_a_failed_build_releases_its_claim_and_the_waiter_builds_it():
    if os.path.exists(BUILT):
        os.remove(BUILT)
    try:
        with shared.sharing(), mp.get_context("fork").Pool(2) as pool:
            assert pool.map(_cube_in_child, [-1, -1], chunksize=1) == ["no cube of a negative number here"] * 2
        with open(BUILT) as f:
            assert len(f.readlines()) == 2          # the waiter built it too, and failed the same way
    finally:
        os.remove(BUILT)


def _period_in_child(args):
    find_period.cache_clear()
    compile_schedule.cache_clear()
    return find_period(*args) is not None and compile_schedule(*args[:4]) is not None


def test_shapes_read_back_equal_the_ones_built_in_place():
    shape = ("interleaved", 4, 16, 2)
    fresh_comp = compile_schedule.__wrapped__(*shape)
    fresh_period = find_period.__wrapped__(*shape, 4)
    with shared.sharing() as directory:
        with mp.get_context("fork").Pool(1) as pool:
            assert pool.map(_period_in_child, [shape + (4,)]) == [True]
        assert len(os.listdir(directory)) >= 2
        compile_schedule.cache_clear()
        find_period.cache_clear()
        comp = compile_schedule(*shape)          # not in this process's memo: the file's
        period = find_period(*shape, 4)
    for a, b in ((comp, fresh_comp), (period, fresh_period)):
        for name, value in vars(b).items():
            got = getattr(a, name)
            assert (np.array_equal(got, value) if isinstance(value, np.ndarray) else got == value), name


def test_a_simulation_is_the_same_to_the_bit_with_shapes_shared():
    run = dict(stages=8, microbatches=64, chunks=2, f=[1.0 + 0.01 * s for s in range(16)], b=[2.0] * 16,
               w=[0.0] * 16, p2p=0.05)
    alone = simulate("interleaved", **run)
    compile_schedule.cache_clear()
    find_period.cache_clear()
    with shared.sharing():
        with mp.get_context("fork").Pool(1) as pool:
            in_child = pool.apply(simulate, ("interleaved",), run)
        compile_schedule.cache_clear()
        find_period.cache_clear()
        read_back = simulate("interleaved", **run)
    assert in_child == alone == read_back
