"""The recorded sample in data/ is synthetic, says so, and is exactly what its generator writes."""
import importlib.util
import os

DATA = os.path.join(os.path.dirname(__file__), "data")


def test_sample_file_is_reproducible_and_labelled_synthetic():
    spec = importlib.util.spec_from_file_location("make_synthetic", os.path.join(DATA, "make_synthetic.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    with open(os.path.join(DATA, "synthetic_h100.yaml")) as f:
        stored = f.read()
    assert stored == gen.synthetic_yaml()
    assert stored.startswith("# SYNTHETIC TEST DATA -- NOT A MEASUREMENT.")
    assert "device: SYNTHETIC H100-like surface (no GPU was run)" in stored
