"""The cost model on the public rows outside Megatron's tables (``experiments/published_regimes.py``):
torchtitan FSDP on A100 and H100, the Megatron-stack H100 rows, vTrain's single-node runs."""
import os

import pytest


@pytest.fixture(scope="module")
def pr(experiment):
    module = experiment("published_regimes")
    if not os.path.isdir(module.REFERENCE):
        pytest.skip(f"public reference rows not on this machine ({module.REFERENCE})")
    return module


def test_grand_teton_rows_get_their_gpus_hbm_and_power_limited_peak(pr):
    row = next(r for r in pr.regime_json_rows() if r.ident == "tt-h100-T1-8b-fsdp8")
    gpu = pr.cluster(row.cluster).gpu
    assert (gpu.hbm_bytes, gpu.hbm_bw) == (96e9, 2.4e12)
    assert gpu.bf16_flops == pytest.approx(989e12 * 500 / 700)


def test_h100_profile_fits_every_public_h100_row(pr):
    rows = [r for r in pr.regime_json_rows() if "h100" in r.cluster]
    priced = pr.price_all(rows)
    assert len(priced) == 4
    # a regression guard at today's fit (worst row: Nemotron-4 340B at +6.7 %, refitted with the Llama 3
    # 405B 8K row priced at the paper's one-layer chunks, vpp = 8), not the target
    assert all(abs(p.error) <= 0.08 for p in priced), \
        [(p.row.ident, round(p.error, 3)) for p in priced]


def test_fsdp_rows_error_stays_at_todays_level(pr):
    priced = pr.price_all([r for r in pr.regime_json_rows() if r.regime == "fsdp"])
    s = pr.summary(priced)
    assert s["rows"] == 10
    # issue 18's target (mean ≤ 8 %, max ≤ 15 %), guarded at today's level (6.5 % / 12.4 %); the A100
    # rows on their cited 400 Gb/s network (AWS p4de), with flash attention at FA2's published range
    assert s["mean_abs"] <= 0.07
    assert s["max_abs"] <= 0.13


def test_torchtitan_a100_rows_run_on_the_cited_network(pr):
    rows = [r for r in pr.regime_json_rows() if r.cluster == pr.TORCHTITAN_A100]
    assert len(rows) == 8
    cluster = pr.cluster(pr.TORCHTITAN_A100)
    assert (cluster.num_gpus, cluster.nics_per_node) == (64, 2)
    assert cluster.node_network_bw == pytest.approx(2 * 25e9 * 0.96)      # 2x HDR 200G at NCCL's 0.96


@pytest.mark.slow        # > 10 s on 2 cores; CI runs the slow tier too
def test_vtrain_rows_all_priced_under_12_percent(pr):
    rows = pr.vtrain_rows()[::4]
    priced = pr.price_all(rows)
    assert len(priced) == len(rows)          # m < pp 1F1B rows included
    # issue 18's target is 12 %; guarded at today's level (every row: 6.4 %, 101/144 groups ranked right)
    assert pr.summary(priced)["mean_abs"] <= 0.08


def test_ranking_misses_name_the_group_its_pick_and_its_measured_best(pr):
    def priced(group, ident, measured, predicted):
        row = pr.RegimeRow("single-node", ident, "m", "c", 1024, 8, f"tp=1,pp=1,dp=8,mbs={ident[-1]}", measured, group)
        return pr.Priced(row, predicted, 0.0, True)
    rows = [priced("a", "a1", 1.00, 0.90), priced("a", "a2", 1.04, 0.80),    # pick 4 % slower: ranked right
            priced("b", "b1", 1.00, 0.90), priced("b", "b2", 1.06, 0.80)]    # pick 6 % slower: a miss
    (miss,) = pr.ranking_misses(rows)
    assert (miss[0], miss[1].row.ident, miss[2].row.ident) == ("b", "b2", "b1")
    assert pr.group_ranking(rows) == (1, 2)


def test_inversions_are_plans_measured_faster_at_twice_the_micro_batch(pr):
    def priced(ident, batch, mbs, measured):
        row = pr.RegimeRow("single-node", ident, "m", "c", 1024, batch, f"tp=2,pp=1,dp=2,mbs={mbs}", measured, "g")
        return pr.Priced(row, 1.0, 0.0, True)
    rows = [priced("x1", 8, 2, 0.10), priced("x2", 16, 4, 0.09),     # 2 micro-batches each: mbs 4 faster
            priced("y1", 16, 2, 0.20), priced("y2", 32, 4, 0.30),    # 4 each: mbs 4 slower, as the work says
            priced("z1", 16, 8, 0.10)]                               # 1 micro-batch: no twin
    pairs, twins = pr.inversions(rows)
    assert twins == 2
    assert [(a.row.ident, b.row.ident) for a, b in pairs] == [("x1", "x2")]


def test_vtrain_measurements_hold_inversions_no_monotone_model_ranks(pr):
    """A fact of the data, not of the model: >= 120 plans of vTrain's set run faster with twice the
    work per micro-batch (h1024 tp2 mbs 2 -> 4, tp4 mbs 1 -> 2 at either hidden size, tp8 mbs 1 -> 2),
    which is why the ranking target is out of reach of a model whose time grows with the work."""
    rows = [pr.Priced(r, 1.0, 0.0, True) for r in pr.vtrain_rows()]
    pairs, twins = pr.inversions(rows)
    assert twins == 864
    assert len(pairs) == 146


@pytest.fixture(scope="module")
def vl(experiment, pr):
    return experiment("vtrain_layers")


def _synthetic(pr, layer_s, rest_s, tp=2, mbs=2, noise=None):
    """pp = 1 rows of one configuration whose seconds follow F[dp, l] + m·(l·layer + rest) exactly
    (measured), predicted at 1.1x the layer and 0.5x the rest."""
    out = []
    for dp in (1, 2):
        for layers in (12, 24):
            for batch in (8, 16, 32):
                m = batch // (dp * mbs)
                fixed = 0.001 * dp + 0.0001 * layers
                row = pr.RegimeRow("single-node", f"r{len(out)}", f"gpt:layers={layers},hidden=1024,heads=16",
                                   f"vtrain:{dp * tp}", 1024, batch, f"tp={tp},pp=1,dp={dp},mbs={mbs}",
                                   fixed + m * (layers * layer_s + rest_s), group=f"g{layers}")
                out.append(pr.Priced(row, fixed + m * (layers * 1.1 * layer_s + 0.5 * rest_s), 0.0, True))
    return out


def test_layer_split_recovers_the_per_layer_and_per_micro_batch_seconds(pr, vl):
    (split,) = vl.layer_splits(_synthetic(pr, 0.003, 0.007))
    assert split.config == (1024, 2, 2) and split.rows == 12
    assert split.measured_layer_s == pytest.approx(0.003) and split.measured_rest_s == pytest.approx(0.007)
    assert split.predicted_layer_s == pytest.approx(0.0033) and split.predicted_rest_s == pytest.approx(0.0035)
    assert split.layer_error == pytest.approx(0.1)


def test_layer_split_leaves_out_a_configuration_its_rows_cannot_identify(pr, vl):
    rows = [p for p in _synthetic(pr, 0.003, 0.007) if p.row.global_batch == 16]   # one m per (dp, l)
    assert vl.layer_splits(rows) == []


def test_with_measured_layer_reprices_every_stage_over_its_1f1b_slots(pr, vl):
    split = vl.LayerSplit((1024, 2, 2), 12, 0.003, 0.007, 0.004, 0.007)
    row = pr.RegimeRow("single-node", "x", "gpt:layers=24,hidden=1024,heads=16", "vtrain:8", 1024, 16,
                       "tp=2,pp=2,dp=2,mbs=2", 1.0, group="g")
    fixed = vl.with_measured_layer(pr.Priced(row, 0.5, 0.0, True), split)
    # m = 16 / (2·2) = 4 micro-batches, 4 + 2 - 1 = 5 slots of 24 / 2 = 12 layers, 1 ms less each
    assert fixed.predicted_s == pytest.approx(0.5 - 5 * 12 * 0.001)


@pytest.mark.slow        # prices the 1,440 vTrain rows (~30 s on 2 cores)
def test_vtrain_layer_times_vary_where_no_work_model_can_follow(pr, vl):
    """Facts of the data, the reason the ranking target is out of reach: (h 2048, tp 4, mbs 2) runs
    every op of (h 1024, tp 2, mbs 1) at least as large (4x the GEMM FLOPs, the same 8 attention
    batches of 1024² scores, 4x the layer-norm and residual elements, the same kernels, all-reduces
    on twice the GPUs) and measures 17 % faster per layer; and the one configuration (h 1024, tp 2,
    mbs 4), measured below its own mbs 1 and mbs 2, decides 24 groups."""
    priced = pr.price_all(pr.vtrain_rows())
    splits = {s.config: s for s in vl.layer_splits(priced)}
    assert splits[(2048, 4, 2)].measured_layer_s < 0.85 * splits[(1024, 2, 1)].measured_layer_s
    tp2 = [splits[(1024, 2, mbs)].measured_layer_s for mbs in (1, 2, 4)]
    assert tp2[2] < tp2[0] < tp2[1]
    assert pr.group_ranking(priced)[0] == 101
    assert vl.ranked_with_measured_layer(priced, splits[(1024, 2, 4)]) == 125


def test_llm_foundry_rows_fit_under_its_fused_loss(pr, experiment):
    """llm-foundry v0.3.0's MPT computes its loss with flash-attn's fused cross entropy on the bf16
    logits (``RUN_SETTINGS_BY_PREFIX["llmfoundry-"]``); the MPT-3B runs at 8K and 32K ran on 80 GB,
    which the traced fp32 loss (4 B saved + 8 B of gradients per logit) priced over the limit."""
    import dataclasses

    from autoplan.cost import EstimateOptions

    idents = [f"llmfoundry-mpt-3b-h100x8-{seq}-{precision}" for seq in (32768, 8192) for precision in ("bf16", "fp8")]
    rows = {r.ident: r for r in experiment("published_regimes3").rows()[0]}
    for ident in idents:
        row = rows[ident]
        options = pr.row_options(row, EstimateOptions())
        assert options.loss_kernel == "fused"
        fused = pr.price_or_why(row, options)
        eager = pr.price_or_why(row, dataclasses.replace(options, loss_kernel="eager"))
        assert fused.fits and not eager.fits, (ident, fused.memory_gib, eager.memory_gib)
        # at the peak (the loss backward, mbs 3): eager holds the fp32 log-softmax and two fp32 gradients
        # (4 + 8 B per logit) and two fp32 scalars, fused the bf16 logits, their bf16 gradient (2 + 2 B)
        # and the fp32 log-sum-exp per token
        tokens = 3 * row.seq
        logits = tokens * 50368
        assert eager.memory_gib - fused.memory_gib == pytest.approx((8 * logits + 8 - 4 * tokens) / 2**30, rel=1e-9)
