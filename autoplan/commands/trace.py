"""``autoplan trace MODEL``: trace a model and show what it is made of.

    autoplan trace llama3-70b                       zoo name
    autoplan trace path/to/model.py --seq 4096      a model.py defining build_model()
    autoplan trace "gpt:layers=96,hidden=12288,heads=96,vocab=51200" --json

Prints parameters (embedding, each block kind x count, head), FLOPs per token
(forward + backward), the unique blocks, the ten heaviest ops, attention's
share of FLOPs at this sequence length, and the trace's time and peak memory.
"""
from __future__ import annotations

import argparse
import json

from autoplan.errors import UserError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "trace", help="trace a model into blocks and show its parameters, FLOPs and heaviest ops",
        description="Trace a model (a model.py path, a zoo name or a family spec such as "
                    "'llama:layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=128256') "
                    "on fake tensors and summarise it.")
    p.add_argument("model", metavar="MODEL", help="model.py path, zoo name or family spec")
    p.add_argument("--seq", type=int, default=2048, help="sequence length (default 2048)")
    p.add_argument("--batch", type=int, default=1, help="micro-batch size (default 1)")
    p.add_argument("--dtype", default="bf16", help="bf16 | fp16 | fp32 (default bf16)")
    p.add_argument("--json", action="store_true", help="print JSON (sorted keys) instead of tables")
    p.add_argument("--no-cache", action="store_true", help="trace again even if a cached trace exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autoplan.frontend.summary import summarize
    from autoplan.frontend.tracing import trace_with_status

    if args.seq < 2 or args.batch < 1:
        raise UserError(f"bad run size --seq {args.seq} --batch {args.batch}",
                        "use --seq >= 2 and --batch >= 1")
    graph, cached = trace_with_status(args.model, seq=args.seq, batch=args.batch, dtype=args.dtype,
                                      use_cache=not args.no_cache, timeout_s=args.trace_timeout)
    info = summarize(graph)
    info["cached"] = cached
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
    else:
        _print(info)
    return 0


def _count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f}{unit}"
    return f"{n:,.0f}"


def _print(s: dict) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console()
    p = s["params"]
    head = "tied to embedding" if p["head_tied_to_embedding"] and p["head"] == 0 else _count(p["head"])
    title = (f"{s['model']} ({s['family']}): {_count(p['total'])} parameters, "
             f"{_count(s['flops_per_token'])}FLOP per token (fwd+bwd) at seq {s['seq']}, "
             f"micro-batch {s['batch']}, {s['dtype']}")
    params = Table(title=title, box=box.SIMPLE_HEAD)
    params.add_column("part")
    params.add_column("count", justify="right")
    params.add_column("params each", justify="right")
    params.add_column("params total", justify="right")
    params.add_row("embedding (pre)", "1", _count(p["embedding"]), _count(p["embedding"]))
    for kind, b in p["blocks"].items():
        params.add_row(f"block {kind}", str(b["count"]), _count(b["each"]), _count(b["total"]))
    params.add_row("head (post)", "1", head, head)
    console.print(params)

    blocks = Table(title="Unique blocks", box=box.SIMPLE_HEAD)
    for col in ("kind", "description", "count", "layers", "params", "FLOPs/sample", "saved bytes"):
        blocks.add_column(col, justify="left" if col in ("kind", "description", "layers") else "right")
    for b in s["blocks"]:
        blocks.add_row(b["kind"], b["description"], str(b["count"]), f"{b['first']} .. {b['last']}",
                       _count(b["params"]), _count(b["flops"]), _count(b["saved_bytes"]))
    console.print(blocks)

    ops = Table(title="Heaviest ops (FLOPs summed over a block's layers)", box=box.SIMPLE_HEAD)
    for col in ("region", "op", "module", "phase", "FLOPs", "share"):
        ops.add_column(col, justify="right" if col in ("FLOPs", "share") else "left")
    for r in s["heaviest_ops"]:
        region = r["region"] if r["count"] == 1 else f"{r['region']} x{r['count']}"
        ops.add_row(region, r["op"], r["module"], r["phase"], _count(r["flops"]), f"{r['share']:.1%}")
    console.print(ops)

    cached = " (from cache)" if s.get("cached") else ""
    console.print(f"attention: {s['attention_flops_share']:.1%} of FLOPs at seq {s['seq']}")
    console.print(f"trace: {s['trace_seconds']:.1f} s, peak RSS {s['trace_peak_rss_bytes'] / 2**30:.2f} GiB"
                  f"{cached}")
    for note in s["notes"]:
        console.print(f"note: {note}")
