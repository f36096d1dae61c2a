"""Plan strings: canonical form, defaults, JSON round-trip, and conflicts with one clear message."""
import json

import pytest

from autoplan.errors import UserError
from autoplan.plan import FOLDED_SCHEMA_VERSION, SCHEMA_VERSION, Plan

FULL = ("tp=8,pp=8,dp=16,cp=1,ep=1,vpp=3,mbs=1,schedule=interleaved,recompute=selective,"
        "sp=on,zero=1,cp_algo=ring,order=tp-cp-ep-dp-pp")


def test_canonical_string_round_trip():
    plan = Plan.parse(FULL)
    assert plan.to_string() == FULL
    assert Plan.parse(plan.to_string()) == plan
    assert plan.num_gpus == 1024


def test_defaults_fill_dp_sp_zero_schedule():
    plan = Plan.parse("tp=8,pp=4", num_gpus=1024)
    assert plan.dp == 32 and plan.sp and plan.zero == 1 and plan.schedule == "1f1b" and plan.vpp == 1
    assert Plan.parse("tp=8,pp=4,vpp=2", num_gpus=64).schedule == "interleaved"
    assert Plan.parse("pp=4,schedule=zbv", num_gpus=8).vpp == 2
    assert not Plan.parse("tp=1", num_gpus=8).sp


def test_json_round_trip_with_schema_version():
    plan = Plan.parse("tp=4,pp=2,recompute=full-selective,layers=5-7", num_gpus=32)
    text = plan.to_json()
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION
    assert Plan.from_json(text) == plan
    with pytest.raises(UserError, match="schema_version"):
        Plan.from_json(json.dumps({"schema_version": 99, "plan": plan.to_dict()}))


def test_partial_recompute_policies_parse_and_rank_between_their_neighbours():
    from autoplan.export.base import recompute_strength
    from autoplan.plan import partial_recompute, recompute_head, recompute_layers

    plan = Plan.parse("pp=2,recompute=op:3-full:2", num_gpus=2)
    assert plan.recompute == ("op:3", "full:2") and Plan.parse(plan.to_string(), num_gpus=2) == plan
    assert partial_recompute("op:3") == ("op", 3) and partial_recompute("op") is None
    assert recompute_layers("op:3") is None and recompute_layers("full:2") == 2     # full:N only
    assert [recompute_head(p) for p in ("op:3", "full:2", "selective")] == ["op", "full", "selective"]
    order = ["none", "selective", "op:1", "op:40", "op", "full:1", "full:40", "full"]
    assert sorted(reversed(order), key=recompute_strength) == order
    for bad in ("op:0", "op:x", "selective:2", "op:３"):
        with pytest.raises(UserError, match="recompute"):
            Plan.parse(f"recompute={bad}", num_gpus=1)


def test_stage_layers_even_and_explicit():
    assert Plan.parse("pp=4", num_gpus=4).stage_layers(32) == (8, 8, 8, 8)
    assert sum(Plan.parse("pp=4,vpp=3", num_gpus=4).stage_layers(50)) == 50
    assert Plan.parse("pp=2,layers=3-5", num_gpus=2).stage_layers(8) == (3, 5)


def test_end_chunks_may_hold_only_the_embedding_and_the_head():
    """Llama 3 §3.3.2: the first chunk of the first stage has only the embedding, the last chunk of
    the last stage only the output projection and loss; an inner chunk still needs a layer."""
    plan = Plan.parse("pp=2,vpp=2,schedule=interleaved,layers=0-1x2-0", num_gpus=2)
    assert plan.stage_layers(2) == (0, 1, 1, 0)
    _validate("pp=2,vpp=2,dp=32,schedule=interleaved,layers=0-16x2-0")   # 4 chunks, 32 layers: no "only" error
    with pytest.raises(UserError, match="no layer"):
        Plan.parse("pp=2,vpp=2,schedule=interleaved,layers=1-0-1-1", num_gpus=2)
    with pytest.raises(UserError, match="for only 2 layers"):
        _validate("pp=2,vpp=2,dp=32,schedule=interleaved", num_layers=2)


@pytest.mark.parametrize("text, needle", [
    ("tp=8,foo=1", "unknown key 'foo'"),
    ("tp=eight", "not an integer"),
    ("tp=8,tp=4", "given twice"),
    ("schedule=fast", "schedule is one of"),
    ("tp8,pp=2", "not key=value"),
    ("tp8·pp2 fast", "not a compact plan token"),
    ("tp8 mbs1 mbs2", "sets mbs a second time"),
    ("order=tp-dp-tp", "each at most once"),
    ("order=tp-dp-xp", "must list axes among"),
    ("pp=2,order=tp-dp", r"leaves out pp \(degree 2\)"),
    ("pp=2,schedule=interleaved,vpp=1", "interleaved needs vpp"),
    ("dp=4,ep=3", "does not divide dp"),
])
def test_bad_strings_name_the_problem(text, needle):
    with pytest.raises(UserError, match=needle):
        Plan.parse(text, num_gpus=1024)


def _validate(plan_text, **kw):
    args = dict(num_gpus=64, num_layers=32, heads=32, kv_heads=8, experts=0, seq=4096, global_batch=64)
    args.update(kw)
    Plan.parse(plan_text, num_gpus=args["num_gpus"]).validate(**args)


@pytest.mark.parametrize("text, kw, needle", [
    ("tp=8,dp=4", {}, "but the cluster has 64 GPUs"),
    ("tp=3", {"num_gpus": 66}, "does not divide the 32 attention heads"),
    ("cp=3", {"num_gpus": 66, "seq": 4096}, "does not divide the sequence length"),
    ("ep=2", {}, "has no experts"),
    ("ep=4", {"experts": 6}, "does not divide the 6 experts"),
    ("tp=8", {"global_batch": 12}, "not divisible into"),
    ("pp=64", {}, "for only 32 layers"),
    ("tp=8,pp=8,dp=1,schedule=zb-h1", {"global_batch": 4}, "cannot fill 8 pipeline stages"),
])
def test_conflicts_with_model_and_cluster(text, kw, needle):
    with pytest.raises(UserError, match=needle):
        _validate(text, **kw)


def test_dualpipev_needs_two_microbatches_per_stage_and_says_what_batch_would_do():
    plan = "tp=1,pp=16,dp=128,ep=64,schedule=dualpipev"
    args = dict(num_gpus=2048, num_layers=64, heads=32, experts=256)
    _validate(plan, global_batch=4096, **args)                      # 32 micro-batches = 2·pp
    with pytest.raises(UserError) as err:
        _validate(plan, global_batch=2048, **args)                  # 16 < 32
    assert "16" in err.value.problem and "4096" in err.value.fix


def test_stage_placement_loop_and_v():
    interleaved = Plan.parse("pp=4,vpp=2,schedule=interleaved")
    assert [interleaved.stages_of_rank(r) for r in range(4)] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    zbv = Plan.parse("pp=4,schedule=zbv")
    assert [zbv.stages_of_rank(r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert Plan.parse("pp=4").stages_of_rank(2) == (2,)


def test_1f1b_accepts_fewer_microbatches_than_stages_as_megatron_and_deepspeed_run_it():
    """Megatron-LM's and DeepSpeed's 1F1B run m < pp (warm-up min(pp - rank - 1, m)); vTrain measured such runs."""
    _validate("tp=8,pp=8,dp=1,schedule=1f1b", global_batch=4)
    _validate("tp=8,pp=8,dp=1,schedule=gpipe", global_batch=4)


def test_runs_notation_of_the_canonical_string_reads_back_to_the_same_plan():
    plan = Plan.parse("tp=8,pp=16,dp=64,vpp=8,schedule=interleaved,layers=0-1x126-0")
    assert plan.to_string(runs=True).count("layers=0-1x126-0,") == 1
    assert Plan.parse(plan.to_string(runs=True)) == plan
    assert "1x" not in plan.to_string() and len(plan.layers) == 128


def test_k_times_p_minus_two_layers_one_per_chunk():
    """Zero Bubble's interleaved layout: 22 = 8·3 − 2 layers, one per chunk, the first and the
    last chunk holding only the embedding and the head (hand-expanded)."""
    plan = Plan.parse("pp=8,vpp=3,schedule=interleaved,layers=0-1x22-0", num_gpus=8)
    assert plan.stage_layers(22) == (0,) + (1,) * 22 + (0,)
    assert plan.stages_of_rank(0) == (0, 8, 16) and plan.stages_of_rank(7) == (7, 15, 23)
    _validate("pp=8,vpp=3,dp=8,schedule=interleaved,layers=0-1x22-0", num_layers=22)


def test_precision_is_written_only_when_not_bf16():
    bf16 = Plan.parse("tp=2,pp=2", num_gpus=16)
    assert bf16.precision == "bf16" and "precision" not in bf16.to_string()
    assert "precision" not in json.loads(bf16.to_json())["plan"]      # a bf16 plan's JSON as before
    fp8 = Plan.parse("tp=2,pp=2,precision=fp8-rowwise", num_gpus=16)
    assert fp8.to_string().endswith(",precision=fp8-rowwise")
    assert json.loads(fp8.to_json())["plan"]["precision"] == "fp8-rowwise"
    assert Plan.from_json(fp8.to_json()) == fp8 and Plan.parse(fp8.to_string()) == fp8
    assert fp8.to_compact() == "tp2·pp2·dp4 zero1 mbs1 1f1b fp8-rowwise"
    assert Plan.parse(fp8.to_compact()) == fp8


def test_precision_names_what_it_takes():
    with pytest.raises(UserError, match="precision='fp4'") as err:
        Plan.parse("tp=2,precision=fp4", num_gpus=8)
    assert "fp8-delayed" in err.value.fix and "mxfp8" in err.value.fix


@pytest.mark.parametrize("precision, supported, needle", [
    ("fp8", ("bf16",), "needs FP8 tensor cores"),
    ("mxfp8", ("bf16", "fp8", "fp8-rowwise", "fp8-delayed"), "needs block-scaled FP8 tensor cores"),
])
def test_precision_the_gpu_lacks_is_refused_with_what_it_runs(precision, supported, needle):
    plan = Plan.parse(f"tp=2,precision={precision}", num_gpus=8)
    with pytest.raises(UserError, match=needle) as err:
        plan.check_precision("a100-80gb", supported)
    assert err.value.fix == "on a100-80gb use precision " + " or ".join(supported)
    plan.check_precision("b200", supported + (precision,))


# ---- USP's split: ulysses=U (ring = cp/U) --------------------------------------------------------

@pytest.mark.parametrize("text, algo, split", [
    ("cp=16,cp_algo=usp,ulysses=4,ring=4", "usp", (4, 4)),      # both keys (USP paper's u4r4)
    ("cp=16,ulysses=2", "usp", (2, 8)),                          # ulysses alone sets cp_algo=usp
    ("cp=16,ring=8", "usp", (2, 8)),                             # ring alone: ulysses = 16/8
    ("cp=16,cp_algo=ring,ulysses=1,ring=16", "ring", (1, 16)),   # a plain ring, written out
    ("cp=8,ulysses=8,ring=1", "ulysses", (8, 1)),                # a plain Ulysses, written out
    ("cp=16,cp_algo=usp", "usp", None),                          # no key: the rule's split
])
def test_usp_split_keys_parse_to_the_plans_split(text, algo, split):
    plan = Plan.parse(text, num_gpus=16)
    assert (plan.cp_algo, plan.ulysses_ring) == (algo, split)
    assert Plan.parse(plan.to_string()) == plan == Plan.parse(plan.to_compact(), num_gpus=16)
    assert Plan.from_json(plan.to_json()) == plan
    # the canonical string says ulysses= only where the plan fixes a USP split
    assert ("ulysses=" in plan.to_string()) == (algo == "usp" and split is not None)


def test_plan_strings_without_the_split_are_unchanged():
    plan = Plan.parse("tp=2,cp=2,dp=4,cp_algo=usp")
    assert plan.to_string() == ("tp=2,pp=1,dp=4,cp=2,ep=1,vpp=1,mbs=1,schedule=1f1b,recompute=none,sp=on,zero=1,"
                                "cp_algo=usp,order=tp-cp-ep-dp-pp")
    assert plan.to_compact() == "tp2·cp2·dp4 zero1 mbs1 usp"


@pytest.mark.parametrize("text, problem", [
    ("cp=16,ulysses=3", "ulysses=3 does not divide cp=16"),
    ("cp=16,cp_algo=ring,ulysses=4", "ulysses=4 with cp_algo=ring"),
    ("cp=16,ulysses=4,ring=2", "ring=2 with cp=16, ulysses=4"),
    ("cp=16,ring=3", "ring=3 with cp=16"),
])
def test_bad_usp_splits_name_the_conflict(text, problem):
    with pytest.raises(UserError, match=problem):
        Plan.parse(text, num_gpus=16)


def test_the_ulysses_degree_divides_the_heads_on_a_tp_rank():
    # 32 heads over tp 2: 16 per rank; Ulysses 16 of them fine, Ulysses 32 not (cp=32, 64 GPUs)
    Plan.parse("tp=2,cp=32,ulysses=16", num_gpus=64).validate(
        num_gpus=64, num_layers=4, heads=32, kv_heads=8, seq=65536, global_batch=1)
    with pytest.raises(UserError, match="16 attention heads per tp rank to divide by 32"):
        Plan.parse("tp=2,cp=32,cp_algo=ulysses", num_gpus=64).validate(
            num_gpus=64, num_layers=4, heads=32, kv_heads=8, seq=65536, global_batch=1)
    # fewer KV heads than U is allowed: Megatron and USP replicate the KV heads (cost/cp.py prices it)
    Plan.parse("cp=16,ulysses=16", num_gpus=16).validate(
        num_gpus=16, num_layers=4, heads=32, kv_heads=8, seq=65536, global_batch=1)


def test_schema_version_1_plans_still_read_with_the_rules_split():
    d = json.loads(Plan.parse("cp=2,cp_algo=usp,dp=4").to_json())
    d["schema_version"] = 1
    del d["plan"]["ulysses"]
    assert Plan.from_json(json.dumps(d)) == Plan.parse("cp=2,cp_algo=usp,dp=4")


def test_folded_plan_grammar_and_megatron_core_rules():
    """etp folds ep over a stage's tp·cp·dp GPUs (Megatron-Core's parallel folding): ep need not
    divide dp; edp = tp·cp·dp / (etp·ep); written only when given, JSON schema 3."""
    plan = Plan.parse("tp=2,pp=8,vpp=4,dp=16,ep=32,etp=1,mbs=1")
    assert (plan.folded, plan.edp, plan.expert_tp) == (True, 1, 1)
    assert "ep=32,etp=1," in plan.to_string() and plan.to_compact().startswith("tp2·pp8·dp16·ep32·etp1 ")
    assert Plan.parse(plan.to_compact()) == plan == Plan.parse(plan.to_string()) == Plan.from_json(plan.to_json())
    written = json.loads(plan.to_json())
    assert written["schema_version"] == FOLDED_SCHEMA_VERSION == 3 and written["plan"]["etp"] == 1
    plain = Plan.parse("tp=2,dp=16,ep=8")
    assert (plain.folded, plain.edp, plain.expert_tp) == (False, 2, 2)
    assert "etp" not in plain.to_string() and "etp" not in plain.to_json()
    assert json.loads(plain.to_json())["schema_version"] == SCHEMA_VERSION
    with pytest.raises(UserError, match="does not divide dp"):
        Plan.parse("tp=2,dp=16,ep=32")
    with pytest.raises(UserError, match=r"etp·ep = 2·32 does not divide .* 32 GPUs"):
        Plan.parse("tp=2,dp=16,ep=32,etp=2")
    with pytest.raises(UserError, match="pp outermost"):          # parallel_state.py L897-901
        Plan.parse("tp=2,pp=2,dp=4,ep=8,etp=1,order=tp-cp-ep-pp-dp")
    assert Plan.parse("tp=2,pp=2,dp=4,ep=2,etp=1,order=tp-cp-ep-pp-dp").edp == 4   # edp = dp: allowed
    with pytest.raises(UserError, match="pipeline groups"):       # L903-906: same edp, other pp stride
        Plan.parse("tp=2,pp=2,dp=2,ep=2,etp=1,order=tp-pp-cp-ep-dp")


def test_dispatcher_and_ep_overlap_are_written_only_when_set():
    """The MoE dispatch fields: DeepEP's hierarchical dispatcher and combined 1F1B; a plan without
    them reads and writes as before (schema 2), one with them is schema 4 and round-trips, compact too."""
    from autoplan.plan import DISPATCH_SCHEMA_VERSION

    plain = Plan.parse("tp=2,dp=8,ep=8")
    assert "dispatcher" not in plain.to_string() and "ep_overlap" not in plain.to_json()
    plan = Plan.parse("tp=2,pp=8,vpp=4,dp=16,ep=32,etp=1,dispatcher=deepep,ep_overlap=on")
    assert plan.to_string().endswith(",dispatcher=deepep,ep_overlap=on")
    assert plan.to_compact().endswith(" deepep ep-overlap")
    assert Plan.parse(plan.to_compact()) == plan == Plan.from_json(plan.to_json())
    assert json.loads(plan.to_json())["schema_version"] == DISPATCH_SCHEMA_VERSION == 4


@pytest.mark.parametrize("text, needle", [
    ("dp=8,dispatcher=nccl", "dispatcher is one of"),
    ("dp=8,dispatcher=deepep", "expert parallelism"),
    ("dp=8,ep_overlap=on", "expert parallelism"),
    ("pp=2,dp=4,ep=4,ep_overlap=on", "needs schedule=interleaved"),
    ("dp=8,ep=8,ep_overlap=maybe", "ep_overlap=on or ep_overlap=off"),
])
def test_bad_dispatch_fields_name_the_problem(text, needle):
    with pytest.raises(UserError) as err:
        Plan.parse(text)
    assert needle in str(err.value)
