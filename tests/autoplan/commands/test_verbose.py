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


def test_search_logs_its_passes_with_v_and_every_mesh_with_vv(cli):
    args = ("search", TINY, "--cluster", "h100x8", "--seq", "64", "--global-batch", "16", "--samples", "0",
            "--objective", "point", "--json")
    quiet, info, debug = cli(*args), cli(*args, "-v"), cli(*args, "-vv")
    assert quiet.returncode == info.returncode == debug.returncode == 0, debug.stderr
    assert quiet.stdout == info.stdout == debug.stdout          # the plans do not depend on logging
    assert "autoplan.search" not in quiet.stderr
    assert "meshes after the NVLink rules" in info.stderr and "block ILPs" in info.stderr
    assert "driver: tp" not in info.stderr                    # one line per mesh only at -vv
    meshes = [line for line in debug.stderr.splitlines() if "autoplan.search.driver: tp" in line]
    assert meshes and all(" s, " in line or "short" in line or "bounded out" in line for line in meshes)
