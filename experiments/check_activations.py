"""Saved activations of traced, sharded blocks against Korthikanti et al. 2022, Table 2.

Korthikanti's formulas count the bytes one transformer layer keeps from forward to backward
(16-bit activations, 1-byte dropout masks, eager attention with its s×s scores, 4h GeLU MLP;
``costmodels.memory.korthikanti_layer_bytes``).  This script traces the 22B GPT block of their
Table 5 (h = 6144, a = 64, s = 2048, eager attention, dropout), lets the block ILP shard it at
t = 8 on an A100 node under each (SP, recompute) setting the table lists, and compares the
``saved_bytes`` the estimator prices with the formula.

    python experiments/check_activations.py          # the table and the largest error
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import topologies  # noqa: E402
from autoplan.cost.estimator import Estimator  # noqa: E402
from autoplan.frontend import trace  # noqa: E402
from autoplan.mesh import Mesh  # noqa: E402
from autoplan.plan import Plan  # noqa: E402
from costmodels.memory import korthikanti_layer_bytes  # noqa: E402

MODEL = "gpt:layers=2,hidden=6144,heads=64,vocab=51200,attention=eager"
S, B, H, A, T = 2048, 1, 6144, 64, 8
SETTINGS = ((False, "none"), (True, "none"), (False, "selective"), (True, "selective"), (False, "full"),
            (True, "full"))


@dataclass(frozen=True)
class Row:
    sp: bool
    recompute: str
    traced_bytes: float          # saved bytes per layer of the sharded traced block, one GPU
    formula_bytes: float         # Korthikanti Table 2

    @property
    def error(self) -> float:
        return self.traced_bytes / self.formula_bytes - 1


def rows() -> list[Row]:
    """Each Table 2 setting at t = 8: the traced block's saved bytes beside the formula's."""
    model = trace(MODEL, seq=S)
    est = Estimator(model, topologies.load("selene"))
    kind = model.blocks[0].kind
    out = []
    for sp, recompute in SETTINGS:
        plan = Plan(tp=T, sp=sp)
        bs = est.layouts.sharding(kind, est.graph(kind), plan, recompute, Mesh.of(plan))
        out.append(Row(sp, recompute, bs.saved_bytes,
                       korthikanti_layer_bytes(s=S, b=B, h=H, a=A, t=T, sp=sp, recompute=recompute)))
    return out


def main() -> int:
    table = rows()
    print(f"{'SP':<5} {'recompute':<10} {'traced MiB':>11} {'Korthikanti MiB':>16} {'error':>7}")
    for r in table:
        print(f"{'on' if r.sp else 'off':<5} {r.recompute:<10} {r.traced_bytes / 2**20:>11.2f} "
              f"{r.formula_bytes / 2**20:>16.2f} {r.error:>+7.1%}")
    print(f"largest error {max(abs(r.error) for r in table):.1%} over {len(table)} settings "
          f"(22B GPT block, t={T}, s={S}, eager attention)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
