"""Stage cutting on one process: chained stages compute the whole model; placement of stages on ranks."""
from __future__ import annotations

import torch
from torch.distributed.tensor import Replicate

from autoplan import zoo
from autoplan.apply.layout import probe
from autoplan.apply.pipeline import StageModule, cut_stage, stage_bounds
from autoplan.plan import Plan
from autoplan.zoo.spec import parse_spec

GPT = "gpt:layers=4,hidden=32,heads=4,vocab=64,dropout=0"
LLAMA = "llama:layers=4,hidden=32,heads=4,kv_heads=2,vocab=64,ffn=64"


def _stages(spec, plan):
    torch.manual_seed(0)
    model = zoo.build(parse_spec(spec))
    layout = probe(model, torch.zeros(2, 8, dtype=torch.long))
    bounds = stage_bounds(plan, layout.num_blocks)
    stages = []
    for i, (first, end) in enumerate(bounds):
        copy, inject = cut_stage(model, layout, first, end, owns_pre=i == 0, owns_post=i == len(bounds) - 1)
        stages.append(StageModule(copy, inject, index=i, first=i == 0, last=i == len(bounds) - 1, seq=8,
                                  tp_mesh=None, stream=(Replicate(),)))
    return model, layout, stages


def test_stage_bounds_follow_plan_layers():
    assert stage_bounds(Plan.parse("pp=2,layers=1-3"), 4) == [(0, 1), (1, 4)]
    assert stage_bounds(Plan.parse("pp=2,vpp=2,schedule=interleaved"), 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_chained_stages_compute_the_whole_model_and_its_gradients():
    for spec, plan in ((GPT, Plan.parse("pp=2,vpp=2,schedule=interleaved")), (LLAMA, Plan.parse("pp=2,layers=3-1")),
                       # Llama 3's cut: the first chunk only the embedding, the last only the head
                       (LLAMA, Plan.parse("pp=2,vpp=3,schedule=interleaved,layers=0-1-1-1-1-0"))):
        model, layout, stages = _stages(spec, plan)
        ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
        ref = model(ids)
        ref.square().mean().backward()
        x = ids
        for stage in stages:
            x = stage(x)
        torch.testing.assert_close(x, ref)
        x.square().mean().backward()
        grads = {}
        for stage in stages:
            for name, p in stage.model.named_parameters():
                grads[name] = grads.get(name, 0) + p.grad         # a tied weight sums over its stages
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-7)


def test_stages_own_only_their_parameters_and_keep_model_names():
    model, layout, stages = _stages(GPT, Plan.parse("pp=4"))
    names = [{n for n, _ in s.model.named_parameters()} for s in stages]
    assert "wte.weight" in names[0] and "wpe.weight" in names[0] and "ln_f.weight" not in names[0]
    assert names[1] == {n for n, _ in model.named_parameters() if n.startswith("layers.1.")}
    assert {"wte.weight", "ln_f.weight"} <= names[3] and "wpe.weight" not in names[3]   # tied head
    assert stages[1].model.wte.weight.stride() == (0, 0)                  # a stub: no memory
    assert [len(s.stage_blocks(layout)) for s in stages] == [1, 1, 1, 1]


def test_llama3_cut_trains_like_one_process():
    """pp=2, vpp=3, the first chunk only the embedding and the last only the head (Llama 3's
    cut), ZeRO-2 over dp=2, on 4 gloo ranks: the loss and every gradient of two steps match the
    single process."""
    from autoplan.apply.train import RunConfig
    from autoplan.apply.verify import verify

    config = RunConfig(model="llama:layers=4,hidden=64,heads=4,kv_heads=2,vocab=256,ffn=128",
                       plan="pp=2,dp=2,vpp=3,schedule=interleaved,layers=0-1-1-1-1-0,zero=2", steps=2, seq=16,
                       global_batch=8, optimizer="sgd", lr=0.02)
    check = verify([config], nproc=4, timeout=600)[0]
    assert check.ok(), f"{check.summary()}, tolerance {check.tolerance}"
