"""experiments/check_host_cost.py: the evidence on a second source for the eager stack's host cost
(issue 38): its arithmetic and its split of vTrain's rows."""
import os

import pytest
import yaml


def test_attention_slowdown_recovers_a_known_kernel_factor(experiment):
    hc = experiment("check_host_cost")
    # a step the model prices 10 s: 4 s attention, 6 s the rest; the run's attention took 1.5x
    # its priced 4 s, so it measured 6 + 6 = 12 s
    error = 10.0 / 12.0 - 1.0
    assert hc.attention_slowdown(error, 0.4) == pytest.approx(1.5)
    assert hc.left_after(error, 0.4, 1.5) == pytest.approx(0.0, abs=1e-12)
    # at a third of the factor's excess the row is left (6 + 4.2) / 12 - 1 fast
    assert hc.left_after(error, 0.4, 1.05) == pytest.approx(10.2 / 12.0 - 1.0)


def test_classify_by_how_much_the_floor_lengthens_a_row(experiment):
    hc = experiment("check_host_cost")
    assert [hc.classify(x) for x in (0.0, 0.0005, 0.01, 0.3)] == ["GPU-bound", "GPU-bound", "partly", "host-bound"]


def test_a_profile_file_from_a_generated_one_keeps_its_other_fields(experiment):
    cv = experiment("cross_validation")
    first = cv._profiles(cv.SHIPPED)["h100"]
    second = cv._profile_file(first, {"host_floor_s": 1e-4})
    with open(first) as f:
        a = yaml.safe_load(f)
    with open(second) as f:
        b = yaml.safe_load(f)
    assert b == a | {"host_floor_s": 1e-4}
    assert os.path.basename(second).startswith("h100-") and second != first


def test_the_split_puts_a_small_tp8_row_host_bound_and_a_large_tp2_row_gpu_bound(experiment):
    cv = experiment("cross_validation")
    hc = experiment("check_host_cost")
    rows = {c.ident: c for c in cv.cases() if c.source == "vtrain"}
    # vtrain-36: h 1024, tp 8, mbs 1 (launch-bound); vtrain-1344: tp 2, mbs 4 (kernels of 2x..4x the work)
    picked = [rows["vtrain-36"], rows["vtrain-1344"]]
    with_floor = cv.price(picked, cv.SHIPPED)
    without = cv.price(picked, cv.SHIPPED | {"stack.host_floor_s": 0.0})
    shares = [a.predicted_s / b.predicted_s - 1.0 for a, b in zip(with_floor, without)]
    assert [hc.classify(s) for s in shares] == ["host-bound", "GPU-bound"]
