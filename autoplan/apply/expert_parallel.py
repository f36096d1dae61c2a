"""Expert parallelism: experts sharded over the ep axis, tokens dispatched with ``all_to_all_single``.

An *experts module* is a module inside a block whose own parameters are all ≥3-D with one
leading size E (the expert count), as the zoo's batched ``Experts`` [E, h, f] and transformers'
``MixtralExperts`` / ``Qwen2MoeExperts`` [E, 2f, h] are.  Ep rank j keeps experts
[j·E/ep, (j+1)·E/ep) (``shard_experts``) and the module's forward is wrapped; routing stays
the model's own, on this rank's tokens, so the capacity is what the model defines:

* **capacity buffer** (zoo MoE: forward(x [E, C, h]), C = ceil(T·k/E · capacity_factor) of the
  rank's T tokens): the buffer is cut into ep parts of E/ep experts, part j goes to ep rank j
  (one equal-split all-to-all), each rank runs its experts on [E/ep, ep·C, h] (the slots of
  every source rank side by side) and a second all-to-all returns the slots;
* **dropless routing** (transformers: forward(x [T, h], top_k_index [T, k], top_k_weights [T, k])):
  the T·k choices are sorted by expert, the per-expert counts exchanged (an all-to-all of E
  integers), the rows sent with per-rank split sizes, run on the local experts (the module's own
  forward, each row with its one local expert and weight 1), sent back, weighted by the gate and
  summed per token.

The backward of an all-to-all is the all-to-all with the splits swapped.  An expert's weight
gradient on ep rank j therefore sums the contributions of every ep rank's tokens; ``apply``
reduces it over the expert-dp group (``EXPERT_DP``: cp·dp) and divides by cp·ep·dp (the dense
average).  Tensor parallelism composes: a tp DTensor activation is replicated over tp and
unwrapped before the exchange (every tp rank sends the same tokens), the local experts keep
their tp placements, and the output is rewrapped as replicated.

Under MoE parallel folding with etp = 1 (``plain=True``) the experts are not split over tp: the ep
group is the expert layout's (``Mesh.expert``), which holds attention tp ranks too, so every rank
of it runs its E/ep experts whole, on plain tensors.  The tp ranks of one attention group hold
the same capacity buffer; as in Megatron-Core (whose tp ranks dispatch their own sequence-parallel
tokens), each sends only its 1/tp of every expert's slots (the buffer redistributed to Shard(1)
over tp, whose backward gathers the slot gradients back), and the returned slots are gathered
over tp (Shard(1) → Replicate).  Every routed token is then computed once in the ep group, so an
expert's gradient sums each token once (``groups.gradient_reductions`` divides by cp·dp).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from autoplan.errors import UserError


def expert_count(module: nn.Module) -> int:
    """E when ``module`` is an experts module (own parameters all ≥3-D with leading size E), else 0."""
    own = list(module.parameters(recurse=False))
    if not own or any(p.dim() < 3 for p in own):
        return 0
    sizes = {p.shape[0] for p in own}
    return sizes.pop() if len(sizes) == 1 else 0


def find_experts(model: nn.Module, blocks_path: str) -> dict[str, int]:
    """FQN → expert count of every experts module inside the block stack."""
    prefix = blocks_path + "."
    return {name: e for name, m in model.named_modules() if name.startswith(prefix) and (e := expert_count(m))}


def model_experts(model: nn.Module, blocks_path: str) -> int:
    """The expert count of the model (0 without experts); UserError if modules disagree."""
    counts = set(find_experts(model, blocks_path).values())
    if len(counts) > 1:
        raise UserError(f"the experts modules of {type(model).__name__} have different expert counts "
                        f"{sorted(counts)}", "expert parallelism needs one expert count, or run with ep=1")
    return counts.pop() if counts else 0


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of rows: ``send_splits[j]`` rows to group rank j, ``recv_splits[j]`` from it."""

    @staticmethod
    def forward(ctx, x, group, recv_splits: list[int], send_splits: list[int]):
        ctx.group, ctx.recv, ctx.send = group, recv_splits, send_splits
        return _exchange(x, group, recv_splits, send_splits)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, ctx.group, ctx.send, ctx.recv), None, None, None


def _exchange(x: torch.Tensor, group, recv_splits: list[int], send_splits: list[int]) -> torch.Tensor:
    out = x.new_empty((sum(recv_splits),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv_splits, send_splits, group=group)
    return out


class _Local:
    """Unwraps tp DTensor activations (replicated first, or with ``split`` this tp rank's part of
    that dim) and rewraps results the same way."""

    def __init__(self, split: int | None = None) -> None:
        self.mesh = None
        self.split = split

    def __call__(self, x):
        if isinstance(x, DTensor):
            self.mesh = x.device_mesh
            if self.split is not None and x.device_mesh.size() > 1:
                tp = x.device_mesh.size()
                if x.shape[self.split] % tp:
                    raise UserError(f"MoE parallel folding with etp=1 splits each expert's {x.shape[self.split]} "
                                    f"capacity slots over tp={tp}, which does not divide them",
                                    "pick a sequence, batch or capacity factor giving a multiple of tp slots, "
                                    "or etp=tp")
                return x.redistribute(x.device_mesh, (Shard(self.split),)).to_local()
            return x.redistribute(x.device_mesh, (Replicate(),)).to_local()
        return x

    def wrap(self, x: torch.Tensor):
        if self.mesh is None:
            return x
        if self.split is not None and self.mesh.size() > 1:
            return DTensor.from_local(x, self.mesh, (Shard(self.split),), run_check=False).redistribute(
                self.mesh, (Replicate(),))
        return DTensor.from_local(x, self.mesh, (Replicate(),), run_check=False)

    def unwrap(self, x):
        return x.redistribute(x.device_mesh, (Replicate(),)).to_local() if isinstance(x, DTensor) else x


def shard_experts(module: nn.Module, ep: int, ep_rank: int, group, plain: bool = False) -> None:
    """Keep this ep rank's E/ep experts of ``module`` and route its forward through the exchange
    (``plain``: the experts run on plain tensors, module docstring)."""
    experts = expert_count(module)
    if experts % ep:
        raise UserError(f"ep={ep} does not divide the {experts} experts of {type(module).__name__}",
                        "pick ep dividing the expert count")
    per = experts // ep
    for name, p in list(module.named_parameters(recurse=False)):
        module.register_parameter(name, nn.Parameter(p.data[ep_rank * per:(ep_rank + 1) * per].clone(),
                                                     requires_grad=p.requires_grad))
    if hasattr(module, "num_experts"):
        module.num_experts = per  # type: ignore[assignment]  # the module's own int attribute
    inner = module.forward

    def forward(*args):
        if len(args) == 1:
            return _buffer_forward(inner, args[0], ep, per, group, plain)
        if len(args) == 3 and plain and isinstance(args[0], DTensor):
            raise UserError(f"{type(module).__name__} routes dropless (hidden, top_k_index, top_k_weights): "
                            "autoplan's runtime folds only capacity-buffer experts [E, C, h] with etp=1 < tp",
                            "run the plan with etp=tp, or unfolded (omit etp)")
        if len(args) == 3:
            return _routed_forward(inner, *args, ep=ep, per=per, group=group)
        raise UserError(f"{type(module).__name__}.forward takes {len(args)} inputs; expert parallelism runs "
                        "experts called with a capacity buffer [E, C, h] or with (hidden, top_k_index, "
                        "top_k_weights)", "run with ep=1")

    module.forward = forward


def _buffer_forward(inner, x, ep: int, per: int, group, plain: bool):
    """Capacity buffer x [E, C, h] → [E, C, h], experts E/ep per ep rank (``plain``: C/tp slots
    of this tp rank sent, module docstring)."""
    local = _Local(split=1 if plain else None)
    buf = local(x)
    _, cap, h = buf.shape
    rows = per * cap
    recv = _AllToAll.apply(buf.reshape(ep * rows, h), group, [rows] * ep, [rows] * ep)
    mine = recv.view(ep, per, cap, h).transpose(0, 1).reshape(per, ep * cap, h)
    out = inner(mine) if plain else local.unwrap(inner(local.wrap(mine)))
    back = out.view(per, ep, cap, h).transpose(0, 1).reshape(ep * rows, h)
    return local.wrap(_AllToAll.apply(back, group, [rows] * ep, [rows] * ep).view(ep * per, cap, h))


def _routed_forward(inner, hidden, top_k_index, top_k_weights, *, ep: int, per: int, group):
    """Dropless dispatch: x [T, h], top-k expert ids and gate weights [T, k] → Σ_k gate · expert(x) [T, h]."""
    local = _Local()
    x, ids, gates = local(hidden), local(top_k_index), local(top_k_weights)
    tokens, k = ids.shape
    expert_of = ids.reshape(-1)
    order = torch.argsort(expert_of, stable=True)                        # choices grouped by expert
    token_of = order // k
    counts = torch.bincount(expert_of, minlength=ep * per)              # [E] choices per expert
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)             # [ep, E/ep]: per source, my experts
    send = counts.view(ep, per).sum(1).tolist()
    recv = recv_counts.view(ep, per).sum(1).tolist()
    rows = _AllToAll.apply(x[token_of], group, recv, send)
    local_ids = torch.repeat_interleave(torch.arange(per, device=x.device).repeat(ep), recv_counts)
    ones = rows.new_ones(rows.shape[0], 1)
    out = local.unwrap(inner(local.wrap(rows), local.wrap(local_ids.unsqueeze(1)), local.wrap(ones)))
    back = _AllToAll.apply(out, group, send, recv) * gates.reshape(-1)[order].unsqueeze(1)
    y = x.new_zeros(tokens, x.shape[-1]).index_add(0, token_of, back.to(x.dtype))
    return local.wrap(y)


def expert_parameter_names(model: nn.Module, blocks_path: str) -> frozenset[str]:
    """Model FQNs of the parameters of every experts module."""
    return frozenset(f"{name}.{p}" for name in find_experts(model, blocks_path)
                     for p, _ in model.get_submodule(name).named_parameters(recurse=False))


def shard_model_experts(model: nn.Module, blocks_path: str, ep: int, ep_rank: int, group,
                        plain: bool = False) -> None:
    """``shard_experts`` on every experts module of ``model`` (a pipeline stage's copy)."""
    for name in find_experts(model, blocks_path):
        shard_experts(model.get_submodule(name), ep, ep_rank, group, plain)
