"""Re-price a block's layout under other physical parameters without redoing its structural work.

Pricing a solved layout (``sharding.price_assignment``) walks the graph — reads, redistributions,
merged followers — and only then asks the ``Pricer`` for seconds, which it merely *adds up*
(with multiplicities: an op recomputed runs twice).  So each seconds field of the priced
``BlockSharding`` is a linear combination Σ cᵢ·priceᵢ of pricer calls.  ``template`` prices the
layout once with a ``SymbolicPricer`` whose answers are such combinations (``Lin``); ``evaluate``
turns a template into numbers under any real pricer — a sample's — by pricing each distinct
call once.  No sample repeats the graph walk.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from autoplan.axes import Axis
from autoplan.ir import OpGraph
from autoplan.sharding import BlockAssignment, BlockSharding, Pricer, ShardingContext, price_assignment
from autoplan.sharding.types import Gemm

Call = tuple[Any, ...]     # ("op", kind, flops, bytes, gemm) or ("coll", kind, bytes, axis)


class Lin:
    """A linear combination of pricer calls: {call: coefficient}; supports + and scalar ·."""

    __slots__ = ("terms",)

    def __init__(self, terms: dict[Call, float]):
        self.terms = terms

    def __add__(self, other: object) -> Lin:
        if isinstance(other, Lin):
            out = dict(self.terms)
            for k, v in other.terms.items():
                out[k] = out.get(k, 0.0) + v
            return Lin(out)
        if other == 0:
            return self
        raise TypeError("a priced sum may only add pricer answers")

    __radd__ = __add__

    def __mul__(self, c: float) -> Lin:
        return Lin({k: v * c for k, v in self.terms.items()})

    __rmul__ = __mul__

    def value(self, pricer: Pricer) -> float:
        """Σ coefficient · seconds under ``pricer`` (a ``sharding.Pricer``), calls in a fixed order."""
        total = 0.0
        for (what, *args), c in self.terms.items():
            total += c * (pricer.op_seconds(*args) if what == "op" else pricer.collective_seconds(*args))
        return total


class SymbolicPricer:
    """A ``sharding.Pricer`` that answers with the call itself, as a ``Lin``."""

    def op_seconds(self, kind: str, flops: float, nbytes: float, gemm: Gemm | None) -> Lin:
        return Lin({("op", kind, flops, nbytes, gemm): 1.0})

    def collective_seconds(self, kind: str, nbytes: float, axis: Axis) -> Lin:
        return Lin({("coll", kind, nbytes, axis): 1.0})


def template(graph: OpGraph, assignment: BlockAssignment, ctx: ShardingContext) -> BlockSharding:
    """``assignment`` priced under ``ctx`` with symbolic seconds (``ctx``'s own pricer unused)."""
    # a Pricer answering Lin, not float: price_assignment only adds and scales what it answers, as Lin does
    symbolic = dataclasses.replace(ctx, pricer=SymbolicPricer())  # type: ignore[arg-type]
    return price_assignment(graph, assignment, symbolic)


def evaluate(tpl: BlockSharding, pricer: Pricer) -> BlockSharding:
    """The template's seconds under ``pricer``."""
    def v(x: float | Lin) -> float:
        return x.value(pricer) if isinstance(x, Lin) else float(x)
    return dataclasses.replace(
        tpl, forward_s=v(tpl.forward_s), backward_s=v(tpl.backward_s), wgrad_s=v(tpl.wgrad_s),
        recompute_s=v(tpl.recompute_s),
        collectives=tuple(dataclasses.replace(c, seconds=v(c.seconds)) for c in tpl.collectives))
