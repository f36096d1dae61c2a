"""Every recipe on a dense, a MoE and a long-context case: valid, fitting plans that follow the
recipe's rules — or a clear UserError where the recipe cannot apply."""
from __future__ import annotations

import pytest

from autoplan.baselines import RECIPES, baseline, check_recipe
from autoplan.baselines.common import divisors
from autoplan.errors import UserError
from autoplan.mesh import Mesh

DENSE = ("gpt3-175b", "h100x1024", 2048, 1024)
MOE = ("mixtral-8x22b", "h100x512", 2048, 1024)
DEEPSEEK = ("deepseek-v3", "h100x2048", 2048, 4096)
LONG = ("llama3-8b", "h100x256", 131072, 128)


@pytest.fixture(scope="session")
def planned(setup):
    """``planned(case, recipe)`` → (plan, estimate, (graph, cluster, estimator)), memoised."""
    memo = {}

    def get(case, recipe):
        if (case, recipe) not in memo:
            model, cluster, seq, batch = case
            s = setup(model, cluster, seq)
            plan = baseline(recipe, s[0], s[1], seq=seq, global_batch=batch, estimator=s[2])
            memo[case, recipe] = (plan, s[2].estimate(plan, batch), s)
        return memo[case, recipe]
    return get


def assert_valid(plan, est, s, batch):
    graph, cluster, _ = s
    assert plan.num_gpus == cluster.num_gpus
    assert est.fits, est.memory_gib
    assert batch % (plan.dp * plan.mbs) == 0
    assert est.microbatches >= plan.pp


# --- dense ---------------------------------------------------------------------------------------

def test_megatron_dense(planned, setup):
    plan, est, s = planned(DENSE, "megatron")
    assert_valid(plan, est, s, DENSE[3])
    assert (plan.tp, plan.cp, plan.ep, plan.mbs, plan.zero, plan.sp) == (8, 1, 1, 1, 1, True)
    assert plan.order == ("tp", "cp", "ep", "dp", "pp") and plan.recompute == ("selective",)
    assert plan.schedule == "interleaved" and 2 <= plan.vpp <= 4 and 96 % (plan.pp * plan.vpp) == 0
    # the smallest depth that fits: the next smaller divisor does not
    smaller = [d for d in divisors(128) if d < plan.pp][-1]
    graph, cluster, estimator = s
    shallower = plan.replace(pp=smaller, dp=1024 // (8 * smaller), vpp=1, schedule="1f1b")
    assert not estimator.estimate(shallower, DENSE[3]).fits


def test_megascale_dense_puts_dp_outermost_and_pp_across_ib(planned):
    plan, est, s = planned(DENSE, "megascale")
    assert_valid(plan, est, s, DENSE[3])
    assert plan.order == ("tp", "cp", "ep", "pp", "dp") and plan.tp == 8 and plan.zero == 1
    cluster = s[1]
    mesh = Mesh.of(plan)
    assert cluster.span(mesh.group("tp")).level == "nvlink"
    assert cluster.span(mesh.group("pp")[:2]).level != "nvlink"          # stage neighbours on other nodes
    assert mesh.stride("dp") == plan.tp * plan.pp                          # dp is the slowest-varying axis


def test_llama3_dense(planned):
    plan, est, s = planned(DENSE, "llama3")
    assert_valid(plan, est, s, DENSE[3])
    assert (plan.tp, plan.cp, plan.zero) == (8, 1, 2) and plan.pp <= 16
    assert plan.order == ("tp", "cp", "ep", "pp", "dp")


def test_fsdp_dense(planned):
    plan, est, s = planned(DENSE, "fsdp")
    assert_valid(plan, est, s, DENSE[3])
    assert (plan.tp, plan.pp, plan.cp, plan.dp, plan.zero) == (1, 1, 1, 1024, 3)


def test_deepseek_refuses_a_dense_model(setup):
    graph, cluster, estimator = setup(*DENSE[:3])
    with pytest.raises(UserError, match="dense model"):
        baseline("deepseek", graph, cluster, seq=2048, global_batch=1024, estimator=estimator)


# --- MoE -----------------------------------------------------------------------------------------

def test_deepseek_mixtral(planned):
    plan, est, s = planned(MOE, "deepseek")
    assert_valid(plan, est, s, MOE[3])
    assert (plan.tp, plan.pp, plan.vpp, plan.schedule, plan.zero) == (1, 16, 2, "dualpipev", 1)
    assert plan.ep == 8                                                    # capped by Mixtral's 8 experts
    assert est.microbatches >= 2 * plan.pp


def test_deepseek_v3_spreads_ep_64_over_8_nodes(planned):
    plan, est, s = planned(DEEPSEEK, "deepseek")
    assert_valid(plan, est, s, DEEPSEEK[3])
    assert (plan.ep, plan.pp, plan.tp) == (64, 16, 1)
    span = s[1].span(Mesh.of(plan).group("ep"))
    assert span.nodes == 8 and span.level != "nvlink"


def test_deepseek_needs_enough_microbatches(setup):
    graph, cluster, estimator = setup(*DEEPSEEK[:3])
    with pytest.raises(UserError) as err:
        baseline("deepseek", graph, cluster, seq=2048, global_batch=1024, estimator=estimator)
    assert "micro-batches" in err.value.problem and "4096" in err.value.fix


@pytest.mark.parametrize("recipe", ["megatron", "megascale", "llama3", "fsdp"])
def test_other_recipes_on_moe(planned, recipe):
    plan, est, s = planned(MOE, recipe)
    assert_valid(plan, est, s, MOE[3])
    if recipe in ("megatron", "megascale"):
        assert plan.tp == 8 and plan.ep == 8                               # EP carved out of DP
    else:
        assert plan.ep == 1


# --- long context --------------------------------------------------------------------------------

def test_llama3_long_context_uses_cp(planned):
    plan, est, s = planned(LONG, "llama3")
    assert_valid(plan, est, s, LONG[3])
    assert plan.cp == 16 and plan.tp == 8 and plan.cp_algo == "ring"       # 131072 / 8192


@pytest.mark.parametrize("recipe", ["megatron", "megascale"])
def test_megatron_long_context_falls_back_to_full_recompute(planned, recipe):
    plan, est, s = planned(LONG, recipe)
    assert_valid(plan, est, s, LONG[3])
    assert plan.recompute == ("full",) and plan.cp == 1


def test_fsdp_long_context_cannot_apply(setup):
    graph, cluster, estimator = setup(*LONG[:3])
    with pytest.raises(UserError, match="does not split evenly over 256 GPUs"):
        baseline("fsdp", graph, cluster, seq=LONG[2], global_batch=128, estimator=estimator)
    with pytest.raises(UserError) as err:                                  # a full batch: the logits do not fit
        baseline("fsdp", graph, cluster, seq=LONG[2], global_batch=256, estimator=estimator)
    assert "fits in memory" in err.value.problem and "GiB" in err.value.problem


# --- registry ------------------------------------------------------------------------------------

def test_registry_and_bad_name():
    assert list(RECIPES) == ["megatron", "megascale", "llama3", "fsdp", "deepseek", "published"]
    with pytest.raises(UserError, match="unknown recipe 'nope'"):
        check_recipe("nope")


def test_recipes_are_deterministic(setup, planned):
    graph, cluster, estimator = setup(*DENSE[:3])
    again = baseline("megatron", graph, cluster, seq=2048, global_batch=1024, estimator=estimator)
    assert again == planned(DENSE, "megatron")[0]


def test_a_recipe_tuned_within_its_family_keeps_its_degrees_and_is_no_slower(setup):
    """``baselines.tuning``: micro-batch, virtual stages and recompute tried, the degrees kept."""
    from autoplan.baselines import baseline
    from autoplan.baselines.tuning import tuned, variants

    graph, cluster, est = setup("gpt-1.7b", "h100x64")
    for name in ("megatron", "fsdp", "llama3"):
        plan = baseline(name, graph, cluster, seq=2048, global_batch=256, estimator=est)
        best = tuned(plan, est, 256)
        keep = ("tp", "cp", "ep", "pp", "dp", "zero", "sp", "order")
        assert {k: getattr(best, k) for k in keep} == {k: getattr(plan, k) for k in keep}
        e, e0 = est.estimate(best, 256), est.estimate(plan, 256)
        assert e.fits and e.step_time_s <= e0.step_time_s * (1 + 1e-12)
        assert best == plan or best in set(variants(plan, graph.num_layers, 256))
    # megatron's pp > 1 plan: interleaved vpp ≤ 8 dividing the layers, and plain 1F1B, are among the variants
    plan = baseline("megatron", graph, cluster, seq=2048, global_batch=256, estimator=est).replace(
        pp=2, dp=4, schedule="1f1b", vpp=1)
    schedules = {(v.schedule, v.vpp) for v in variants(plan, graph.num_layers, 256)}
    assert ("1f1b", 1) in schedules and all(graph.num_layers % (2 * v) == 0 for s, v in schedules if s != "1f1b")
