"""Load argument lists with torchtitan 0.3.0's own config loader; print what landed where.

    echo '[{"argv": ["--module", "llama3", ...], "world_size": 64}]' | python torchtitan_loader.py

Reads a JSON list of {argv, world_size} on stdin and prints a JSON list with, per entry, either
{"error": ...} or the parsed values torchtitan reads: ``config.parallelism`` (every field), the
``config.training`` batch, sequence and CUDA-graph fields, the activation-checkpoint class, and
``ParallelDims.from_config(config.parallelism, world_size)`` (which asserts the degrees multiply to
the world size) with its dp_shard.  It runs in its own process because of what it installs below.

``ConfigManager.parse_args`` imports the model's ``config_registry``, which imports the whole trainer.
Four modules of that import chain only matter at run time and need packages a CPU test machine does
not install: ``torchtitan.distributed.minimal_async_ep.kernels`` (Triton GPU kernels),
``torch.utils.tensorboard`` (TensorBoard), ``datasets`` (Hugging Face datasets, pyarrow) and ``wandb``.
Each is replaced by an inert stand-in module *only when its package is missing*; nothing the config
dataclasses, tyro's parsing or ``Trainer.Config.__post_init__`` use is stubbed, except the GPU
generation check of the float8 and MXFP8 converters (``answer_as``).  Everything else is the
registry package: ``pip install --no-deps torchtitan==0.3.0`` plus tyro, docstring-parser, typeguard,
spmd_types, einops, torchdata, torch_checkpointing and torchao (see .ci/run).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import sys
import types

# stand-in module → the package whose absence calls for it
STAND_INS = {
    "torchtitan.distributed.minimal_async_ep.kernels": "triton",
    "torch.utils.tensorboard": "tensorboard",
    "datasets": "datasets",
    "wandb": "wandb",
}


class _Inert:
    """Any attribute, call or base class: what a module-level use of a stubbed name needs."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Inert()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()

    def __mro_entries__(self, bases):
        return (object,)


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path, target=None):
        if name in self.names or name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)

        def attribute(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Inert()

        module.__getattr__ = attribute
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install_stand_ins() -> list[str]:
    missing = [name for name, package in STAND_INS.items() if importlib.util.find_spec(package) is None]
    sys.meta_path.insert(0, _StandIns(missing))
    return missing


CAPABILITY = {"h100": (9, 0), "b200": (10, 0)}


def answer_as(gpu: str = "h100") -> None:
    """Float8 and MXFP8 converters (llama3_405b's config, autoplan's FP8 exports) check the GPU
    generation while the config is built: answer as the GPU the config is written for would."""
    import torchtitan.components.quantization.float8 as float8
    import torchtitan.components.quantization.mx as mx

    have = CAPABILITY[gpu]
    float8.has_cuda_capability = mx.has_cuda_capability = lambda major, minor: (major, minor) <= have


def linears(config) -> dict:
    """The model's linear layers as torchtitan will build them: {fqn: config class}, and for
    float8 ones the scaling granularity of their input casts (torchao: TENSORWISE or AXISWISE = rowwise)."""
    from torchtitan.models.common.linear import Linear

    out = {}
    for fqn, cfg, _, _ in config.model_spec.model.traverse(Linear.Config):
        kind = type(cfg).__qualname__
        torchao = getattr(cfg, "_torchao_config", None)
        if torchao is not None:
            kind += ":" + torchao.cast_config_input.scaling_granularity.name
        out[fqn] = kind
    return out


def modules(config) -> list[str]:
    """FQN of every module the model config builds (``traverse`` mirrors ``build()``'s names)."""
    from torchtitan.config.configurable import Configurable

    return sorted({fqn for fqn, _, _, _ in config.model_spec.model.traverse(Configurable.Config, recurse=True)})


def load(argv: list[str], world_size: int) -> dict:
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            config = ConfigManager().parse_args(list(argv))
    except SystemExit as e:                       # tyro's usage errors
        return {"error": f"exit {e.code}: {err.getvalue()[-3000:]}"}
    except Exception as e:                        # __post_init__ checks, registry errors
        return {"error": f"{type(e).__name__}: {e}"}
    out = {"parallelism": dataclasses.asdict(config.parallelism),
           "training": {k: getattr(config.training, k)
                        for k in ("local_batch_size", "global_batch_size", "seq_len", "disable_cuda_graphs")},
           "activation_checkpoint": type(config.activation_checkpoint).__qualname__,
           "linears": linears(config), "modules": modules(config)}
    try:
        dims = ParallelDims.from_config(config.parallelism, world_size)
        out["parallel_dims"] = {"dp_shard": dims.dp_shard, "dp_replicate": dims.dp_replicate}
    except AssertionError as e:
        out["parallel_dims"] = {"error": str(e)}
    return out


def main() -> int:
    requests = json.load(sys.stdin)
    stand_ins = install_stand_ins()
    results = []
    for r in requests:
        answer_as(r.get("gpu", "h100"))
        results.append(load(r["argv"], r["world_size"]))
    json.dump({"stand_ins": stand_ins, "results": results}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
