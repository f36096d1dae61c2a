"""The compact plan notation tables print, e.g. ``tp2·cp2·pp8·dp32 zero2 mbs2 zbv ulysses``.

It says only what is not a default, so that a plan fits a 100-column terminal; ``Plan.parse``
reads it back to the same Plan (the canonical ``key=value,…`` string is in ``--json`` and
``--wide``).  Space-separated tokens, in this order:

* the mesh: the degrees > 1 as ``<axis><degree>`` joined by ``·`` (``.`` is read too), in the
  order tp, cp, pp, dp, ep (``dp1`` when every degree is 1), then ``etp<n>`` when the plan folds
  its experts (MoE parallel folding: ``tp2·pp8·dp16·ep32·etp1``);
* ``zero<n>`` when dp > 1 (or zero ≠ 0), ``mbs<n>`` always;
* the schedule when pp > 1 (or it is not 1f1b), ``vpp<n>`` when it is not the schedule's own
  (2 for zbv/dualpipev, else 1);
* ``ulysses`` / ``usp`` when cp_algo is not ring, then ``ulysses=U`` when the plan fixes USP's split;
* the precision when not bf16 (``fp8``, ``fp8-rowwise``, ``fp8-delayed``, ``mxfp8``);
* the MoE dispatcher when not alltoall (``deepep``), ``ep-overlap`` for combined 1F1B;
* ``key=value`` for the rest, only when not the default: ``rc=`` (recompute), ``layers=`` (runs
  of equal stages as ``NxK``: ``layers=4x16-2x16``),
  ``sp=off`` (tp > 1), ``order=`` (only the axes of degree > 1 unless the degree-1 axes sit
  elsewhere than their default place; see ``complete_order``).
"""
from __future__ import annotations

import re
from typing import Any

from costmodels.pipeline import SCHEDULES as SCHEDULE_SPECS
from costmodels.pipeline import V_SCHEDULES

MESH_ORDER = ("tp", "cp", "pp", "dp", "ep")
DEFAULT_ORDER = ("tp", "cp", "ep", "dp", "pp")
SCHEDULE_WORDS = tuple(SCHEDULE_SPECS)
CP_WORDS = ("ulysses", "usp", "ring")
PRECISIONS = ("bf16", "fp8", "fp8-rowwise", "fp8-delayed", "mxfp8")   # the plan's ``precision`` values
DISPATCH_WORDS = ("alltoall", "deepep")                               # the plan's ``dispatcher`` values
OVERLAP_WORD = "ep-overlap"                                           # ``ep_overlap=on``
_AXIS_TOKEN = re.compile(r"(etp|tp|cp|pp|dp|ep)(\d+)$")
_MESH = re.compile(r"^(tp|cp|pp|dp|ep)\d+([·.](etp|tp|cp|pp|dp|ep)\d+)*$")
_KEYED = re.compile(r"(zero|mbs|vpp)(\d+)$")
_ALIASES = {"rc": "recompute"}

NOTATION_GRAMMAR = ("compact plan: space-separated tokens, "
                    "e.g. 'tp2·cp2·pp8·dp32 zero2 mbs2 zbv ulysses rc=selective'; "
                    "mesh <axis><degree> joined by '·', then zero<n>, mbs<n>, vpp<n>, a schedule "
                    f"({', '.join(SCHEDULE_WORDS)}), a cp algorithm ({', '.join(CP_WORDS)}), a precision "
                    f"({', '.join(PRECISIONS)}) and key=value pairs")


def is_compact(text: str) -> bool:
    """True when ``text`` starts with a compact mesh token (``tp2·pp8…``), not ``key=value``."""
    head = text.strip().split(None, 1)
    return bool(head) and bool(_MESH.match(head[0]))


def is_axis_token(token: str) -> bool:
    """True for one mesh axis of the compact form (``tp2``, ``dp32``)."""
    return bool(_AXIS_TOKEN.match(token))


def complete_order(given: tuple[str, ...], axes: tuple[str, ...] = DEFAULT_ORDER) -> tuple[str, ...]:
    """An axis order from a partial one: every axis left out keeps its default place (its index in
    ``axes``), the given ones fill the other places in their order.  ``(tp, pp, dp)`` → tp-cp-ep-pp-dp."""
    missing = [a for a in axes if a not in given]
    slots: list[str | None] = [a if a in missing else None for a in axes]
    rest = iter(given)
    return tuple(s if s is not None else next(rest) for s in slots)


def short_order(order: tuple[str, ...], degrees: dict[str, int]) -> tuple[str, ...]:
    """The shortest order that ``complete_order`` turns back into ``order``: the axes of degree > 1,
    or the whole order when its degree-1 axes are not in their default places."""
    kept = tuple(a for a in order if degrees[a] > 1)
    return kept if complete_order(kept) == tuple(order) else tuple(order)


def compact_tokens(plan: Any) -> tuple[str, ...]:
    """The tokens of ``plan`` in compact notation (see the module docstring)."""
    degrees = {a: getattr(plan, a) for a in MESH_ORDER}
    mesh = "·".join(f"{a}{degrees[a]}" for a in MESH_ORDER if degrees[a] > 1) or "dp1"
    if getattr(plan, "etp", None) is not None:
        mesh += f"·etp{plan.etp}"
    tokens = [mesh]
    if plan.dp > 1 or plan.zero:
        tokens.append(f"zero{plan.zero}")
    tokens.append(f"mbs{plan.mbs}")
    if plan.pp > 1 or plan.schedule != "1f1b":
        tokens.append(plan.schedule)
    if plan.vpp != (2 if plan.schedule in V_SCHEDULES else 1):
        tokens.append(f"vpp{plan.vpp}")
    if plan.cp_algo != "ring":
        tokens.append(plan.cp_algo)
    if plan.ulysses:
        tokens.append(f"ulysses={plan.ulysses}")
    if plan.precision != "bf16":
        tokens.append(plan.precision)
    if getattr(plan, "dispatcher", "alltoall") != "alltoall":
        tokens.append(plan.dispatcher)
    if getattr(plan, "ep_overlap", False):
        tokens.append(OVERLAP_WORD)
    if plan.recompute != ("none",):
        tokens.append("rc=" + "-".join(plan.recompute))
    if plan.layers:
        tokens.append("layers=" + run_length(plan.layers))
    if plan.tp > 1 and not plan.sp:
        tokens.append("sp=off")
    order = short_order(plan.order, degrees)
    if order != short_order(DEFAULT_ORDER, degrees):
        tokens.append("order=" + "-".join(order))
    return tuple(tokens)


def run_length(layers: tuple[int, ...]) -> str:
    """Layers per stage with runs of two or more as ``NxK``: (4, 4, 4, 2) → ``4x3-2``."""
    runs: list[list[int]] = []
    for n in layers:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return "-".join(f"{n}x{k}" if k > 1 else str(n) for n, k in runs)


def parse_compact(text: str, error) -> dict[str, str]:
    """Raw ``key → value`` fields of a compact plan, for ``Plan.from_fields``; ``error(problem)``
    builds the exception for a bad token."""
    raw: dict[str, str] = {}

    def put(key: str, value: str, token: str) -> None:
        if key in raw:
            raise error(f"bad plan string: '{token}' sets {key} a second time")
        raw[key] = value

    mesh, *rest = text.split()
    for part in re.split(r"[·.]", mesh):
        axis, degree = _AXIS_TOKEN.match(part).groups()  # type: ignore[union-attr]  # is_compact matched it
        put(axis, degree, part)
    for token in rest:
        keyed = _KEYED.match(token)
        if keyed:
            put(keyed.group(1), keyed.group(2), token)
        elif token in SCHEDULE_WORDS:
            put("schedule", token, token)
        elif token in CP_WORDS:
            put("cp_algo", token, token)
        elif token in PRECISIONS:
            put("precision", token, token)
        elif token in DISPATCH_WORDS:
            put("dispatcher", token, token)
        elif token == OVERLAP_WORD:
            put("ep_overlap", "on", token)
        elif "=" in token:
            key, value = token.split("=", 1)
            put(_ALIASES.get(key, key), value, token)
        else:
            raise error(f"bad plan string: '{token}' is not a compact plan token")
    return raw
