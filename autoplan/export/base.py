"""What every exporter returns, and the plan facts they share."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoplan.plan import RECOMPUTE, Plan, partial_recompute

if TYPE_CHECKING:                  # the trace's record: importing it costs numpy, which `export --help` avoids
    from autoplan.ir import ModelInfo

ALL_LAYERS = 10 ** 9       # op:N ranks below op (all of a stage's layers) whatever N


def recompute_strength(policy: str) -> tuple[int, int]:
    """Order of memory saving: none < selective < op:1 < op:2 < … < op < full:1 < full:2 < … < full
    (an ``op:N`` is ranked after selective by its op layers alone)."""
    part = partial_recompute(policy)
    if part is None:
        return RECOMPUTE.index(policy) + (policy == "full"), 0
    head, n = part
    op = RECOMPUTE.index("op")
    return (op + 1, n) if head == "full" else (op, n - ALL_LAYERS)


@dataclass(frozen=True)
class Export:
    """An engine configuration: ``text`` to paste, ``warnings`` on what it cannot express, and for an
    engine configured by its command line alone the argument list (``-o`` writes one per line)."""

    engine: str
    text: str
    warnings: tuple[str, ...] = ()
    argv: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Architecture:
    """What an engine's model arguments need beyond the plan (0: the model has none): multi-head
    latent attention's ranks and head sizes (``zoo.mla``) and the multi-token-prediction depth."""

    kv_lora_rank: int = 0
    q_lora_rank: int = 0          # 0: full-rank query projection
    qk_head_dim: int = 0          # q/k head without its rotary slice (DeepSeek-V3: 128)
    qk_rope_dim: int = 0          # the rotary slice (64)
    v_head_dim: int = 0           # value head (128)
    mtp_layers: int = 0

    @classmethod
    def of(cls, info: ModelInfo) -> Architecture:
        """From a traced or configured model's facts (``head_dim`` there is the whole q/k head)."""
        if not info.kv_lora_rank:
            return cls(mtp_layers=info.mtp_layers)
        return cls(info.kv_lora_rank, info.q_lora_rank, info.head_dim - info.qk_rope_dim, info.qk_rope_dim,
                   info.v_head_dim or info.head_dim, info.mtp_layers)


PLAIN = Architecture()       # no latent attention, no multi-token prediction


@dataclass(frozen=True)
class Setting:
    """One engine setting: a flag or key and its value (None: a bare switch such as
    ``--sequence-parallel``)."""

    name: str
    value: object = None


@dataclass(frozen=True)
class Settings:
    """Engine settings in output order and the warnings on what they cannot express: an exporter
    makes one per part of the plan and adds them up in order."""

    items: tuple[Setting, ...] = ()
    warnings: tuple[str, ...] = ()

    def __add__(self, other: Settings) -> Settings:
        return Settings(self.items + other.items, self.warnings + other.warnings)


def uniform_recompute(plan: Plan) -> tuple[str, str | None]:
    """One recompute mode for all stages, and a warning if the plan had several.

    Engines take one policy for every stage; the strongest one in the plan keeps
    every stage within its memory estimate.  ``op:N``, which no engine runs on N layers
    only, runs as ``op`` on every layer (less memory, more recomputation), with a warning.
    """
    modes = set(plan.recompute)
    strongest = max(modes, key=recompute_strength)
    note = None if len(modes) == 1 else (f"per-stage recompute {'-'.join(plan.recompute)} is not expressible: "
                                         f"recompute={strongest} on every stage (the strongest the plan uses)")
    part = partial_recompute(strongest)
    if part is not None and part[0] == "op":      # no engine checkpoints ops of the first N layers only
        partial = (f"recompute={strongest} (op on the first {part[1]} layers of each stage) is not expressible: "
                   "op on every layer")
        return "op", partial if note is None else f"{note}; {partial}"
    return strongest, note


def stage_layers(plan: Plan, num_layers: int | None) -> tuple[int, ...] | None:
    """Transformer layers per virtual stage in pipeline order, if known."""
    if plan.layers:
        return plan.layers
    if num_layers is None:
        return None
    return plan.stage_layers(num_layers)


def default_order_warning(plan: Plan, engine: str, engine_order: tuple[str, ...]) -> str | None:
    """Warn when the plan's axis order differs from the engine's fixed one (innermost first)."""
    if plan.order == engine_order:
        return None
    return (f"order={'-'.join(plan.order)} is not expressible: {engine} lays ranks out as "
            f"{'-'.join(engine_order)} (innermost first)")
