"""experiments/check_relaxation.py: the relaxation certifies every block ILP of a small search,
at CP-SAT's optimum, and the table says so."""


def test_every_block_ilp_of_a_small_search_is_certified_at_the_cpsat_optimum(experiment):
    script = experiment("check_relaxation")
    row = script.check(("llama:layers=2,hidden=1024,heads=16,kv_heads=4,ffn=3584,vocab=32000", "h100x64", 2048, 64))
    assert row["ilps"] > 10 and row["certified"] == row["ilps"]
    assert row["worst_rel"] <= 1e-9
    table = script.markdown([row])
    assert f"| {row['ilps']} | {row['ilps']} |" in table
