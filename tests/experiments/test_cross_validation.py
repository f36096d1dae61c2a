"""Leave-one-source-out validation (issue 38 item 1): the refit, the folds, the new public rows."""
import json

import pytest


def test_coordinate_descent_finds_the_grid_minimum_and_priors_without_rows(experiment):
    cv = experiment("cross_validation")
    fit = cv.Fit("toy", (cv.Parameter("toy.a", 1.0, (1.0, 2.0, 3.0, 4.0), (0, 5), 9.0, ""),
                         cv.Parameter("toy.b", 10.0, (10.0, 20.0, 30.0), (0, 40), 7.0, "")), ("s",))
    # separable bowl with its minimum at a=3, b=20 (a grid point)
    def bowl(rows, point):
        return (point["toy.a"] - 3.0) ** 2 + (point["toy.b"] - 20.0) ** 2 / 100.0
    start = {"toy.a": 1.0, "toy.b": 10.0, "other": 5.0}
    assert cv.refit(fit, ["row"], start, bowl) == {"toy.a": 3.0, "toy.b": 20.0, "other": 5.0}
    assert cv.refit(fit, [], start, bowl) == {"toy.a": 9.0, "toy.b": 7.0, "other": 5.0}


def test_a_fold_never_fits_on_the_source_it_prices(experiment, monkeypatch):
    cv = experiment("cross_validation")
    seen = []
    monkeypatch.setattr(cv, "refit", lambda fit, rows, start, objective=None: seen.append((fit.name, rows)) or start)
    monkeypatch.setattr(cv, "price", lambda cases, point: [cv.Result(c, c.published_s) for c in cases])
    everything = cv.cases()
    for source in ("sc21", "korthikanti", "torchtitan-h100", "vtrain"):
        seen.clear()
        f = cv.fold(source, everything)
        assert seen, f"{source}: no fit refitted"
        assert all(c.source != source for _, rows in seen for c in rows)
        assert {r.case.source for r in f.results} == {source}
    # korthikanti's rows depend on the A100 fit (refit on SC21's 10 rows) and on the pipeline
    # engine's host time (refit on SC21's 10 and Zero Bubble's 12)
    seen.clear()
    cv.fold("korthikanti", everything)
    assert [(name, len(rows)) for name, rows in seen] == [("a100", 10), ("pipeline-engine", 22)]


def test_out_of_sample_residuals_read_as_parameter_ranges(experiment):
    cv = experiment("cross_validation")
    everything = cv.cases()
    h100 = [c for c in everything if c.source == "torchtitan-h100"]          # FSDP on H100
    zb = [c for c in everything if c.source == "zero-bubble" and "schedule=zb" in c.row.plan][:2]
    results = [cv.Result(h100[0], h100[0].published_s * 0.9), cv.Result(h100[1], h100[1].published_s * 1.05),
               cv.Result(zb[0], zb[0].published_s * 0.8), cv.Result(zb[1], zb[1].published_s * 1.1)]
    report = cv.Report(tuple(results), (cv.Fold("x", dict(cv.SHIPPED), tuple(results)),))
    got = cv.oos_ranges(report)
    # a rate: priced 10 % fast .. 5 % slow is matched by a GEMM rate 0.9x .. 1.05x
    assert (got["h100"]["gemm_peak"]["low"], got["h100"]["gemm_peak"]["high"]) == (0.9, 1.05)
    # a cost: the W pass 1/1.1 .. 1/0.8 of its priced time; a share: only the fast side, top 1
    assert (got["any"]["wpass"]["low"], got["any"]["wpass"]["high"]) == (round(1 / 1.1, 3), 1.25)
    assert (got["any"]["dp_overlap"]["low"], got["any"]["dp_overlap"]["high"]) == (0.9, 1.0)
    assert "a100" not in got and "cp_overlap" not in got["any"]
    text = cv.ranges_yaml(report)
    assert "ranges:" in text and "regimes:" in text and "fsdp:" in text


def test_fp8_pair_ratio_residuals_read_as_the_fp8_gemm_range(experiment):
    """``fp8_gemm_peak`` reads the BF16/FP8 pairs' ratio residuals, not the FP8 rows' own: both
    halves priced 10 % slow leave the ratio right, so only the FP8 half's extra error counts."""
    cv = experiment("cross_validation")
    by = {c.ident: c for c in cv.cases()}
    pairs = [("llmfoundry-mpt-3b-h100x8-8192-bf16", "llmfoundry-mpt-3b-h100x8-8192-fp8", 1.10, 1.10 * 1.04),
             ("fp8lm-gpt-7b-h100x32-bf16", "fp8lm-gpt-7b-h100x32-fp8", 0.90, 0.90 * 0.97)]
    results = [cv.Result(by[i], by[i].published_s * f) for base, fp8, fb, ff in pairs
               for i, f in ((base, fb), (fp8, ff))]
    assert cv.pair_residuals(results) == pytest.approx([0.04, -0.03])
    report = cv.Report(tuple(results), (cv.Fold("x", dict(cv.SHIPPED), tuple(results)),))
    got = cv.oos_ranges(report)["h100"]["fp8_gemm_peak"]
    # a rate: the FP8 half priced 3 % fast .. 4 % slow relative to its BF16 half
    assert (got["low"], got["high"]) == (0.97, 1.04) and "2 BF16/FP8 pair ratios" in got["source"]
    assert cv.pair_error(results) == pytest.approx(0.035)


def test_model_flops_agree_with_korthikanti_for_a_gpt(experiment):
    p3 = experiment("published_regimes3")
    layers, hidden, seq, vocab = 96, 12288, 2048, 50304
    # Korthikanti et al. (full attention, no recompute): 72·B·s·l·h²·(1 + s/6h + V/12lh) per batch
    per_token = 72 * layers * hidden ** 2 * (1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))
    got = p3.model_flops_per_token(f"gpt:layers={layers},hidden={hidden},heads=96,vocab={vocab}", seq, causal=False)
    assert got == pytest.approx(per_token, rel=1e-12)
    causal = p3.model_flops_per_token(f"gpt:layers={layers},hidden={hidden},heads=96,vocab={vocab}", seq, causal=True)
    assert per_token - causal == pytest.approx(6 * layers * seq * hidden, rel=1e-12)


def test_measured_seconds_follow_each_rows_unit(experiment):
    p3 = experiment("published_regimes3")
    raw = {r["id"]: r for r in p3.raw_rows()}
    assert p3.measured_step_s(raw["zb-1p5B-m24-1f1b"]) == pytest.approx(144 / (11.8 * 8), rel=1e-3)
    assert p3.measured_step_s(raw["fp8lm-gpt-7b-h100x32-bf16"]) == pytest.approx(2048 / 159.2)
    # USP: causal-effective TFLOP/s; Llama 3 8B at 64K on 16 GPUs, one sequence
    layers, h, kv, ffn, vocab, s = 32, 4096, 1024, 14336, 128256, 65536
    flops = 6 * (layers * (2 * h * h + 2 * h * kv + 3 * h * ffn) + h * vocab) + 6 * layers * s * h
    row = raw["usp-llama3-8b-a800x16-64k-tp1-u8r2-bs1"]
    assert p3.measured_step_s(row) == pytest.approx(flops * s / (136.31e12 * 16), rel=1e-9)


def test_rows_the_grammar_cannot_write_say_why(experiment):
    p3 = experiment("published_regimes3")
    priced, refused = p3.rows()
    why = {u.ident: u.why for u in refused}
    assert not [i for i in why if i.startswith("usp-")]          # every USP split is written
    # MoE parallel folding: the Megatron-Core rows priced folded, edp derived (tp2·dp16 = ep32·edp1)
    xnode = next(r for r in priced if r.ident == "mcore-qwen3-235b-h100x256-xnode-ep32")
    assert "ep=32,etp=1," in xnode.plan and "edp" not in xnode.plan and "layers=2-3x30-2" in xnode.plan
    assert "mcore-qwen3-235b-h100x256-xnode-ep32" not in why
    # FP8 rows carry their recipe as the plan's precision (published_regimes3.FP8_RECIPE)
    fp8 = {r.ident: r.plan for r in priced if r.ident.startswith("fp8lm-")}
    assert "precision=fp8-delayed" in fp8["fp8lm-gpt-7b-h100x32-fp8"]
    assert "precision" not in fp8["fp8lm-gpt-7b-h100x32-bf16"]
    # the split as the source wrote it, at one sequence per micro-batch (USP_MICRO_BATCH)
    usp = {r.ident: r.plan for r in priced if r.ident.startswith("usp-")}
    assert "ulysses=4,ring=4" in usp["usp-llama3-8b-a800x16-64k-tp1-u4r4-bs1"]
    assert "mbs=1," in usp["usp-llama2-7b-a800x8-30k-tp1-u8r1"]
    assert len(priced) + len(refused) == 59


@pytest.mark.slow        # about a minute on 2 cores
def test_cross_validation_report(capsys, experiment):
    vp = experiment("validate_published")
    assert vp.main(["--cv", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    # issue 38's acceptance where it holds today (Megatron <= 8 %, FSDP <= 10 % out of sample)
    assert s["out_of_sample:megatron"]["mean_abs"] <= 0.08
    assert s["out_of_sample:fsdp"]["mean_abs"] <= 0.10
    # refitting cannot beat the shipped values on their own rows by construction, except by chance
    assert s["out_of_sample:megatron"]["mean_abs"] >= s["in_sample:megatron"]["mean_abs"]
    # rows of sources no fit uses are out of sample already: both errors agree (the FP8 pairs are
    # not: FP8-LM and llm-foundry fit h100.fp8_gemm_peak_fraction)
    assert s["out_of_sample:fp8-bf16"] != s["in_sample:fp8-bf16"]
    assert s["out_of_sample:cp"] == s["in_sample:cp"]
    # the Zero Bubble rows are priced with the pipeline engine's host time the vTrain rows fit
    # (the stack fit's p2p_host_s; a100.yaml takes the same value): out of sample they stay in the
    # issue's bound (schedule rows <= 6 %)
    assert s["out_of_sample:schedule"]["mean_abs"] <= 0.06


@pytest.mark.slow
def test_the_shipped_a100_values_are_still_the_fits_optimum(experiment):
    """A guard on staleness: refitting on every row (today's model) may move a value one grid step,
    but may not beat the shipped values by more than half a point of mean error (today: GEMM
    peak 0.78 -> 0.80, 3.80 % -> 3.73 %)."""
    cv = experiment("cross_validation")
    fit = next(f for f in cv.FITS if f.name == "a100")
    rows = [c for c in cv.cases() if c.source in fit.sources]
    point = cv.refit(fit, rows, dict(cv.SHIPPED))
    assert cv.mean_abs(cv.price(rows, point)) > cv.mean_abs(cv.price(rows, cv.SHIPPED)) - 0.005
    for p in fit.parameters:
        grid = sorted(p.grid)
        assert abs(grid.index(point[p.name]) - grid.index(p.shipped)) <= 1, p.name


def test_zero_bubble_interleaved_rows_get_one_layer_per_chunk(experiment):
    """Zero Bubble's 1F1B-I: one layer per chunk, layers = pp·vpp − 2, the first and the last
    virtual stage one layer fewer (regimes3_public.md): 22 layers on pp 8 x vpp 3 = 24 chunks."""
    p3 = experiment("published_regimes3")
    raw = {r["id"]: r for r in p3.raw_rows()}
    assert p3.uneven_layers(raw["zb-1p5B-m24-interleaved"]) == "0-1x22-0"
    assert p3.uneven_layers(raw["zb-14p6B-m48-interleaved"]) == "0-1x46-0"     # 46 = 16·3 − 2
    assert p3.uneven_layers(raw["zb-1p5B-m24-1f1b"]) == ""
    priced, refused = p3.rows()
    assert not [u for u in refused if u.regime == "schedule"]
    plan = next(r.plan for r in priced if r.ident == "zb-6p2B-m24-interleaved")
    assert "layers=0-1x30-0" in plan and "vpp=4" in plan          # 30 = 8·4 − 2


def test_the_error_file_holds_every_regime_the_studies_name(experiment):
    """``costmodels/cross_validation.json`` (what ``autoplan study`` quotes) has every regime of
    the report, and every regime ``study.common.regimes`` can name."""
    cv = experiment("cross_validation")
    from autoplan.study.common import load_errors
    errors = load_errors(cv.ERROR_FILE)
    assert list(errors) == sorted(r for r, _ in cv.REGIMES) and all(
        0 <= e["out_of_sample_mean"] <= e["out_of_sample_max"] for e in errors.values())
    assert {"megatron", "fsdp", "schedule", "cp", "moe", "fp8-bf16"} <= set(errors)


@pytest.mark.slow        # the whole leave-one-source-out run: minutes on 2 cores
def test_the_error_file_is_what_the_cross_validation_computes(experiment):
    cv = experiment("cross_validation")
    with open(cv.ERROR_FILE) as f:
        shipped = json.load(f)
    assert shipped == json.loads(json.dumps(cv.error_file(cv.cross_validate()))), (
        "costmodels/cross_validation.json is stale: run `python experiments/validate_published.py --cv --write`")

def test_zero_bubble_rows_run_the_forks_model_and_engine(experiment):
    """The fork's script of the paper's time (published_regimes3.ZERO_BUBBLE_MODEL): no flash
    attention, a SentencePiece vocabulary; its split backward is Megatron's WeightGradStore, its
    optimizer step post-validated."""
    p3 = experiment("published_regimes3")
    raw = {r["id"]: r for r in p3.raw_rows()}
    assert p3.model_spec(raw["zb-6p2B-m24-1f1b"]) == "gpt:layers=30,hidden=4096,heads=32,attention=eager,vocab=32000"
    assert dict(p3.engine_options(raw["zb-6p2B-m24-zb-h2"])) == {"post_validation": True, "wgrad_store": True}
    assert p3.engine_options(raw["zb-6p2B-m24-1f1b"]) == ()
    assert "vocab=50304" in p3.model_spec(raw["fp8lm-gpt-7b-h100x32-bf16"])      # other gpt rows: GPT-2's


def test_zero_bubble_memory_agrees_with_the_papers_column(experiment):
    """The rows' own memory (GB per GPU, Table 4) is what the eager attention and the store read
    from the fork stand on: 1F1B and ZB-1p of the 1.5B model within 10 % (priced 27.4 and 29.7 GiB,
    published 30 and 32 GB); flash attention would price 1F1B at 12.6 GiB."""
    p3 = experiment("published_regimes3")
    pr = experiment("published_regimes")
    from autoplan.cost import EstimateOptions
    raw = {r["id"]: r for r in p3.raw_rows()}
    priced, _ = p3.rows()
    for ident in ("zb-1p5B-m24-1f1b", "zb-1p5B-m24-zb-h1"):
        row = next(r for r in priced if r.ident == ident)
        got = pr.price_or_why(row, pr.row_options(row, EstimateOptions()))
        assert got.memory_gib * 2 ** 30 == pytest.approx(raw[ident]["memory_gib"]["value"] * 1e9, rel=0.10)
