"""Every cost-model option (``EstimateOptions``) is a flag of every pricing command, and what the
flag says reaches the Estimator the command builds; a bad choice exits 2 with one error."""
import dataclasses
import os

import pytest

from autoplan.cli import main
from autoplan.cost import EstimateOptions
from autoplan.cost.estimator import Estimator
from autoplan.cost.params import load_override

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROFILE = os.path.join(REPO, "costmodels", "profiles", "h100.yaml")
PARAMS = os.path.join(REPO, "experiments", "perturbations", "nic.yaml")
MODEL, CLUSTER = "gpt:layers=4,hidden=512,heads=8,vocab=1000", "h100x16"
COMMANDS = {   # each pricing command on MODEL and CLUSTER, before the option flags
    "search": ["search", MODEL, "--cluster", CLUSTER, "--global-batch", "32", "--workers", "1"],
    "estimate": ["estimate", MODEL, "--cluster", CLUSTER, "--global-batch", "32", "--plan", "dp=16,zero=3"],
    "baseline": ["baseline", MODEL, "--cluster", CLUSTER, "--global-batch", "32", "--recipe", "fsdp"],
    "explain": ["explain", "dp=16,zero=3", "--model", MODEL, "--cluster", CLUSTER, "--global-batch", "32"],
}
FLAGS = {   # EstimateOptions field -> (the flags that set it, the value they set, not its default)
    "overlap_grad_reduce": (["--no-overlap-grad-reduce"], False),
    "allow_cross_domain": (["--allow-cross-domain"], True),
    "profile": (["--profile", PROFILE], PROFILE),
    "solver": (["--solver", "cbc"], "cbc"),
    "time_limit_s": (["--time-limit", "7"], 7.0),
    "fsdp_prefetch": (["--fsdp-prefetch", "2"], 2),
    "fsdp_reshard_after_forward": (["--fsdp-reshard", "off"], False),
    "fsdp_grad_sync": (["--fsdp-grad-sync", "step"], "step"),
    "memory_margin_gib": (["--memory-margin", "6"], 6.0),
    "grad_reduce_bytes": (["--grad-reduce-bytes", "2"], 2.0),
    "state_precision": (["--state-precision", "apex-dfa-bf16"], "apex-dfa-bf16"),
    "kernels": (["--kernels", "megatron-core"], "megatron-core"),
    "attention_kernel": (["--attention-kernel", "fa2"], "fa2"),
    "loss_kernel": (["--loss-kernel", "fused"], "fused"),
    "post_validation": (["--post-validation"], True),
    "wgrad_store": (["--wgrad-store"], True),
    "fp8_engine": (["--fp8-engine", "torchao"], "torchao"),
    "fp8_recompute": (["--fp8-recompute", "bf16"], "bf16"),
    "fp8_params": (["--fp8-params"], True),
    "tp_comm_overlap": (["--tp-comm-overlap"], True),
    "params": (["--params", PARAMS], load_override(PARAMS)),
    "exact": (["--exact"], True),
}
SEARCH_ONLY = {"allow_cross_domain"}   # the search's hard rule; elsewhere a break is reported, not avoided
# options whose FLAGS value EstimateOptions refuses beside another's (option -> the other): the
# all-at-once test leaves them out (each still reaches its Estimator alone), the bad-option test
# checks the refusal: bf16 recompute is Transformer Engine's, not torchao's; Megatron-Core runs its own loss
REFUSED_TOGETHER = {"fp8_recompute": "fp8_engine", "loss_kernel": "kernels"}


class Built(Exception):
    """Raised by the patched Estimator with the options it was built with."""

    def __init__(self, options: EstimateOptions):
        super().__init__()
        self.options = options


@pytest.fixture
def built(monkeypatch):
    """``built(argv)``: the options of the first Estimator ``autoplan ARGV`` builds (it stops there)."""
    def stop(self, model, cluster, options=EstimateOptions(), **kwargs):
        raise Built(options)

    monkeypatch.setattr(Estimator, "__init__", stop)

    def run(argv: list[str]) -> EstimateOptions:
        with pytest.raises(Built) as caught:
            main(argv)
        return caught.value.options
    return run


def test_every_estimate_option_has_a_flag():
    assert set(FLAGS) == {f.name for f in dataclasses.fields(EstimateOptions)}
    default = EstimateOptions()
    assert all(getattr(default, name) != value for name, (_, value) in FLAGS.items())


@pytest.mark.parametrize("name", sorted(FLAGS))
def test_each_option_set_on_the_search_reaches_its_estimator(built, name):
    flags, value = FLAGS[name]
    assert built(COMMANDS["search"] + flags) == dataclasses.replace(EstimateOptions(), **{name: value})


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_at_once_reaches_each_commands_estimator(built, command):
    names = [n for n in FLAGS if (command == "search" or n not in SEARCH_ONLY) and n not in REFUSED_TOGETHER]
    argv = COMMANDS[command] + [flag for n in names for flag in FLAGS[n][0]]
    assert built(argv) == EstimateOptions(**{n: FLAGS[n][1] for n in names})
    assert built(COMMANDS[command]) == EstimateOptions()


@pytest.mark.parametrize("flags,problem", [
    (["--state-precision", "fp64"], "argument --state-precision: invalid choice: 'fp64'"),
    (["--solver", "glpk"], "argument --solver: invalid choice: 'glpk'"),
    (["--fsdp-prefetch", "0"], "--fsdp-prefetch 0 is out of range"),
    (["--grad-reduce-bytes", "0"], "--grad-reduce-bytes 0.0 is out of range"),
    (FLAGS["fp8_recompute"][0] + FLAGS[REFUSED_TOGETHER["fp8_recompute"]][0],
     "FP8 recompute in bf16 needs Transformer"),
    (FLAGS["loss_kernel"][0] + FLAGS[REFUSED_TOGETHER["loss_kernel"]][0],
     "loss kernel 'fused' with kernels 'megatron-core'"),
])
def test_a_bad_option_exits_2_with_one_error(cli, flags, problem):
    out = cli(*COMMANDS["search"], *flags)
    assert out.returncode == 2 and out.stdout == ""
    assert problem in out.stderr and out.stderr.count("error") == 1 and "Traceback" not in out.stderr
