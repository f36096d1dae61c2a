"""A one-rank gloo process group for tests that need DTensor in this process."""
from __future__ import annotations

import pytest
import torch.distributed as dist

from autoplan.apply.launch import free_port


@pytest.fixture(scope="module")
def single_rank():
    """An initialised world of one rank for the module; destroyed afterwards."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
