"""cyclic_gc_paused: the collector is off inside the block and restored after, even on error."""
import gc

import pytest

from autoplan.gc_pause import cyclic_gc_paused


def test_pauses_and_restores_an_enabled_collector():
    assert gc.isenabled()
    with cyclic_gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), cyclic_gc_paused():
        raise ValueError("boom")
    assert gc.isenabled()


def test_leaves_a_disabled_collector_disabled():
    gc.disable()
    try:
        with cyclic_gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
