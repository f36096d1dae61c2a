"""``-v`` / ``-vv`` on every command: the ``autoplan`` logger on stderr, silent without it."""
TINY = "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=256"


def test_trace_says_where_its_graph_came_from_only_when_asked(cli):
    quiet = cli("trace", TINY, "--seq", "64")
    assert quiet.returncode == 0, quiet.stderr
    assert "autoplan." not in quiet.stderr
    loud = cli("trace", TINY, "--seq", "64", "-v")
    assert loud.returncode == 0, loud.stderr
    lines = [line for line in loud.stderr.splitlines() if "autoplan.frontend.tracing:" in line]
    assert lines and ("from the cache" in lines[0] or "tracing" in lines[0]), loud.stderr
    # logging never touches what a command prints (the second trace comes from the cache)
    assert loud.stdout.replace(" (from cache)", "") == quiet.stdout.replace(" (from cache)", "")
