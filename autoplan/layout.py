"""Layout: the tensor-parallel placements the block ILP chose, as the search returns them.

Per block kind (and the ``@pre``/``@post`` parts), every parameter's placement on the tp axis
(``"R"``, ``"S(d)"``) and the placement of the residual stream entering the block (sequence-
sharded under SP).  A Layout travels with its Plan in ``autoplan search --json`` (field
``layout``, versioned by ``LAYOUT_VERSION``), and ``autoplan run plans.json`` /
``autoplan.apply.apply(..., placements=layout.placements())`` shard the model with it, so the
layout that was priced is the layout that runs.  A bare plan string has no Layout: apply then
derives Megatron's rule from the module graph and says so.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoplan.errors import UserError

LAYOUT_VERSION = 1


@dataclass(frozen=True)
class BlockLayout:
    kind: str                                   # block kind, or "@pre" / "@post"
    params: tuple[tuple[str, str], ...]         # (parameter name, placement), sorted by name
    stream: str = "R"                           # placement of the residual stream entering the block

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "params": dict(self.params), "stream": self.stream}


@dataclass(frozen=True)
class Layout:
    tp: int
    sp: bool
    blocks: tuple[BlockLayout, ...]
    source: str = "ilp"                         # ilp: solved by the block ILP

    def to_dict(self) -> dict[str, Any]:
        return {"version": LAYOUT_VERSION, "source": self.source, "tp": self.tp, "sp": self.sp,
                "blocks": [b.to_dict() for b in self.blocks]}

    @staticmethod
    def from_dict(d: Any) -> Layout:
        if not isinstance(d, dict) or d.get("version") != LAYOUT_VERSION:
            version = d.get("version") if isinstance(d, dict) else None
            raise UserError(f"the plan file's layout has version {version!r}, this autoplan reads {LAYOUT_VERSION}",
                            "re-run autoplan search --json with this version")
        try:
            blocks = tuple(BlockLayout(str(b["kind"]), tuple(sorted((str(k), str(v)) for k, v in b["params"].items())),
                                       str(b.get("stream", "R"))) for b in d["blocks"])
            return Layout(int(d["tp"]), bool(d["sp"]), blocks, str(d.get("source", "ilp")))
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise UserError(f"the plan file's layout is malformed ({e})",
                            "re-run autoplan search --json, or drop the layout field") from None

    def placements(self) -> dict[str, str]:
        """One mapping parameter name → placement, as ``apply(placements=...)`` takes it: block
        parameters by their name within a block, others by their full name.  Two block kinds
        that place a same-named parameter differently cannot share one mapping."""
        out: dict[str, str] = {}
        for b in self.blocks:
            for name, pl in b.params:
                if out.setdefault(name, pl) != pl:
                    raise UserError(f"the layout places {name} as {out[name]} in one block kind and {pl} in "
                                    f"{b.kind}", "run this plan without its layout (a plan string)")
        return dict(sorted(out.items()))
