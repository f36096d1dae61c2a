"""The caching-allocator replay against sequences worked by hand from
``c10/cuda/CUDACachingAllocator.cpp``, and its invariants on random sequences."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from costmodels.allocator import SMALL_BUFFER, CachingAllocator, Event, replay, round_size, segment_size

MiB = 1 << 20


def test_requests_round_to_512_bytes_and_classic_segments_to_the_pool_sizes():
    assert (round_size(1), round_size(512), round_size(513)) == (512, 512, 1024)
    assert segment_size(round_size(4096)) == 2 * MiB                 # small pool
    assert segment_size(3 * MiB) == 20 * MiB                          # large, below 10 MiB
    assert segment_size(31 * MiB) == 32 * MiB                         # rounded up to 2 MiB


def test_expandable_segments_map_pages_at_the_end_and_pass_over_the_growable_block():
    a = CachingAllocator(expandable=True)
    x = a.malloc(30 * MiB)
    y = a.malloc(5 * MiB)  # noqa: F841 (named for the comments)  the 10 MiB left of two 20 MiB pages: no new page
    assert (a.reserved, a.allocated) == (40 * MiB, 35 * MiB)
    a.free(x)                              # a 30 MiB hole below y; 5 MiB free at the end
    a.malloc(31 * MiB)                     # fits neither: the end block grows by 2 pages
    assert (a.reserved, a.allocated) == (80 * MiB, 36 * MiB)
    z = a.malloc(4 * MiB)                  # fits the hole (30) and the end (14): the hole is taken
    assert z.ptr == x.ptr and a.reserved == 80 * MiB


def test_classic_segments_split_a_cached_block_and_keep_streams_apart():
    a = CachingAllocator(expandable=False)
    a.free(a.malloc(30 * MiB))
    a.malloc(10 * MiB)                     # the cached 30 MiB segment is split (rest 20 > 1 MiB)
    assert (a.reserved, a.allocated) == (30 * MiB, 10 * MiB)
    b = CachingAllocator(expandable=False)
    b.free(b.malloc(30 * MiB, stream=1))
    b.malloc(30 * MiB, stream=0)           # another stream's cached block does not serve it
    assert b.reserved == 60 * MiB


def test_a_full_classic_device_releases_its_free_segments_before_growing():
    a = CachingAllocator(expandable=False, capacity=64 * MiB)
    a.free(a.malloc(40 * MiB, stream=1))
    a.malloc(40 * MiB, stream=0)
    assert a.reserved == 40 * MiB and not a.over_capacity


_requests = st.lists(st.tuples(st.booleans(), st.integers(1, 64 * MiB), st.integers(0, 2), st.integers(0, 99)),
                     max_size=60)


def _events(requests) -> list[Event]:
    events, live = [], []
    for is_alloc, nbytes, stream, pick in requests:
        if is_alloc or not live:
            events.append(Event("alloc", len(events), nbytes, stream))
            live.append(events[-1].key)
        else:
            events.append(Event("free", live.pop(pick % len(live))))
    return events


@settings(max_examples=150, deadline=None)
@given(_requests, st.booleans())
def test_replay_invariants(requests, expandable):
    events = _events(requests)
    out = replay(events, expandable=expandable)
    sizes, live, peak = {}, 0, 0                       # the allocated peak, summed independently
    for e in events:
        if e.kind == "alloc":
            sizes[e.key] = -(-e.nbytes // 512) * 512
            live += sizes[e.key]
        else:
            live -= sizes.pop(e.key)
        peak = max(peak, live)
    # expandable segments split any block with 512 B to spare; a classic large block keeps a
    # remainder of up to 1 MiB, which torch counts as allocated too (block->size)
    assert out.allocated_peak == peak if expandable else out.allocated_peak >= peak
    assert out.reserved_peak >= out.reserved_at_allocated_peak >= out.allocated_peak
    if expandable:                                      # whole pages only, and never fewer than those in use
        assert out.reserved_peak % SMALL_BUFFER == 0
        assert out.allocated_peak <= out.touched_peak <= out.reserved_peak
    else:                                               # a classic segment is never smaller than its request's
        assert out.reserved_peak >= max((segment_size(round_size(e.nbytes)) for e in events if e.kind == "alloc"),
                                        default=0)


@settings(max_examples=150, deadline=None)
@given(_requests, st.booleans(), st.one_of(st.none(), st.integers(8, 200)))
def test_segments_stay_consistent_after_every_request(requests, expandable, capacity_mib):
    """After each request: every segment is tiled by its blocks without gaps, no two free blocks
    touch, the free lists hold exactly the free blocks, and pages holding allocated bytes are
    never more than the pages mapped — with and without a device that fills up."""
    a = CachingAllocator(expandable=expandable, capacity=None if capacity_mib is None else capacity_mib * MiB)
    live = []
    for is_alloc, nbytes, stream, pick in requests:
        if is_alloc or not live:
            live.append(a.malloc(nbytes, stream))
        else:
            a.free(live.pop(pick % len(live)))
        segments = list(a._segments.values()) + a._classic
        free = set()
        for seg in segments:
            blocks, b = [], seg.last
            while b is not None:
                blocks.append(b)
                b = b.prev
            blocks.reverse()
            assert blocks[0].ptr == seg.base and sum(b.size for b in blocks) == seg.size
            assert all(x.ptr + x.size == y.ptr and x.next is y for x, y in zip(blocks, blocks[1:]))
            assert not any(not x.allocated and not y.allocated for x, y in zip(blocks, blocks[1:]))
            free |= {(b.segment.pool, b.size, b.ptr) for b in blocks if not b.allocated}
        listed = {(pool, size, ptr) for pool, entries in a._free.items() for size, ptr in entries}
        assert listed == free
        assert a.allocated == sum(b.size for b in live)
        assert a.reserved == sum(seg.size for seg in segments)
        assert a.touched <= a.reserved if expandable else a.touched == 0


def test_a_repeated_pattern_reserves_no_more_after_its_first_round():
    one = [Event("alloc", 0, 3 * MiB), Event("alloc", 1, 7 * MiB), Event("free", 0), Event("alloc", 2, 11 * MiB),
           Event("free", 1), Event("free", 2)]
    rounds = [Event(e.kind, e.key + 10 * r, e.nbytes, e.stream) for r in range(5) for e in one]
    for expandable in (True, False):
        assert replay(rounds, expandable=expandable).reserved_peak == replay(one, expandable=expandable).reserved_peak


def test_the_least_capacity_is_the_smallest_device_the_replay_fits():
    """Classic: a 30 MiB block is freed but a 2 MiB tensor allocated after it lands in its cached
    segment and pins it (the segment is split, never wholly free), so a 40 MiB request needs a
    new segment beside it: 70 MiB.  Expandable: the 2 MiB tensor takes [0, 2) MiB of the 30 MiB
    hole and the 40 MiB request grows the free end block from 2 MiB to [2, 42) MiB: pages
    [0, 20), [20, 40) and [40, 60) hold allocated bytes, 60 MiB."""
    from costmodels.allocator import least_capacity

    events = [Event("alloc", 0, 30 * MiB), Event("free", 0), Event("alloc", 1, 2 * MiB), Event("alloc", 2, 40 * MiB)]
    assert least_capacity(events, expandable=False) == 70 * MiB
    exact = [Event("alloc", 0, 12 * MiB), Event("free", 0), Event("alloc", 1, 14 * MiB)]
    assert least_capacity(exact, expandable=False) == 14 * MiB      # a device of exactly the peak fits
    assert replay(events, expandable=False, capacity=68 * MiB).over_capacity
    assert not replay(events, expandable=False, capacity=70 * MiB).over_capacity
    out = replay(events, expandable=True)
    assert least_capacity(events, expandable=True) == out.touched_peak == 60 * MiB
    assert out.allocated_peak == 42 * MiB
