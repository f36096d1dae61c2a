"""Local process launch with torchrun's environment."""
from __future__ import annotations

import time

from autoplan.apply.launch import in_worker, launch


def test_every_rank_gets_torchrun_environment():
    code = ("import os, sys; e = os.environ; "
            "sys.exit(0 if e['WORLD_SIZE'] == '3' and e['RANK'] == e['LOCAL_RANK'] and e['MASTER_PORT'] "
            "and e['OMP_NUM_THREADS'] == '1' else 9)")
    assert launch(["-c", code], 3) == 0


def test_first_failure_is_returned_named_and_the_others_are_stopped(capsys):
    code = "import os, sys, time; r = os.environ['RANK']; time.sleep(60) if r == '0' else sys.exit(3)"
    start = time.monotonic()
    assert launch(["-c", code], 2) == 3
    assert time.monotonic() - start < 30
    assert "rank 1 failed first (exit code 3)" in capsys.readouterr().err


def test_timeout_stops_all(capsys):
    assert launch(["-c", "import time; time.sleep(60)"], 1, timeout=1) == 124
    assert "no rank failed but 1 s passed" in capsys.readouterr().err


def test_in_worker_reads_the_environment(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert not in_worker()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert in_worker()


def test_ranks_run_expandable_segments_unless_the_caller_chose_an_allocator(monkeypatch):
    check = ("import os, sys; sys.exit(0 if os.environ.get('PYTORCH_CUDA_ALLOC_CONF') == {!r} else 9)")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    assert launch(["-c", check.format("expandable_segments:True")], 1) == 0
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    assert launch(["-c", check.format("max_split_size_mb:128")], 1) == 0
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:False")
    assert launch(["-c", check.format(None)], 1) == 0
