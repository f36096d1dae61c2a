"""The validated regimes a plan is priced like, and their out-of-sample errors (issue 38 item 5)."""
import pytest

from autoplan.cost.evidence import leaning_errors, validated_regimes
from autoplan.cost.params import out_of_sample_errors
from autoplan.plan import Plan


@pytest.mark.parametrize("plan, moe, regimes", [
    ("tp=8,pp=8,dp=16,vpp=3", False, ("megatron",)),
    ("tp=2,pp=16,dp=16,cp=2,vpp=2,schedule=zbv", False, ("megatron", "schedule", "cp")),
    ("tp=1,pp=1,dp=512,cp=2,zero=3", False, ("fsdp", "cp")),
    ("tp=8,pp=8,dp=16,ep=4,precision=fp8", True, ("megatron", "moe", "fp8-bf16")),
])
def test_regimes_of_a_plan(plan, moe, regimes):
    assert validated_regimes(Plan.parse(plan, num_gpus=1024), moe=moe) == regimes


def test_leaning_errors_quote_the_written_out_of_sample_means():
    errors = out_of_sample_errors()
    assert {"megatron", "fsdp", "schedule", "cp"} <= set(errors)
    got = leaning_errors(Plan.parse("tp=2,pp=16,dp=16,cp=2,vpp=2,schedule=zbv", num_gpus=1024), moe=False)
    assert got == {k: errors[k] for k in ("megatron", "schedule", "cp")}
    assert all(0.0 < v < 1.0 for v in got.values())
