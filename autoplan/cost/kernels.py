"""Saved activations where the engine's kernels keep other bytes than the traced eager ops.

``EstimateOptions.kernels`` names the engine:

* ``eager`` (the default): what the trace records — torch ops as a PyTorch run executes them
  (with the GPU kernels of ``frontend.gpu_kernels``: flash attention keeping q, k, v, its output
  and the fp32 log-sum-exp; the fused RMSNorm keeping its input and fp32 rstd).
* ``megatron-core``: Megatron-Core with its default fusions.  Its SwiGLU is one autograd
  function (``megatron/core/fusions/fused_bias_swiglu.py``, ``SwiGLUFunction``, behind
  ``bias_swiglu_impl``, on unless ``--no-bias-swiglu-fusion``) that saves only its input, the
  fc1 output [gate | up], and recomputes SiLU(gate) in backward (``swiglu_back``).  Eager
  ``F.silu(gate) * up`` also keeps SiLU(gate) for the product's backward: the fused kernel keeps
  ``b·(s/cp)·ffn/tp·2`` bytes less per layer (at Llama 3 405B shape, tp 8 with sp: 6.5 of the
  eager layer's 38.25 bytes per s·b·h/t).  The rest of a Megatron-Core Llama layer keeps what
  the trace keeps: Transformer Engine's ``LayerNormLinear`` the norm's input and its output
  (the linear's input; the sequence shard under sp), flash attention q, k, v, out and lse, the
  row-parallel linears their inputs.
"""
from __future__ import annotations

from autoplan.cost.types import KERNELS
from autoplan.errors import UserError
from autoplan.ir import OpGraph, OpNode, TensorInfo, TensorRef
from autoplan.plan import Plan
from autoplan.routing import routed_region
from autoplan.sharding import BlockSharding
from autoplan.sharding.local import local_bytes
from autoplan.sharding.price import recomputed

SILU = "aten.silu.default"
MUL = "aten.mul.Tensor"


def check_kernels(name: str) -> str:
    """``name`` if it is an engine of ``KERNELS``; UserError otherwise."""
    if name not in KERNELS:
        raise UserError(f"unknown kernels {name!r}", f"use one of: {', '.join(KERNELS)}")
    return name


def gated_silus(graph: OpGraph) -> list[OpNode]:
    """The forward SiLUs whose output a forward product reads: the SwiGLU gates."""
    fwd = list(graph.ops("forward"))
    read = {r.node for n in fwd if n.op == MUL for r in n.inputs}
    return [n for n in fwd if n.op == SILU and n.name in read]


def _out(n: OpNode) -> TensorInfo:
    """The output tensor of op ``n`` (every op has one; only a graph's output node has none)."""
    assert n.out is not None, n.name
    return n.out


def kernel_saving_bytes(kernels: str, graph: OpGraph, bs: BlockSharding, plan: Plan, recompute: str) -> float:
    """Bytes of one micro-batch the engine's kernels do not keep beyond the traced saved bytes
    under ``recompute`` (``bs``: the graph's solved sharding under that policy): under
    ``megatron-core`` the saved SiLU(gate) of each SwiGLU that is not recomputed anyway."""
    if check_kernels(kernels) == "eager" or recompute in ("op", "full"):
        return 0.0
    saved = graph.saved_outputs()
    routed = routed_region(graph)          # the routed experts' saved bytes are ``cost.ep``'s
    return sum(local_bytes(_out(n), bs.placements.get(n.name), plan.tp, plan.mbs, plan.cp)


               for n in gated_silus(graph)
               if TensorRef(n.name, 0) in saved and not recomputed(graph, n, recompute) and n.name not in routed)
