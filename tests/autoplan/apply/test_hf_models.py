"""Plain transformers models from a config run under apply as they trace (issue 14).

``LlamaForCausalLM`` / ``MixtralForCausalLM``, no wrapper: the KV cache is turned off, the
logits are the output object's ``.logits`` on the last pipeline stage, and the loss is the
same cross-entropy on every stage layout; loss and every gradient match one process.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autoplan.apply.outputs import logits_of, training_config
from autoplan.apply.train import RunConfig
from autoplan.apply.verify import verify
from autoplan.frontend.source import load_source

MODELS = Path(__file__).parent / "models"
LLAMA, MIXTRAL = str(MODELS / "hf_llama.py"), str(MODELS / "hf_mixtral.py")
CASES = [(LLAMA, "tp=2,pp=2,schedule=1f1b"), (MIXTRAL, "tp=2,pp=2,schedule=1f1b"), (LLAMA, "dp=2,pp=2,zero=1")]


@pytest.fixture(scope="module")
def checks():
    configs = [RunConfig(model=m, plan=p, steps=2, seq=16, global_batch=4, optimizer="sgd", lr=0.02)
               for m, p in CASES]
    return verify(configs, nproc=4, timeout=600)


@pytest.mark.slow        # fast-tier budget (README: under 8 min on 2 cores); CI runs the slow tier too
@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{Path(m).stem}-{p}" for m, p in CASES])
def test_hf_model_matches_one_process(checks, index):
    check = checks[index]
    assert check.ok(), f"{check.summary()}, tolerance {check.tolerance}"
    assert len(check.losses) == 2 and check.tensors > 30


def test_training_config_turns_the_cache_off_and_reads_logits():
    model = training_config(load_source(MIXTRAL).build())
    assert model.config.use_cache is False and model.config._experts_implementation == "batched_mm"
    out = model(torch.zeros(1, 4, dtype=torch.long))
    assert logits_of(out).shape == (1, 4, 256) and logits_of(out.logits) is out.logits
