import subprocess
import sys


def test_topologies_and_costmodels_do_not_import_torch_or_autoplan():
    code = ("import sys, topologies, costmodels.collectives; topologies.load('h100x1024'); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'autoplan')); "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
