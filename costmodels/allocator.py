"""PyTorch's CUDA caching allocator, replayed: the *reserved* bytes a sequence of allocations
and frees leaves on a GPU (``torch.cuda.max_memory_reserved``), beside the *allocated* ones.

Why: torchtitan and most trainers report ``max_memory_reserved``; the estimator and torch's
memory tracker give the allocated peak.  The gap is the allocator's cached free blocks that no
later request could use: holes a transient left between tensors that outlived it, and blocks
cached in one stream's pool that another stream's requests cannot take.  It depends on the
order and size of every request, so it is replayed, not fitted.

The algorithm is ``c10/cuda/CUDACachingAllocator.cpp`` (pytorch/pytorch, torch 2.5 – 2.13:
``round_size``, ``get_allocation_size``, ``should_split``, ``get_free_block``,
``try_allocate_expandable_block``, ``release_cached_blocks``), for one device:

* A request of ``n`` bytes is rounded up to a multiple of 512 B (``kMinBlockSize``).  Requests of
  at most 1 MiB (``kSmallSize``) use the *small* pool, the rest the *large* pool; every pool is
  per stream, and a block freed in one stream's pool serves only that stream's requests.
* **Best fit**: the free block of the pool with the smallest size ≥ the request, lowest address
  among equals (``BlockComparatorSize``: stream, size, address).  A larger block is split: the
  request takes its low end, the rest stays free — when the rest is ≥ 512 B (small pool, or
  any pool with expandable segments) or > 1 MiB (large pool).  A freed block merges with free
  neighbours of its segment.
* **No fit, classic segments** (``expandable_segments:False``, the default): ``cudaMalloc`` a
  new segment of 2 MiB (small), 20 MiB (large, request < 10 MiB) or the request rounded up to
  2 MiB (``get_allocation_size``).  Segments are never returned unless an allocation fails: then
  every wholly free segment is released and the ``cudaMalloc`` retried (``release_cached_blocks``).
* **No fit, expandable segments** (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, as
  torchtitan's ``run_train.sh`` runs): each stream and pool has one segment of virtual address
  space whose pages (2 MiB small, 20 MiB large) are mapped on demand at its end.  The free block
  just below the unmapped end is extended by mapping the missing pages
  (``try_allocate_expandable_block``); best fit passes over that block while another free block
  fits (``get_free_block``: blocks are compared by the size they can expand to).  Mapped pages
  stay mapped.

*Reserved* is the bytes of all segments (classic) or all mapped pages (expandable).  Reserved
bytes are no requirement: a full device frees cached blocks and retries before it fails.  What a
run *needs* (``least_capacity``) is the smallest device on which the replay never fails — found
by bisection under classic segments, whose release frees only wholly free segments, so the
holes inside the others are a real cost; under expandable segments the release unmaps every
free page, so what must stay mapped is the pages that hold an allocated byte, whose high-water
``Replay.touched_peak`` is taken as the need (an estimate: the replay does not move later
blocks into unmapped holes as the allocator under pressure would, which may touch other pages).  Not
modelled: ``max_split_size_mb``, ``roundup_power2_divisions``, the garbage-collection
threshold, CUDA graph pools, the events that keep a block freed on another stream cached until
that stream passes (FSDP2 holds its tensors until then instead of ``record_stream``), and
unmapping under expandable segments when the device is full (``Replay.over_capacity`` says
when that point was reached).
"""
from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

MIN_BLOCK = 512                 # kMinBlockSize
SMALL_SIZE = 1 << 20            # kSmallSize: the largest request of the small pool
SMALL_BUFFER = 2 << 20          # kSmallBuffer: a small segment; the small pool's page
MIN_LARGE_ALLOC = 10 << 20      # kMinLargeAlloc: below it a large request gets a 20 MiB segment
ROUND_LARGE = 2 << 20           # kRoundLarge
LARGE_BUFFER = 20 << 20         # kLargeBuffer: a large segment; the large pool's page
_ADDRESS_SPACE = 1 << 52        # each segment's own address range (expandable: virtual)


@dataclass(frozen=True)
class Event:
    """One request to the allocator: ``alloc`` of ``nbytes`` on ``stream`` under ``key``, or
    ``free`` of the block allocated under ``key``."""

    kind: str
    key: int
    nbytes: int = 0
    stream: int = 0


@dataclass(frozen=True)
class Replay:
    """What a replay left, bytes: the peaks of allocated and reserved memory, the reserved bytes
    at the moment of the allocated peak (the gap there is the cached free blocks), whether
    reserved bytes ever passed the capacity (classic: after releasing the
    wholly free segments, i.e. the run would fail), and under expandable segments the peak of
    the pages holding an allocated byte (0 under classic)."""

    allocated_peak: int
    reserved_peak: int
    reserved_at_allocated_peak: int
    over_capacity: bool
    touched_peak: int = 0


def round_size(nbytes: int) -> int:
    """``round_size``: a request rounded up to a multiple of 512 B (at least 512)."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    """``get_allocation_size``: the ``cudaMalloc`` behind a classic segment for a rounded request."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class _Block:
    __slots__ = ("ptr", "size", "allocated", "prev", "next", "segment")
    prev: _Block | None
    next: _Block | None

    def __init__(self, ptr: int, size: int, segment: _Segment, prev: _Block | None = None,
                 next: _Block | None = None):
        self.ptr, self.size, self.allocated, self.segment = ptr, size, False, segment
        self.prev, self.next = prev, next


class _Segment:
    __slots__ = ("pool", "base", "size", "last")
    last: _Block | None

    def __init__(self, pool: tuple[int, bool], base: int, size: int):
        self.pool, self.base, self.size, self.last = pool, base, size, None


class CachingAllocator:
    """One device's caching allocator (see the module docstring); ``capacity`` in bytes, or
    None for a device that never fills."""

    def __init__(self, *, expandable: bool, capacity: int | None = None):
        self.expandable, self.capacity = expandable, capacity
        self.allocated = self.reserved = 0
        self.touched = self.touched_peak = 0      # expandable: bytes of pages holding an allocated byte
        self._page_users: dict[int, int] = {}     # page start → allocated blocks on it
        self.over_capacity = False
        self._free: dict[tuple[int, bool], list[tuple[int, int]]] = {}     # pool → sorted (size, ptr)
        self._blocks: dict[int, _Block] = {}                               # ptr → free block
        self._segments: dict[tuple[int, bool], _Segment] = {}              # expandable: pool → segment
        self._classic: list[_Segment] = []
        self._next_base = 0

    # -- requests -----------------------------------------------------------------------------

    def malloc(self, nbytes: int, stream: int = 0) -> _Block:
        size = round_size(nbytes)
        pool = (stream, size <= SMALL_SIZE)
        block = self._best_fit(pool, size)
        if block is not None:
            self._take(block)
        else:
            block = self._grow(pool, size)      # a free block outside the free lists
        rest = block.size - size
        if (rest >= MIN_BLOCK) if pool[1] or self.expandable else (rest > SMALL_SIZE):     # should_split
            tail = _Block(block.ptr + size, rest, block.segment, block, block.next)
            if block.next is not None:
                block.next.prev = tail
            elif block.segment.last is block:
                block.segment.last = tail
            block.next, block.size = tail, size
            self._give(tail)
        block.allocated = True
        self.allocated += block.size
        if self.expandable:
            self._count_pages(block, +1)
        return block

    def free(self, block: _Block) -> None:
        block.allocated = False
        self.allocated -= block.size
        if self.expandable:
            self._count_pages(block, -1)
        for other in (block.prev, block.next):
            if other is not None and not other.allocated:
                self._take(other)
                self._merge(block, other)
        self._give(block)

    # -- pools --------------------------------------------------------------------------------

    def _best_fit(self, pool: tuple[int, bool], size: int) -> _Block | None:
        free = self._free.get(pool, [])
        i = bisect.bisect_left(free, (size, -1))
        if i == len(free):
            return None
        block = self._blocks[free[i][1]]
        if self.expandable and self._at_end(block) and i + 1 < len(free):
            block = self._blocks[free[i + 1][1]]        # the block that could grow is passed over
        return block

    def _grow(self, pool: tuple[int, bool], size: int) -> _Block:
        """A free block of at least ``size`` bytes from new memory, not in the free lists."""
        if self.expandable:
            return self._map(pool, size)
        need = segment_size(size)
        if self.capacity is not None and self.reserved + need > self.capacity:
            self._release_free_segments()
            self.over_capacity |= self.reserved + need > self.capacity
        segment = _Segment(pool, self._claim_address(), need)
        block = _Block(segment.base, need, segment)
        segment.last = block
        self._classic.append(segment)
        self.reserved += need
        return block

    def _map(self, pool: tuple[int, bool], size: int) -> _Block:
        """Map the pages the request lacks at the end of the pool's expandable segment."""
        segment = self._segments.get(pool)
        if segment is None:
            segment = self._segments[pool] = _Segment(pool, self._claim_address(), 0)
        end = segment.last
        tail = end if end is not None and not end.allocated else None
        page = SMALL_BUFFER if pool[1] else LARGE_BUFFER
        missing = size - (tail.size if tail else 0)
        mapped = -(-missing // page) * page
        segment.size += mapped
        self.reserved += mapped
        if self.capacity is not None and self.reserved > self.capacity:
            self.over_capacity = True
        if tail is not None:
            self._take(tail)
            tail.size += mapped
        else:
            tail = _Block(segment.base + segment.size - mapped, mapped, segment, end)
            if end is not None:
                end.next = tail
            segment.last = tail
        return tail

    def _count_pages(self, block: _Block, delta: int) -> None:
        """Pages (counted from the segment's base, where mapping starts) holding ``block``."""
        page = SMALL_BUFFER if block.segment.pool[1] else LARGE_BUFFER
        users = self._page_users
        base = block.segment.base
        first = base + (block.ptr - base) // page * page
        for start in range(first, block.ptr + block.size, page):
            n = users.get(start, 0) + delta
            if n == 0:
                del users[start]
                self.touched -= page
            else:
                if n == delta:
                    self.touched += page
                users[start] = n
        self.touched_peak = max(self.touched_peak, self.touched)

    def _at_end(self, block: _Block) -> bool:
        return block.segment.last is block

    def _release_free_segments(self) -> None:
        kept = []
        for segment in self._classic:
            block = segment.last
            assert block is not None    # a classic segment is born with its one block
            if block.prev is None and not block.allocated:
                self._take(block)
                self.reserved -= segment.size
            else:
                kept.append(segment)
        self._classic = kept

    def _merge(self, block: _Block, other: _Block) -> None:
        if other is block.prev:
            block.ptr, block.prev = other.ptr, other.prev
            if other.prev is not None:
                other.prev.next = block
        else:
            block.next = other.next
            if other.next is not None:
                other.next.prev = block
            if block.segment.last is other:
                block.segment.last = block
        block.size += other.size

    def _take(self, block: _Block) -> None:
        free = self._free[block.segment.pool]
        del free[bisect.bisect_left(free, (block.size, block.ptr))]
        del self._blocks[block.ptr]

    def _give(self, block: _Block) -> None:
        bisect.insort(self._free.setdefault(block.segment.pool, []), (block.size, block.ptr))
        self._blocks[block.ptr] = block

    def _claim_address(self) -> int:
        base, self._next_base = self._next_base, self._next_base + _ADDRESS_SPACE
        return base


def replay(events: Sequence[Event], *, expandable: bool, capacity: int | None = None) -> Replay:
    """Run ``events`` (in program order) through a fresh allocator.  A ``free`` of a key never
    allocated is ignored (a tensor that existed before the trace began)."""
    allocator = CachingAllocator(expandable=expandable, capacity=capacity)
    live: dict[int, _Block] = {}
    allocated_peak = reserved_peak = reserved_then = 0
    for event in events:
        if event.kind == "alloc":
            live[event.key] = allocator.malloc(event.nbytes, event.stream)
        elif event.kind != "free":
            raise ValueError(f"event kind {event.kind!r} is neither alloc nor free")
        elif event.key in live:
            allocator.free(live.pop(event.key))
        if allocator.allocated > allocated_peak:
            allocated_peak, reserved_then = allocator.allocated, allocator.reserved
        reserved_peak = max(reserved_peak, allocator.reserved)
    return Replay(allocated_peak, reserved_peak, reserved_then, allocator.over_capacity, allocator.touched_peak)


def least_capacity(events: Sequence[Event], *, expandable: bool, free_run: Replay | None = None) -> int:
    """The bytes of device memory the run needs under the allocator (module docstring): under
    classic segments the smallest multiple of 2 MiB at which ``replay`` never runs out, by
    bisection between the allocated and the reserved peak (running out is taken as monotone in
    the capacity); under expandable segments the peak of the pages holding an allocated byte.
    ``free_run``: the replay of ``events`` on a device that never fills, if the caller has it."""
    free_run = free_run or replay(events, expandable=expandable)
    if expandable:
        return free_run.touched_peak
    lo = (free_run.allocated_peak - 1) // ROUND_LARGE        # runs out below its allocated peak
    hi = -(-free_run.reserved_peak // ROUND_LARGE)           # never releases at its reserved peak
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if replay(events, expandable=False, capacity=mid * ROUND_LARGE).over_capacity:
            lo = mid
        else:
            hi = mid
    return hi * ROUND_LARGE
