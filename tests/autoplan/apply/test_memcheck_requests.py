"""``memcheck.record_requests``: the allocator requests behind torch's MemTracker (a private
torch API wrapped in one function)."""
import torch
from torch.distributed._tools.mem_tracker import MemTracker

from autoplan.apply.memcheck import record_requests, replay_reserved
from costmodels.allocator import Event


def test_record_requests_tags_allocations_frees_resizes_and_streams():
    tracker = MemTracker()
    events = record_requests(tracker)
    with tracker:
        x = torch.empty(1000)                          # 4000 B, default stream
        with torch.cpu.stream(torch.cpu.Stream()):
            y = torch.empty(10, dtype=torch.bfloat16)  # 20 B on another stream
        z = x * 2                                      # 4000 B
        x.untyped_storage().resize_(0)                 # FSDP2's free_storage
        del y
        x.untyped_storage().resize_(4000)              # FSDP2's alloc_storage: a new request
    assert events == [Event("alloc", 0, 4000, 0), Event("alloc", 1, 20, 1), Event("alloc", 2, 4000, 0),
                      Event("free", 0), Event("free", 1), Event("alloc", 5, 4000, 0)]
    out = replay_reserved(events, allocator="classic", hbm_bytes=None)
    assert out["allocated_peak"] == 2 * 4096 + 512 and out["reserved_peak"] == 2 * (2 << 20)
    del z
