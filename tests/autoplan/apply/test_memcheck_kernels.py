"""memcheck runs the GPU's attention and dropout kernels (``apply.memcheck.gpu_functionals``)."""
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

from autoplan.apply.memcheck import gpu_functionals
from autoplan.frontend.fakes import new_fake_mode

aten = torch.ops.aten


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(func.overloadpacket)
        return func(*args, **(kwargs or {}))


def _layer(x):
    q = x.transpose(1, 2)                       # [b, heads, s, d]
    return F.dropout(F.scaled_dot_product_attention(q, q, q, dropout_p=0.1, is_causal=True), 0.1, True)


def test_attention_with_dropout_runs_flash_in_forward_and_in_recomputation():
    """On CPU, SDPA with dropout takes the math path (s×s softmax, Bernoulli mask) and F.dropout
    a Bernoulli mask in the input's dtype; under ``gpu_functionals`` both are the GPU kernels,
    also when a checkpointed layer is recomputed in backward."""
    saved = F.scaled_dot_product_attention, F.dropout
    with new_fake_mode():
        x = torch.randn(2, 256, 4, 64, dtype=torch.bfloat16, requires_grad=True)
        ops = _Ops()
        with ops:
            _layer(x)
        assert aten._safe_softmax in ops.seen and aten.bernoulli_ in ops.seen          # the CPU path
        ops = _Ops()
        with gpu_functionals(), ops:
            checkpoint(_layer, x, use_reentrant=False).sum().backward()
        assert ops.seen.count(aten._scaled_dot_product_flash_attention) == 2             # forward + recompute
        assert aten._scaled_dot_product_flash_attention_backward in ops.seen
        assert ops.seen.count(aten.native_dropout) == 2
        assert aten._safe_softmax not in ops.seen and aten.bernoulli_ not in ops.seen
    assert (F.scaled_dot_product_attention, F.dropout) == saved
