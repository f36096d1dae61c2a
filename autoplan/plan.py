"""Plan: one parallel training configuration, with a canonical string and JSON form.

Canonical string (every key, fixed order)::

    tp=8,pp=8,dp=16,cp=1,ep=1,vpp=3,mbs=1,schedule=interleaved,recompute=selective,
    sp=on,zero=1,cp_algo=ring,order=tp-cp-ep-dp-pp

* ``tp``, ``cp``, ``pp``, ``dp``: mesh axis degrees; ``tp·cp·pp·dp`` = GPUs.
* ``ep``: expert-parallel degree, carved out of ``dp`` (experts are sharded over
  ``ep`` of the ``dp`` ranks, Megatron-Core style), so ``ep`` divides ``dp``.
* ``etp``: optional; given, the plan uses Megatron-Core's MoE parallel folding: attention runs
  on tp·cp·dp GPUs of a stage and the experts on etp·ep·edp of the same GPUs, so
  ``tp·cp·dp = etp·ep·edp`` (``edp`` derived), ``ep`` need not divide ``dp`` and the expert
  weights have their own tensor-parallel degree ``etp`` (``autoplan.mesh``: the two rank
  layouts).  Omitted (the default), ``ep`` is carved out of ``dp`` and experts are split over
  ``tp`` as before; written in the string and the JSON only when given.
* ``dispatcher``: how an MoE layer moves tokens to the ranks of its experts (ep > 1):
  ``alltoall`` (the default: one NCCL all-to-all of every (token, expert) row, Megatron-Core's
  ``alltoall`` dispatcher, torchtitan) or ``deepep`` (hierarchical: once per target rank, once
  per target NVLink domain across the network, then NVLink inside it: DeepEP's normal kernels,
  Megatron-Core's ``flex`` dispatcher with DeepEP or HybridEP; ``costmodels.dispatch``).
* ``ep_overlap``: on: the dispatch and combine of one micro-batch run under the compute of the
  other micro-batch of a merged forward-backward pair (Megatron-Core's combined 1F1B,
  ``--overlap-moe-expert-parallel-comm``; ep > 1, with pp > 1 only interleaved).  ``dispatcher``
  and ``ep_overlap`` are written only when not the default.
* ``vpp``: model chunks (virtual stages) per pipeline rank; 2 for V schedules.
* ``mbs``: micro-batch size in sequences.
* ``schedule``: gpipe | 1f1b | interleaved | zb-h1 | zb-h2 | zbv | dualpipev.
* ``recompute``: none | selective | op | full | full:N | op:N, or one value per pipeline stage
  joined by ``-`` (``full-full-selective-none``).  ``selective`` is Megatron's (the attention
  core), ``op`` torchtitan's selective op checkpointing (every second matmul and the
  element-wise ops between them recomputed), ``full:N`` full recomputation of the first N
  layers of every virtual stage (Megatron ``--recompute-method block --recompute-num-layers N``),
  ``op:N`` op checkpointing of the first N layers of every virtual stage, the rest keep everything
  (the memory of a stage between none and op, in steps of one layer).
* ``layers``: optional layers per virtual stage, in pipeline order, joined by
  ``-`` (``layers=10-11-11-10``); ``NxK`` repeats N layers for K stages in a row
  (``layers=4x16-2x16`` = sixteen stages of 4 then sixteen of 2); omitted means an even split.
* ``sp``: sequence parallelism on the tp axis (on|off).
* ``zero``: 0 (plain DP), 1 (optimizer state sharded = distributed optimizer),
  2 (+ gradients), 3 (+ parameters = FSDP).
* ``cp_algo``: ring | ulysses | usp (how the cp axis shards attention).
* ``ulysses``: optional USP split, the Ulysses degree U of the cp axis (ring = cp/U); ``ring=R``
  reads as ``ulysses=cp/R``.  Omitted: the rule's split (``rules.ulysses_and_ring``: the largest
  U whose groups stay in one NVLink domain).  Given without ``cp_algo``, it sets it (ring when
  U = 1, ulysses when U = cp, else usp); under ring or ulysses it must be 1 or cp.
* ``order``: mesh axes from innermost (fastest-varying rank, closest on the
  hardware) to outermost.
* ``precision``: the linear layers' GEMM precision: bf16 (default) | fp8 (tensorwise dynamic
  scaling) | fp8-rowwise | fp8-delayed | mxfp8 (1x32 blocks, Blackwell); attention, norms, the
  LM head and the embedding stay bf16 (``costmodels.precision``).  Written in the string and
  the JSON only when not bf16, so a bf16 plan reads as it always did.

Omitted keys take defaults (``dp`` = GPUs / (tp·cp·pp), ``sp=on`` when tp > 1,
``zero=1`` when dp > 1, ``schedule=1f1b``/``interleaved`` by ``vpp``).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Any

from autoplan.axes import AXES
from autoplan.errors import UserError, short_repr
from autoplan.plan_notation import DEFAULT_ORDER as NOTATION_ORDER
from autoplan.plan_notation import (
    NOTATION_GRAMMAR,
    PRECISIONS,
    compact_tokens,
    complete_order,
    is_compact,
    parse_compact,
    run_length,
)
from costmodels.pipeline import SCHEDULES as SCHEDULE_SPECS
from costmodels.pipeline import V_SCHEDULES, ScheduleSpec, stage_rank

SCHEMA_VERSION = 2
FOLDED_SCHEMA_VERSION = 3    # a folded plan's JSON (``etp``): an autoplan that reads only 1-2 refuses it
DISPATCH_SCHEMA_VERSION = 4  # a plan naming its MoE dispatcher or EP overlap: 1-3 readers refuse it
READABLE_SCHEMA_VERSIONS = (1, 2, 3, 4)  # 1: no ``ulysses`` field (the rule's split); 3: ``etp``; 4: dispatch
DISPATCHERS = ("alltoall", "deepep")
SCHEDULES = tuple(SCHEDULE_SPECS)           # the registry's schedules, in the order plans list them
RECOMPUTE = ("none", "selective", "op", "full")   # the searched policies, weakest → strongest memory saving
RECOMPUTE_SYNTAX = "none, selective, op, full, full:N or op:N (N ≥ 1 layers per virtual stage)"
CP_ALGOS = ("ring", "ulysses", "usp")
FP8_PRECISIONS = PRECISIONS[1:4]          # on any GPU with FP8 tensor cores (Hopper, Blackwell)
BLOCK_PRECISIONS = ("mxfp8",)             # microscaling formats: Blackwell's tensor cores only
PRECISION_CHOICES = "auto, or a comma-separated list of: " + ", ".join(PRECISIONS)
# Schedules an engine runs with fewer micro-batches than stages: GPipe, and 1F1B as Megatron-LM
# (warm-up min(pp - rank - 1, m)) and DeepSpeed's pipeline engine run it — it degenerates to
# GPipe's order.  (torch.distributed.pipelining's Schedule1F1B refuses it: ``apply`` says so.)
FEWER_MICROBATCHES_THAN_STAGES = ("gpipe", "1f1b")
DEFAULT_ORDER = NOTATION_ORDER
KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "schedule", "recompute", "layers",
        "sp", "zero", "cp_algo", "ulysses", "order", "precision", "dispatcher", "ep_overlap")
_INT_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "zero", "ulysses")

PLAN_GRAMMAR = ("a plan is comma-separated key=value pairs, e.g. "
                "'tp=8,pp=8,dp=16,vpp=3,mbs=1,schedule=interleaved,recompute=selective,sp=on,zero=1'; "
                f"keys: {', '.join(KEYS)}")


@lru_cache(maxsize=1024)
def _rank_stages(pp: int, vpp: int, placement: str) -> tuple[tuple[int, ...], ...]:
    """Per pipeline rank, the virtual stages it holds in model order (the search asks per plan)."""
    ranks: list[list[int]] = [[] for _ in range(pp)]
    for s in range(pp * vpp):
        ranks[stage_rank(s, pp, placement)].append(s)
    return tuple(tuple(r) for r in ranks)


@lru_cache(maxsize=1024)
def expand_layers(text: str) -> tuple[int, ...]:
    """``"4x2-3"`` → (4, 4, 3): items joined by ``-``, each ``N`` or ``NxK`` (N layers, K stages).
    Raises ValueError on anything else."""
    out: list[int] = []
    for item in text.split("-"):
        n, _, k = item.strip().partition("x")
        if not (n.isascii() and n.isdigit()) or (k and not (k.isascii() and k.isdigit() and int(k) >= 1)):
            raise ValueError(f"{item!r}: N or NxK with N ≥ 0 layers and K ≥ 1 stages, in ASCII digits")
        out += [int(n)] * (int(k) if k else 1)
    return tuple(out)


@lru_cache(maxsize=1024)
def _even_layers(num_layers: int, chunks: int) -> tuple[int, ...]:
    """The even split: ``num_layers // chunks`` each, the remainder one each to the middle
    chunks (the first and last stages carry the embedding and the head)."""
    base, extra = divmod(num_layers, chunks)
    mid = set(sorted(range(chunks), key=lambda i: (abs(i - (chunks - 1) / 2), i))[:extra])
    return tuple(base + (1 if i in mid else 0) for i in range(chunks))


@dataclass(frozen=True)
class Plan:
    """One plan; validated on construction, so every Plan that exists is well-formed.

    Fields left at ``None`` take their defaults in ``__post_init__`` (one set of defaults for
    ``Plan(...)`` and ``Plan.parse``): ``sp`` on when tp > 1, ``zero=1`` when dp > 1 (else 0),
    ``schedule`` interleaved when vpp > 1 (else 1f1b), ``vpp=2`` for the V schedules (else 1).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    # vpp, schedule, sp and zero are None only until __post_init__ fills in their default: typed
    # as what every Plan holds, their None default is the one place that is not
    vpp: int = None                            # type: ignore[assignment]
    mbs: int = 1
    schedule: str = None                       # type: ignore[assignment]
    recompute: tuple[str, ...] = ("none",)     # one entry, or one per pipeline stage
    layers: tuple[int, ...] = ()               # layers per virtual stage; () = even split
    sp: bool = None                            # type: ignore[assignment]
    zero: int = None                           # type: ignore[assignment]
    cp_algo: str = "ring"
    order: tuple[str, ...] = DEFAULT_ORDER
    precision: str = "bf16"
    ulysses: int = 0                           # USP's Ulysses degree; 0 = the rule's split
    etp: int | None = None                     # None: not folded (ep carved out of dp, experts split over tp)
    dispatcher: str = "alltoall"               # MoE token dispatch (DISPATCHERS)
    ep_overlap: bool = False                   # combined 1F1B: EP transfers under the paired micro-batch's compute

    def __post_init__(self) -> None:
        for key in ("tp", "pp", "dp", "cp", "ep", "mbs") + (("vpp",) if self.vpp is not None else ()) \
                + (("etp",) if self.etp is not None else ()):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"bad plan: {key}={value!r} must be an integer ≥ 1", PLAN_GRAMMAR)
        if self.schedule is None:
            self._set("schedule", "interleaved" if (self.vpp or 1) > 1 else "1f1b")
        if self.schedule not in SCHEDULES:
            raise UserError(f"bad plan: schedule={self.schedule!r}", f"schedule is one of: {', '.join(SCHEDULES)}")
        if self.vpp is None:
            self._set("vpp", 2 if self.schedule in V_SCHEDULES else 1)
        self._set("sp", bool(self.tp > 1 if self.sp is None else self.sp) and self.tp > 1)
        if self.zero is None:
            self._set("zero", 1 if self.dp > 1 else 0)
        self._set("recompute", tuple(self.recompute))
        self._set("layers", tuple(self.layers))
        self._set("order", tuple(self.order))
        if self.cp_algo in ("ring", "ulysses") and self.ulysses == (1 if self.cp_algo == "ring" else self.cp):
            self._set("ulysses", 0)           # the algorithm's only split: nothing to record
        self.check_shape()

    def _set(self, key: str, value: Any) -> None:
        object.__setattr__(self, key, value)   # frozen: only __post_init__ fills in defaults

    # --- derived -----------------------------------------------------------
    @property
    def num_gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def folded(self) -> bool:
        """The plan uses MoE parallel folding (``etp`` given)."""
        return self.etp is not None

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel degree of the expert weights: ``etp`` when folded, else ``tp``."""
        return self.tp if self.etp is None else self.etp

    @property
    def edp(self) -> int:
        """Expert data-parallel degree: the replicas of one expert's weights in a stage
        (``tp·cp·dp / (etp·ep)`` when folded; ``cp·dp / ep`` otherwise)."""
        if self.etp is None:
            return self.cp * self.dp // self.ep
        return self.tp * self.cp * self.dp // (self.etp * self.ep)

    @property
    def model_parallel(self) -> int:
        return self.tp * self.cp * self.pp

    @property
    def schedule_spec(self) -> ScheduleSpec:
        """The schedule's registry entry (``costmodels.pipeline.SCHEDULES``): placement, split backward, …"""
        return SCHEDULE_SPECS[self.schedule]

    def stage_rank(self, stage: int) -> int:
        """Pipeline rank holding virtual stage ``stage`` (0 … pp·vpp−1, model order): looped
        (stage mod pp), or V-shaped for zbv/dualpipev (rank r holds r and 2·pp−1−r)."""
        return stage_rank(stage, self.pp, SCHEDULE_SPECS[self.schedule].placement)

    def stages_of_rank(self, pp_rank: int) -> tuple[int, ...]:
        """Virtual stages pipeline rank ``pp_rank`` holds, in model order."""
        return _rank_stages(self.pp, self.vpp, SCHEDULE_SPECS[self.schedule].placement)[pp_rank]

    def recompute_of_stage(self, stage: int) -> str:
        return self.recompute[0] if len(self.recompute) == 1 else self.recompute[stage]

    def microbatches(self, global_batch: int) -> int:
        """Micro-batches per pipeline per step: B / (dp · mbs)."""
        return global_batch // (self.dp * self.mbs)

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Layers of each virtual stage in pipeline order (pp·vpp entries)."""
        if self.layers:
            return self.layers
        return _even_layers(num_layers, self.pp * self.vpp)

    # --- string form -------------------------------------------------------
    def __str__(self) -> str:
        return self.to_string()

    def to_string(self, *, runs: bool = False) -> str:
        """The canonical plan string (JSON, caches); ``runs``: equal stages of ``layers=`` as runs
        (``0-1x126-0``, what a person reads; ``Plan.parse`` reads both)."""
        parts = [f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}", f"cp={self.cp}", f"ep={self.ep}"]
        if self.etp is not None:
            parts.append(f"etp={self.etp}")
        parts += [f"vpp={self.vpp}", f"mbs={self.mbs}", f"schedule={self.schedule}",
                 f"recompute={'-'.join(self.recompute)}"]
        if self.layers:
            parts.append("layers=" + (run_length(self.layers) if runs else "-".join(str(n) for n in self.layers)))
        parts += [f"sp={'on' if self.sp else 'off'}", f"zero={self.zero}", f"cp_algo={self.cp_algo}"]
        if self.ulysses:
            parts.append(f"ulysses={self.ulysses}")
        parts.append("order=" + "-".join(self.order))
        if self.precision != "bf16":
            parts.append(f"precision={self.precision}")
        if self.dispatcher != "alltoall":
            parts.append(f"dispatcher={self.dispatcher}")
        if self.ep_overlap:
            parts.append("ep_overlap=on")
        return ",".join(parts)

    def to_compact(self) -> str:
        """The compact notation tables print (``tp2·cp2·pp8·dp32 zero2 mbs2 zbv``; see
        ``autoplan.plan_notation``); ``Plan.parse`` reads it back to this plan."""
        return " ".join(compact_tokens(self))

    def compact_tokens(self) -> tuple[str, ...]:
        """``to_compact`` as tokens (one per mesh axis, then one per setting), for tables that
        mark what differs between plans."""
        mesh, *rest = compact_tokens(self)
        return tuple(mesh.split("·")) + tuple(rest)

    @staticmethod
    def parse(text: str, num_gpus: int | None = None) -> Plan:
        """Parse a plan string, canonical (``tp=8,pp=8,…``) or compact (``tp8·pp8·dp16 mbs1``);
        ``num_gpus`` fills in ``dp`` when omitted.

        Raises UserError naming the bad key or value.
        """
        if is_compact(text):
            raw = parse_compact(text, lambda problem: UserError(problem, NOTATION_GRAMMAR))
            for key in raw:
                if key not in KEYS:
                    raise UserError(f"bad plan string: unknown key '{key}'", NOTATION_GRAMMAR)
            return Plan.from_fields(raw, num_gpus)
        raw = {}                                   # typed by parse_compact's dict[str, str] above
        for item in (p.strip() for p in text.strip().split(",")):
            if not item:
                continue
            if "=" not in item:
                raise UserError(f"bad plan string {text!r}: '{item}' is not key=value", PLAN_GRAMMAR)
            key, value = (s.strip() for s in item.split("=", 1))
            if key not in KEYS and key != "ring":
                raise UserError(f"bad plan string: unknown key '{key}'", PLAN_GRAMMAR)
            if key in raw:
                raise UserError(f"bad plan string: key '{key}' given twice", PLAN_GRAMMAR)
            raw[key] = value
        return Plan.from_fields(raw, num_gpus)

    @property
    def ulysses_ring(self) -> tuple[int, int] | None:
        """(Ulysses, ring) degrees the plan fixes, None where the rule picks them (usp without
        ``ulysses``; ``rules.ulysses_and_ring`` answers for every plan)."""
        if self.cp_algo == "ring":
            return 1, self.cp
        if self.cp_algo == "ulysses":
            return self.cp, 1
        return (self.ulysses, self.cp // self.ulysses) if self.ulysses else None

    @staticmethod
    def from_fields(raw: dict[str, Any], num_gpus: int | None = None) -> Plan:
        kw: dict[str, Any] = {}
        for key in _INT_KEYS:
            if key in raw:
                kw[key] = _integer(key, raw[key])
        if "sp" in raw:
            kw["sp"] = _switch("sp", raw["sp"])
        if "schedule" in raw:
            kw["schedule"] = _choice("schedule", raw["schedule"], SCHEDULES)
        if "cp_algo" in raw:
            kw["cp_algo"] = _choice("cp_algo", raw["cp_algo"], CP_ALGOS)
        if "precision" in raw:
            kw["precision"] = _choice("precision", raw["precision"], PRECISIONS)
        if "dispatcher" in raw:
            kw["dispatcher"] = _choice("dispatcher", raw["dispatcher"], DISPATCHERS)
        if "ep_overlap" in raw:
            kw["ep_overlap"] = _switch("ep_overlap", raw["ep_overlap"])
        _usp_split(raw, kw)
        if "recompute" in raw:
            rc = raw["recompute"]
            values = tuple(rc) if isinstance(rc, (list, tuple)) else tuple(str(rc).split("-"))
            kw["recompute"] = tuple(str(v).strip().lower() for v in values)
        if "layers" in raw:
            lv = raw["layers"]
            try:
                kw["layers"] = tuple(lv) if isinstance(lv, (list, tuple)) else expand_layers(str(lv))
            except ValueError:
                raise UserError(f"bad plan string: layers={lv!r}", "give layers per stage joined by '-', e.g. "
                                "layers=10-11-11-10, or NxK for N layers in K stages, e.g. layers=4x16-2x16") from None
        # defaults that depend on other keys
        tp, cp, pp = kw.get("tp", 1), kw.get("cp", 1), kw.get("pp", 1)
        for key, value in (("tp", tp), ("cp", cp), ("pp", pp)):
            if value < 1:                       # before dividing by them
                raise UserError(f"bad plan: {key}={value} must be an integer ≥ 1", PLAN_GRAMMAR)
        if "dp" not in kw:
            if num_gpus is None:
                kw["dp"] = 1
            else:
                mp = tp * cp * pp
                if num_gpus % mp:
                    raise UserError(f"plan does not fit the cluster: tp·cp·pp = {tp}·{cp}·{pp} = {mp} "
                                    f"does not divide {num_gpus} GPUs",
                                    "choose degrees whose product divides the GPU count")
                kw["dp"] = num_gpus // mp
        if "order" in raw:
            kw["order"] = _order(raw["order"], kw)
        return Plan(**kw)

    # --- JSON --------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["recompute"] = list(self.recompute)
        d["layers"] = list(self.layers)
        d["order"] = list(self.order)
        if self.precision == "bf16":
            del d["precision"]         # the default is left out: a bf16 plan's JSON is what it always was
        if self.etp is None:
            del d["etp"]               # likewise an unfolded plan's
        if self.dispatcher == "alltoall":
            del d["dispatcher"]        # and the default dispatch
        if not self.ep_overlap:
            del d["ep_overlap"]
        return d

    def to_json(self) -> str:
        version = SCHEMA_VERSION if self.etp is None else FOLDED_SCHEMA_VERSION
        if self.dispatcher != "alltoall" or self.ep_overlap:
            version = DISPATCH_SCHEMA_VERSION
        return json.dumps({"schema_version": version, "plan": self.to_dict(),
                           "plan_string": self.to_string()}, sort_keys=True)

    @staticmethod
    def from_json(text: str | dict) -> Plan:
        from topologies.strict_load import DuplicateKey, load_json

        try:
            d = load_json(text) if isinstance(text, str) else text
        except DuplicateKey as e:
            raise UserError(f"plan JSON: {e}", "keep one of them") from None
        if "plan" in d:
            version = d.get("schema_version")
            if type(version) is not int or version not in READABLE_SCHEMA_VERSIONS:   # true == 1; not here
                raise UserError(f"plan JSON has schema_version {version}, this autoplan reads {SCHEMA_VERSION}",
                                "re-export the plan with this version of autoplan")
            d = d["plan"]
        return Plan.from_fields(dict(d))

    def replace(self, **changes: Any) -> Plan:
        return replace(self, **changes)

    # --- validation --------------------------------------------------------
    def check_shape(self) -> None:
        """Checks that need no model or cluster (run on construction)."""
        if self.zero not in (0, 1, 2, 3):
            raise UserError(f"bad plan: zero={self.zero}", "zero must be 0, 1, 2 or 3")
        if self.etp is None and self.dp % self.ep:
            raise UserError(f"bad plan: ep={self.ep} does not divide dp={self.dp}",
                            "expert parallelism is carved out of data parallelism: pick ep | dp, "
                            "or fold it over tp·cp·dp with etp= (MoE parallel folding)")
        if self.etp is not None:
            self.check_folding()
        self.check_dispatch()
        if self.pp == 1 and self.vpp > 1:
            raise UserError(f"bad plan: vpp={self.vpp} virtual stages need pipeline parallelism (pp > 1)",
                            "set vpp=1 or pp > 1")
        if self.schedule in V_SCHEDULES and self.vpp != 2:
            raise UserError(f"bad plan: schedule={self.schedule} places 2 chunks per rank in a V, got vpp={self.vpp}",
                            "set vpp=2")
        if self.schedule == "interleaved" and self.vpp < 2:
            raise UserError("bad plan: schedule=interleaved needs vpp ≥ 2", "set vpp=2 or more, or schedule=1f1b")
        if self.schedule not in ("interleaved",) + V_SCHEDULES and self.vpp != 1:
            raise UserError(f"bad plan: vpp={self.vpp} needs schedule=interleaved (or zbv/dualpipev with vpp=2)",
                            "set schedule=interleaved or vpp=1")
        if len(self.recompute) not in (1, self.pp):
            raise UserError(f"bad plan: recompute lists {len(self.recompute)} values for pp={self.pp} stages",
                            "give one value, or one per pipeline stage")
        if self.layers and len(self.layers) != self.pp * self.vpp:
            raise UserError(f"bad plan: layers lists {len(self.layers)} stages, pp·vpp = {self.pp * self.vpp}",
                            "give layers per virtual stage, pp·vpp entries")
        for v in self.recompute:
            if v not in RECOMPUTE and partial_recompute(v) is None:
                raise UserError(f"bad plan: recompute={v!r}", f"recompute is one of: {RECOMPUTE_SYNTAX}")
        if self.cp_algo not in CP_ALGOS:
            raise UserError(f"bad plan: cp_algo={self.cp_algo!r}", f"cp_algo is one of: {', '.join(CP_ALGOS)}")
        if self.precision not in PRECISIONS:
            raise UserError(f"bad plan: precision={self.precision!r}", f"precision is one of: {', '.join(PRECISIONS)}")
        self._check_split()
        if sorted(self.order) != sorted(AXES):
            raise UserError(f"bad plan: order={'-'.join(self.order)} must list each of {', '.join(AXES)} once",
                            "e.g. order=tp-cp-ep-dp-pp (innermost first)")
        inner = self.layers[1:-1]
        if any(not isinstance(n, int) or n < 0 for n in self.layers) or any(n < 1 for n in inner):
            raise UserError(f"bad plan: layers={'-'.join(map(str, self.layers))} gives a virtual stage no layer",
                            "every virtual stage but the first (embedding) and the last (head and loss) "
                            "needs at least one layer")

    def _check_split(self) -> None:
        u = self.ulysses
        if not isinstance(u, int) or isinstance(u, bool) or u < 0 or (u and self.cp % u):
            raise UserError(f"bad plan: ulysses={u!r} does not divide cp={self.cp}",
                            "give the Ulysses degree U of USP's split as a divisor of cp (ring = cp/U)")
        if u and self.cp_algo != "usp":
            raise UserError(f"bad plan: ulysses={u} with cp_algo={self.cp_algo} (which means ulysses="
                            f"{1 if self.cp_algo == 'ring' else self.cp})", "set cp_algo=usp, or leave ulysses out")

    def check_dispatch(self) -> None:
        """``dispatcher`` and ``ep_overlap`` need expert parallelism; combined 1F1B pairs a forward
        with a backward of another micro-batch, which Megatron-Core does with pp = 1 or under the
        interleaved schedule (Megatron-Bridge's overlap validation: "if PP > 1, set
        virtual_pipeline_model_parallel_size")."""
        if self.dispatcher not in DISPATCHERS:
            raise UserError(f"bad plan: dispatcher={self.dispatcher!r}",
                            f"dispatcher is one of: {', '.join(DISPATCHERS)}")
        if self.ep == 1 and (self.dispatcher != "alltoall" or self.ep_overlap):
            raise UserError("bad plan: dispatcher and ep_overlap apply to expert parallelism (ep > 1)",
                            "leave them out, or set ep > 1")
        if self.ep_overlap and self.pp > 1 and self.schedule != "interleaved":
            raise UserError(f"bad plan: ep_overlap=on with pp={self.pp} needs schedule=interleaved "
                            f"(got {self.schedule})", "set vpp ≥ 2, or leave ep_overlap out")

    def check_folding(self) -> None:
        """Megatron-Core's rules for MoE parallel folding (megatron/core/parallel_state.py at
        NVIDIA/Megatron-LM d98e8a64, ``initialize_model_parallel``): L880-884, the world size is a
        multiple of etp·ep·pp, i.e. etp·ep divides a stage's tp·cp·dp GPUs; L897-901, the rank
        order puts pp outermost, or pp = 1, or edp = dp (with L903-906, the attention and the
        expert layouts' pp groups are the same: ``autoplan.mesh``)."""
        stage = self.tp * self.cp * self.dp
        if stage % (self.etp * self.ep):          # type: ignore[operator]  # folded: etp is set
            raise UserError(f"bad plan: etp·ep = {self.etp}·{self.ep} does not divide a stage's "
                            f"tp·cp·dp = {self.tp}·{self.cp}·{self.dp} = {stage} GPUs",
                            "MoE parallel folding runs the experts on etp·ep·edp of those GPUs: "
                            "pick etp·ep dividing tp·cp·dp")
        if not (self.order[-1] == "pp" or self.pp == 1 or self.edp == self.dp):
            raise UserError(f"bad plan: order={'-'.join(self.order)} with etp={self.etp}: the expert data-"
                            f"parallel size edp={self.edp} differs from dp={self.dp}, which Megatron-Core "
                            "allows only with pp outermost", "put pp last in order (tp-cp-ep-dp-pp)")
        attention, expert = self.layout_sizes(expert=False), self.layout_sizes(expert=True)
        if self.pp > 1 and _pp_stride(self.order, attention) != _pp_stride(self.order, expert):
            raise UserError(f"bad plan: order={'-'.join(self.order)} with etp={self.etp} gives the attention and "
                            "the expert layouts different pipeline groups, which Megatron-Core refuses",
                            "put pp last in order (tp-cp-ep-dp-pp)")

    def layout_sizes(self, *, expert: bool) -> dict[str, int]:
        """Axis sizes of one rank layout (``autoplan.mesh``): unfolded, the one mesh (ep carved out
        of dp); folded, the attention layout (tp, cp, dp, pp; ep of size 1) or the expert layout
        (etp on the tp axis, ep, edp on the dp axis, pp; cp of size 1), as Megatron-Core's two
        RankGenerators (parallel_state.py L859-868 and L886-895) build them."""
        if self.etp is None:
            return {"tp": self.tp, "cp": self.cp, "ep": self.ep, "dp": self.dp // self.ep, "pp": self.pp}
        if expert:
            return {"tp": self.etp, "cp": 1, "ep": self.ep, "dp": self.edp, "pp": self.pp}
        return {"tp": self.tp, "cp": self.cp, "ep": 1, "dp": self.dp, "pp": self.pp}

    def check_batch(self, global_batch: int) -> None:
        """The global batch splits into dp · mbs-sequence micro-batches; UserError if not."""
        if global_batch % (self.dp * self.mbs):
            raise UserError(f"bad plan: global batch {global_batch} is not divisible into dp·mbs = "
                            f"{self.dp}·{self.mbs} = {self.dp * self.mbs} micro-batches",
                            "change --global-batch, mbs or dp")

    def check_layers(self, num_layers: int) -> None:
        """Every virtual stage gets a layer and explicit cuts add up; UserError if not."""
        chunks = self.pp * self.vpp
        if chunks - (self.layers[:1] == (0,)) - (self.layers[-1:] == (0,)) > num_layers:
            raise UserError(f"bad plan: pp·vpp = {chunks} stages for only {num_layers} layers",
                            "reduce pp or vpp")
        if self.layers and sum(self.layers) != num_layers:
            raise UserError(f"bad plan: layers={'-'.join(map(str, self.layers))} sums to {sum(self.layers)}, "
                            f"the model has {num_layers}", "make the per-stage layer counts add up")

    def check_precision(self, gpu: str, supported: tuple[str, ...]) -> None:
        """The GPU kind runs the plan's precision (``supported``: ``GPUSpec.precisions``: FP8
        needs FP8 tensor cores, Hopper on; MXFP8 Blackwell's block-scaled ones); UserError if not."""
        if self.precision in supported:
            return
        need = "block-scaled FP8 tensor cores (Blackwell)" if self.precision in BLOCK_PRECISIONS else \
            "FP8 tensor cores (Hopper or Blackwell)"
        raise UserError(f"bad plan: precision={self.precision} needs {need}, which {gpu} lacks",
                        f"on {gpu} use precision {' or '.join(supported)}")

    def validate(self, *, num_gpus: int, num_layers: int, heads: int, kv_heads: int = 0,
                 experts: int = 0, seq: int, global_batch: int) -> None:
        """Checks against a model, a cluster and run parameters; UserError names the conflict."""
        self.check_shape()
        if self.num_gpus != num_gpus:
            raise UserError(f"bad plan: tp·cp·pp·dp = {self.tp}·{self.cp}·{self.pp}·{self.dp} = {self.num_gpus}, "
                            f"but the cluster has {num_gpus} GPUs",
                            f"omit dp to let autoplan set it to {num_gpus}/(tp·cp·pp)")
        if heads and heads % self.tp:
            raise UserError(f"bad plan: tp={self.tp} does not divide the {heads} attention heads",
                            "pick tp dividing the head count")
        if kv_heads and (self.tp % kv_heads if self.tp > kv_heads else kv_heads % self.tp):   # tp=4, 6 KV heads: 1.5
            raise UserError(f"bad plan: tp={self.tp} neither divides nor is a multiple of {kv_heads} KV heads",
                            "pick tp dividing the KV-head count (or a multiple of it)")
        split = self.ulysses_ring
        if split and heads and (heads // min(self.tp, heads)) % split[0]:
            raise UserError(f"bad plan: Ulysses over {split[0]} ranks needs the {heads // min(self.tp, heads)} "
                            f"attention heads per tp rank to divide by {split[0]}",
                            "pick a Ulysses degree dividing heads/tp, or more ring (ulysses=U with smaller U)")
        if seq % self.cp:
            raise UserError(f"bad plan: cp={self.cp} does not divide the sequence length {seq}",
                            "pick cp dividing the sequence length")
        if self.ep > 1 and not experts:
            raise UserError(f"bad plan: ep={self.ep} but the model has no experts", "set ep=1")
        if experts and experts % self.ep:
            raise UserError(f"bad plan: ep={self.ep} does not divide the {experts} experts",
                            "pick ep dividing the expert count")
        self.check_batch(global_batch)
        m = self.microbatches(global_batch)
        self.check_layers(num_layers)
        if self.schedule == "interleaved" and m % self.pp:
            raise UserError(f"bad plan: the interleaved schedule needs micro-batches ({m}) divisible by pp={self.pp}",
                            "change the global batch, mbs or pp")
        if self.pp > 1 and m < self.pp and self.schedule not in FEWER_MICROBATCHES_THAN_STAGES:
            raise UserError(f"bad plan: {m} micro-batches cannot fill {self.pp} pipeline stages",
                            "raise the global batch or lower pp/mbs")
        if self.pp > 1:
            need = SCHEDULE_SPECS[self.schedule].min_microbatches(self.pp)
            if m < need:
                raise UserError(f"bad plan: schedule={self.schedule} needs at least {need} micro-batches on "
                                f"pp={self.pp}, the plan has {m}",
                                f"raise the global batch to ≥ {need * self.dp * self.mbs} sequences, or lower pp/mbs")


def _order(value: Any, degrees: dict[str, Any]) -> tuple[str, ...]:
    """An ``order`` value as all five axes: an axis of degree 1 may be left out (it has no
    place on the hardware to choose) and keeps its default place (``complete_order``)."""
    order = tuple(value) if isinstance(value, (list, tuple)) else tuple(str(value).split("-"))
    example = "e.g. order=tp-cp-ep-dp-pp (innermost first; axes of degree 1 may be left out)"
    if any(a not in AXES for a in order) or len(set(order)) != len(order):
        raise UserError(f"bad plan string: order={'-'.join(order)} must list axes among "
                        f"{', '.join(AXES)}, each at most once", example)
    left_out = [a for a in AXES if a not in order and degrees.get(a, 1) > 1]
    if left_out:
        raise UserError(f"bad plan string: order={'-'.join(order)} leaves out "
                        + ", ".join(f"{a} (degree {degrees[a]})" for a in left_out),
                        "list every axis of degree > 1 in order; " + example)
    return complete_order(order, AXES)
def _usp_split(raw: dict[str, Any], kw: dict[str, Any]) -> None:
    """``ulysses=U`` and/or ``ring=R`` into ``kw["ulysses"]`` (and ``cp_algo`` when not given)."""
    if "ring" not in raw:
        if "ulysses" in kw and "cp_algo" not in kw:
            u, cp = kw["ulysses"], kw.get("cp", 1)
            kw["cp_algo"] = "ring" if u == 1 else "ulysses" if u == cp else "usp"
        return
    try:
        ring = int(raw["ring"])
    except (TypeError, ValueError):
        raise UserError(f"bad plan string: ring={raw['ring']!r} is not an integer", PLAN_GRAMMAR) from None
    cp = kw.get("cp", 1)
    if ring < 1 or cp % ring or ("ulysses" in kw and kw["ulysses"] * ring != cp):
        raise UserError(f"bad plan string: ring={ring} with cp={cp}" + (f", ulysses={kw['ulysses']}" if "ulysses" in kw
                        else ""), "ulysses·ring must equal cp")
    kw.setdefault("ulysses", cp // ring)
    if "cp_algo" not in kw:
        kw["cp_algo"] = "ring" if ring == cp else "ulysses" if ring == 1 else "usp"


def _pp_stride(order: tuple[str, ...], sizes: dict[str, int]) -> int:
    """The rank stride of pp: the product of the sizes of the axes inside it in ``order``."""
    out = 1
    for axis in order[:order.index("pp")]:
        out *= sizes[axis]
    return out


def recompute_layers(policy: str) -> int | None:
    """N of a ``full:N`` policy (layers fully recomputed per virtual stage), None otherwise."""
    part = partial_recompute(policy)
    return part[1] if part is not None and part[0] == "full" else None


PARTIAL_RECOMPUTE = ("full", "op")     # the policies a ``policy:N`` applies to the first N layers only


def partial_recompute(policy: str) -> tuple[str, int] | None:
    """(policy, N) of a ``full:N`` or ``op:N`` policy (that policy on the first N layers of each
    virtual stage, none on the rest), None otherwise."""
    head, _, count = policy.partition(":")
    if head not in PARTIAL_RECOMPUTE or not count.isascii() or not count.isdigit() or int(count) < 1:
        return None
    return head, int(count)


def recompute_head(policy: str) -> str:
    """The policy a stage's recomputed layers run: ``op`` of ``op:N``, ``full`` of ``full:N``, else itself."""
    part = partial_recompute(policy)
    return policy if part is None else part[0]


def fully_recomputes(policy: str) -> bool:
    """Whether ``policy`` recomputes whole layers as Megatron-LM runs it (``--recompute-granularity
    full``: full, full:N, and op or op:N, which it lacks).  Megatron-Core's combined 1F1B EP overlap
    refuses it (TransformerConfig), so such a plan is not priced with ``ep_overlap``."""
    return recompute_head(policy) in ("op", "full")


def _integer(key: str, value: Any) -> int:
    """A plan degree: an int, or a string of ASCII digits (``int`` also reads ``𝟐``, ``2.9`` and ``True``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("+-").isascii() and value.strip().lstrip("+-").isdigit():
        return int(value.strip())
    raise UserError(f"bad plan string: {key}={short_repr(value)} is not an integer", PLAN_GRAMMAR)


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> str:
    v = str(value).strip().lower()
    if v not in allowed:
        raise UserError(f"bad plan string: {key}={value!r}", f"{key} is one of: {', '.join(allowed)}")
    return v


def search_precisions(spec: str, gpu: str, supported: tuple[str, ...]) -> tuple[str, ...]:
    """The precisions a search tries (``SearchOptions.precisions``, the first screened first) from
    ``--precision``: a comma-separated list, each run by the GPU kind (``supported``:
    ``GPUSpec.precisions``), or ``auto``: the GPU's default low-precision recipe, then bf16 —
    MXFP8 where the tensor cores scale 1x32 blocks (Blackwell), else tensorwise FP8 (Hopper:
    Transformer Engine's and torchao's default recipe), bf16 alone without FP8 tensor cores.
    The other FP8 recipes trade cast traffic for numerics, not speed: name them to search them."""
    if spec == "auto":
        low = next((p for p in ("mxfp8", "fp8") if p in supported), None)
        return (low, "bf16") if low else ("bf16",)
    names = tuple(dict.fromkeys(p.strip() for p in spec.split(",") if p.strip()))
    unknown = [p for p in names if p not in PRECISIONS]
    if unknown or not names:
        raise UserError(f"--precision {short_repr(spec)}: unknown precision", f"use {PRECISION_CHOICES}")
    lacking = [p for p in names if p not in supported]
    if lacking:
        raise UserError(f"--precision {lacking[0]}: {gpu} has no tensor cores for it",
                        f"on {gpu} use --precision auto or one of: {', '.join(supported)}")
    return names


def _switch(key: str, value: Any) -> bool:
    """An on/off field (``sp``, ``ep_overlap``): on|off, true|false or 1|0."""
    v = str(value).lower()
    if v not in ("on", "off", "true", "false", "1", "0"):
        raise UserError(f"bad plan string: {key}={value!r}", f"use {key}=on or {key}=off")
    return v in ("on", "true", "1")
