"""The public memory rows (issue 12): experiments/validate_memory.py through its CLI."""
import json

import pytest

GIB = 1024 ** 3


@pytest.fixture(scope="module")
def rows(experiment):
    vm = experiment("validate_memory")
    return {r["id"]: r for r in (vm.price(row) for row in vm.memory_rows())}


def test_nemotron_priced_with_its_published_config_fits(rows):
    r = rows["ngc-nemotron4-340b-128"]
    assert r["options"] == {"state_precision": "apex-dfa-bf16", "kernels": "megatron-core"}
    assert "recompute=selective" in r["plan"]
    b = r["breakdown_gib"]
    # NeMo distributed_fused_adam, dtype bf16: 2 + 2 + 6/d bytes per parameter at d = 2
    assert b["params"] == pytest.approx(b["grads"], abs=0.01)
    assert b["optimizer"] == pytest.approx(1.5 * b["params"], rel=0.01)
    assert r["fits"] and r["predicted_gib"] <= r["limit_gib"]


def test_llama3_405b_priced_with_the_papers_one_layer_chunks(rows):
    """Llama 3 §3.3.2: one layer per model chunk (16 ranks x 8 chunks), the first only the
    embedding, the last only the head and loss.  The worst rank is rank 1, holding Megatron's
    interleaved warm-up 2(p − r − 1) + (v − 1)·p + 1 = 28 + 112 + 1 = 141 one-layer chunk-micro-batches:
    29 of its first chunk and p = 16 of each other."""
    r = rows["llama3-405b-8k-8192"]
    assert "vpp=8" in r["plan"] and "layers=0-" + "1-" * 126 + "0" in r["plan"]
    alive = dict(map(tuple, r["alive"]))
    assert alive == {1: 29, **{1 + 16 * c: 16 for c in range(1, 8)}}
    assert sum(alive.values()) == 2 * (16 - 1 - 1) + 7 * 16 + 1


def test_torchtitan_rows_are_priced_allocated_and_compared(rows):
    for ident in ("tt-h100-T1-8b-fsdp8", "tt-h100-T3-8b-fsdp128"):
        r = rows[ident]
        assert r["error"] == pytest.approx(r["predicted_gib"] / r["published_gib"] - 1, abs=1e-3)
        assert "recompute=op" in r["plan"] and r["fits"]


def test_cli_prints_every_row(capsys, experiment):
    vm = experiment("validate_memory")
    assert vm.main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["id"] for r in out} == {"tt-h100-T1-8b-fsdp8", "tt-h100-T3-8b-fsdp128",
                                      "llama3-405b-8k-8192", "ngc-nemotron4-340b-128"}


def test_markdown_table_folds_the_layer_list_and_marks_misses(rows, experiment):
    vm = experiment("validate_memory")
    text = vm.markdown(list(rows.values()))
    line = next(l for l in text.splitlines() if l.startswith("| llama3-405b-8k-8192 "))
    assert "layers=0-1x126-0" in line and "**no**" in line and "ran: must fit" in line
    t1 = next(l for l in text.splitlines() if l.startswith("| tt-h100-T1-8b-fsdp8 "))
    assert f"{rows['tt-h100-T1-8b-fsdp8']['error']:+.1%}" in t1


def test_a_reserved_row_adds_the_allocator_replays_gap_to_the_estimate(experiment):
    """The replay path of the torchtitan rows (``--reserved``, ``--write``), on a small model:
    memcheck runs the plan whole and replays its requests through both allocators."""
    vm = experiment("validate_memory")
    row = {"id": "small", "model": "llama:layers=4,hidden=1024,heads=8,kv_heads=4,ffn=2816,vocab=8192",
           "cluster": "h100x8", "seq": 2048, "global_batch": 16, "plan": "dp=8,zero=3,mbs=2,recompute=op",
           "published_gib": 1.0, "must_fit": False, "options": {}}
    r = vm.price(row, reserved=True)
    assert set(r["reserved"]) == {"expandable", "classic"}
    for got in r["reserved"].values():
        assert 0 < got["gap_gib"] < r["predicted_gib"]
        assert got["predicted_gib"] == pytest.approx(r["predicted_gib"] + got["gap_gib"], abs=0.011)
        assert got["allocated_gib"] <= got["needs_gib"] <= got["allocated_gib"] + got["gap_gib"] + 0.01
    assert r["predicted_reserved_gib"] == r["reserved"]["expandable"]["predicted_gib"]
    assert r["error"] == pytest.approx(r["predicted_reserved_gib"] - 1.0, abs=0.011)
    assert r["allocated_error"] == pytest.approx(r["predicted_gib"] - 1.0, abs=0.006)     # GiB rounded to 0.01
    line = next(l for l in vm.markdown([r]).splitlines() if l.startswith("| small "))
    assert f"{r['predicted_reserved_gib']:.1f} (reserved)" in line
