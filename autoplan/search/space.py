"""The mesh part of the search space: degrees, algorithms and axis orders, under the hard rules.

A ``MeshChoice`` fixes everything but the pipeline-internal knobs (micro-batch size,
schedule, virtual stages, stage cuts, recomputation), which ``search.stages`` chooses.

Hard rule (``autoplan.rules``): every per-layer group — tp, ep, Ulysses (under USP its
sub-groups) — lies inside one NVLink domain, checked on the ranks of every group under each
axis order; a degree choice that breaks it under every order is never generated, unless
``allow_cross_domain``.  USP is generated only where Ulysses alone cannot fit the domain
(tp·cp > domain): below that, plain Ulysses does the same all-to-alls without ring hops.

Model rules: tp divides the heads (and the KV heads, or is a multiple of them), cp
divides the sequence into chunks of at least ``MIN_CP_CHUNK`` tokens, ep divides the
experts and dp, pp ≤ layers, dp divides the global batch.

``Constraints`` narrow the space further where a caller asks for the best plan under a fixed
knob (``autoplan study``: SP off, Ulysses only, FSDP only): the degrees, CP algorithms, SP
settings and recompute policies a plan may use.  The hard rules hold either way.

MoE: with tp·cp > 1, expert parallelism uses MoE parallel folding (``Plan.etp``, Megatron-Core):
ep drawn from a stage's tp·cp·dp GPUs with expert tensor parallelism 1 (each GPU holds whole
experts, the layout Megatron-Core's MoE recipes run; ``expert_layouts``).  An MoE
plan dispatches with DeepEP's hierarchical transfer (``dispatcher=deepep``: the all-to-all sends
more whenever a rank holds several of a token's experts) and overlaps its transfers with combined
1F1B wherever the schedule allows it (``ep_overlap``: pp = 1 or interleaved, and no stage fully
recomputed, which Megatron-Core refuses; ``MeshChoice.plan``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoplan.errors import UserError
from autoplan.ir import ModelInfo
from autoplan.plan import CP_ALGOS, RECOMPUTE, Plan, fully_recomputes
from autoplan.rules import respects_nvlink
from topologies.cluster import Cluster

MIN_CP_CHUNK = 1024          # tokens per cp rank below which attention chunks get too small
MAX_CP = 32                  # Llama 3 405B's 128K run used cp=16 (Dubey et al. 2024, §3.3.2); 2x that is the ceiling
ORDERS = (("tp", "cp", "ep", "dp", "pp"),     # pipeline outermost (Megatron default)
          ("tp", "cp", "ep", "pp", "dp"))     # data parallel outermost (MegaScale, Llama 3)

PARTIAL_OP = "op:N"     # Constraints.recompute: also op on the first N layers only (``stages.partial_op``)
MeshKey = tuple[int, int, int, int, int]     # (tp, cp, ep, pp, dp): a degree tuple


@dataclass(frozen=True)
class Constraints:
    """What a search may use beyond the hard rules.  A degree tuple (``tp``, ``cp``, ``pp``,
    ``dp``) lists the degrees allowed, empty for any; ``cp_algos`` binds meshes with cp > 1 (a
    cp = 1 mesh has no CP algorithm); ``sp`` binds meshes with tp > 1 (``(True,)``: SP on
    wherever there is TP; tp = 1 meshes stay allowed, they have no SP to turn on); ``recompute``
    the per-stage policies a stage may take (the weakest that fits, as without constraints),
    and ``PARTIAL_OP`` (``op:N``, not searched by default) to price, where every stage takes
    ``op``, op on the fewest layers that fit beside it (``stages.partial_op``)."""

    tp: tuple[int, ...] = ()
    cp: tuple[int, ...] = ()
    pp: tuple[int, ...] = ()
    dp: tuple[int, ...] = ()
    cp_algos: tuple[str, ...] = CP_ALGOS
    sp: tuple[bool, ...] = (True, False)
    recompute: tuple[str, ...] = RECOMPUTE

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "pp", "dp"):
            bad = [d for d in getattr(self, name) if not isinstance(d, int) or d < 1]
            if bad:
                raise UserError(f"constraint {name}={bad[0]!r}: a degree is a whole number ≥ 1",
                                f"list {name} degrees ≥ 1, or none for any")
        for name, values, known in (("cp_algos", self.cp_algos, CP_ALGOS),
                                    ("recompute", self.recompute, RECOMPUTE + (PARTIAL_OP,))):
            unknown = [v for v in values if v not in known]
            if unknown or not values:
                raise UserError(f"constraint {name}={values!r}: " + (f"unknown {unknown[0]!r}" if unknown else "empty"),
                                f"choose {name} among {', '.join(known)}")
        if not self.sp or any(not isinstance(v, bool) for v in self.sp):
            raise UserError(f"constraint sp={self.sp!r}: a tuple of True/False", "pass sp=(True,), (False,) or both")
        # the weakest policy first: a stage takes the first that fits (``stages``)
        object.__setattr__(self, "recompute", tuple(p for p in RECOMPUTE + (PARTIAL_OP,) if p in self.recompute))

    @property
    def any(self) -> bool:
        """No constraint at all (the default search)."""
        return self == Constraints()

    def allows_degrees(self, tp: int, cp: int, pp: int, dp: int) -> bool:
        return all(not allowed or d in allowed for d, allowed in ((tp, self.tp), (cp, self.cp), (pp, self.pp),
                                                                  (dp, self.dp)))

    def allows_algo(self, cp: int, cp_algo: str) -> bool:
        return cp == 1 or cp_algo in self.cp_algos

    def allows_sp(self, tp: int, sp: bool) -> bool:
        return tp == 1 or sp in self.sp

    def describe(self) -> str:
        """The constraints that bind, e.g. ``cp ∈ {2, 4}, cp_algo ∈ {ulysses}, sp off``."""
        parts = [f"{n} ∈ {{{', '.join(map(str, v))}}}" for n, v in (("tp", self.tp), ("cp", self.cp), ("pp", self.pp),
                                                                   ("dp", self.dp)) if v]
        if self.cp_algos != CP_ALGOS:
            parts.append(f"cp_algo ∈ {{{', '.join(self.cp_algos)}}}")
        if len(self.sp) == 1:
            parts.append("sp on" if self.sp[0] else "sp off")
        if self.recompute != RECOMPUTE:
            parts.append(f"recompute ∈ {{{', '.join(self.recompute)}}}")
        return ", ".join(parts) or "none"


@dataclass(frozen=True)
class MeshChoice:
    tp: int
    cp: int
    ep: int
    pp: int
    dp: int
    zero: int
    sp: bool
    cp_algo: str
    order: tuple[str, ...]
    ulysses: int = 0             # USP's explicit split (Plan.ulysses); 0: the rule's
    precision: str = "bf16"      # the linear GEMMs' precision (Plan.precision)
    etp: int | None = None       # MoE parallel folding (Plan.etp); None: ep carved out of dp

    @property
    def key(self) -> MeshKey:
        """What makes two plans different meshes (top-K returns distinct keys)."""
        return (self.tp, self.cp, self.ep, self.pp, self.dp)

    def plan(self, **inner: Any) -> Plan:
        """The plan of this mesh with the pipeline knobs ``inner``; an MoE one dispatches with
        DeepEP and runs combined 1F1B where its schedule allows (module docstring)."""
        fields: dict[str, Any] = dict(tp=self.tp, cp=self.cp, ep=self.ep, pp=self.pp, dp=self.dp, zero=self.zero,
                      sp=self.sp, cp_algo=self.cp_algo, order=self.order, ulysses=self.ulysses,
                      precision=self.precision, etp=self.etp)
        fields.update(inner)
        if self.ep > 1 and "dispatcher" not in inner:
            fields["dispatcher"] = "deepep"
        if self.ep > 1 and "ep_overlap" not in inner:
            schedule = fields.get("schedule") or ("interleaved" if (fields.get("vpp") or 1) > 1 else "1f1b")
            fields["ep_overlap"] = ((self.pp == 1 or schedule == "interleaved")
                                    and overlap_survives(fields.get("recompute", ())))
        return Plan(**fields)


def overlap_survives(recompute: tuple[str, ...]) -> bool:
    """Whether combined 1F1B can run beside these per-stage policies: no stage fully recomputed."""
    return not any(fully_recomputes(r) for r in recompute)


def recomputed(plan: Plan, recompute: tuple[str, ...]) -> Plan:
    """``plan`` with the per-stage ``recompute`` policies; combined 1F1B (``ep_overlap``) is dropped
    beside a fully recomputed stage, which Megatron-Core's overlap refuses (``fully_recomputes``)."""
    overlap = plan.ep_overlap and overlap_survives(recompute)
    return plan.replace(recompute=tuple(recompute), ep_overlap=overlap)


@dataclass(frozen=True)
class SpaceStats:
    enumerated: int          # degree combinations looked at
    broke_rules: int         # dropped by a hard rule (NVLink domain)
    generated: int           # mesh choices handed to the search


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _powers_of_two(limit: int) -> list[int]:
    out, p = [], 1
    while p <= limit:
        out.append(p)
        p *= 2
    return out


def enumerate_meshes(info: ModelInfo, num_layers: int, cluster: Cluster, *, seq: int, global_batch: int,
                     allow_cross_domain: bool = False, zero_levels: tuple[int, ...] = (0, 1, 2, 3),
                     orders: tuple[tuple[str, ...], ...] = ORDERS,
                     precisions: tuple[str, ...] = ("bf16",),
                     constraints: Constraints = Constraints()) -> tuple[list[MeshChoice], SpaceStats]:
    """Every mesh choice of ``cluster`` for the model (module docstring), at each of ``precisions``
    (a plan dimension: the same degrees, the linear GEMMs at another precision), and what the
    rules dropped."""
    n = cluster.num_gpus
    domain = cluster.nvlink_domain
    heads, kv = info.heads or 1, info.kv_heads or info.heads or 1
    experts = info.experts
    out: list[MeshChoice] = []
    enumerated = broke = 0
    for tp in divisors(n):
        if heads % tp or (kv and tp > kv and tp % kv) or (kv and tp <= kv and kv % tp):
            continue
        for cp in _powers_of_two(min(MAX_CP, n // tp)):
            if n % (tp * cp) or seq % cp or (cp > 1 and seq // cp < MIN_CP_CHUNK):
                continue
            for pp in divisors(n // (tp * cp)):
                if pp > num_layers:
                    continue
                dp = n // (tp * cp * pp)
                if global_batch % dp or not constraints.allows_degrees(tp, cp, pp, dp):
                    continue
                for ep, etp in expert_layouts(experts, tp, cp, dp):
                    for cp_algo, u in cp_splits(cp, heads // tp, spans_domains=tp * cp > domain):
                        if not constraints.allows_algo(cp, cp_algo):
                            continue
                        enumerated += 1
                        legal = _legal_orders(orders, tp, cp, ep, pp, dp, cp_algo, u, etp, experts, domain,
                                              allow_cross_domain)
                        if not legal:
                            broke += 1
                            continue
                        for sp in ((True, False) if tp > 1 and etp is None else (tp > 1,)):
                            if (sp and (seq // cp) % tp) or not constraints.allows_sp(tp, sp):
                                continue
                            for zero in (_useful_zero(zero_levels) if dp > 1 else (0,)):
                                out += [MeshChoice(tp, cp, ep, pp, dp, zero, sp, cp_algo, order, u, precision, etp)
                                        for order in legal for precision in precisions]
    return out, SpaceStats(enumerated, broke, len(out))


def expert_layouts(experts: int, tp: int, cp: int, dp: int) -> list[tuple[int, int | None]]:
    """(ep, etp) of the expert layouts of a stage's tp·cp·dp GPUs: with expert parallelism and
    tp·cp > 1, folded with etp = 1 (ep dividing tp·cp·dp: Megatron-Core's MoE recipes; the
    unfolded layout would split every expert over tp too, adding an all-gather and a
    reduce-scatter of the routed rows per GEMM pair for smaller GEMMs); otherwise ep carved out of
    dp (tp·cp = 1, where folding changes nothing, and ep = 1: the experts split over tp)."""
    if not experts:
        return [(1, None)]
    out: list[tuple[int, int | None]] = []
    for ep in divisors(experts):
        if ep > 1 and tp * cp > 1:
            if (tp * cp * dp) % ep == 0:
                out.append((ep, 1))
        elif dp % ep == 0:
            out.append((ep, None))
    return out


def _legal_orders(orders: tuple[tuple[str, ...], ...], tp: int, cp: int, ep: int, pp: int, dp: int, cp_algo: str,
                  u: int, etp: int | None, experts: int, domain: int,
                  allow_cross_domain: bool) -> list[tuple[str, ...]]:
    """The axis orders a degree choice may take: every one (pipeline or data parallel outermost)
    that Megatron-Core's folding rules allow, those whose per-layer groups stay in one NVLink
    domain unless ``allow_cross_domain``."""
    legal = list(orders if pp > 1 and dp > 1 else orders[:1])
    if etp is not None:
        legal = [o for o in legal if o[-1] == "pp" or pp == 1]
    if allow_cross_domain:
        return legal
    if cp_algo == "usp" and tp * cp <= domain:
        return []
    return [o for o in legal if respects_nvlink(Plan(tp=tp, cp=cp, ep=ep, pp=pp, dp=dp, cp_algo=cp_algo, order=o,
                                                     ulysses=u, etp=etp), experts=experts, nvlink_domain=domain)]


def cp_splits(cp: int, local_heads: int, *, spans_domains: bool) -> list[tuple[str, int]]:
    """(cp_algo, ulysses) choices of a cp degree: ring; Ulysses and USP by the rule when the heads
    on a tp rank divide by cp (as before the split was searched); and, when tp·cp spans more than
    one NVLink domain, USP at every explicit split 1 < U < cp with U dividing those heads
    (whether its groups stay in a domain is the caller's rule check)."""
    if cp == 1:
        return [("ring", 0)]
    out = [("ring", 0)] + ([("ulysses", 0), ("usp", 0)] if local_heads % cp == 0 else [])
    if spans_domains:
        out += [("usp", u) for u in divisors(cp) if 1 < u < cp and local_heads % u == 0]
    return out


def _useful_zero(levels: tuple[int, ...]) -> tuple[int, ...]:
    """ZeRO-0 is dominated by ZeRO-1 when both are allowed: a reduce-scatter of fp32 gradients
    plus an all-gather of bf16 parameters moves less than an fp32 all-reduce, and the
    optimizer states shrink by dp — no better time or memory is lost by skipping it."""
    return tuple(z for z in levels if not (z == 0 and 1 in levels))
