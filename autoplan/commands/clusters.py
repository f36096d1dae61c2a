"""``autoplan clusters``: list the named clusters, or show one cluster (name, shorthand or file).

    autoplan clusters                      table of the bundled clusters
    autoplan clusters --json               the same as sorted JSON
    autoplan clusters gb200x576            one cluster's levels, bandwidths and latencies
    autoplan clusters h100x1024 --yaml     a complete cluster YAML to start your own file from
"""
from __future__ import annotations

import argparse
import json
from typing import Any

import topologies
from autoplan.errors import UserError
from topologies import Cluster


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "clusters", help="list the named clusters, or show one",
        description="List the named clusters, or show one cluster given by name, by the "
                    "shorthand <gpu>x<N> (e.g. h100x1024, gb200x576) or by a YAML file path.")
    p.add_argument("cluster", nargs="?", metavar="NAME_OR_PATH",
                   help="show this cluster instead of listing the named ones")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON (sorted keys) instead of a table")
    out.add_argument("--yaml", action="store_true",
                     help="print the cluster as a complete cluster YAML file (needs NAME_OR_PATH)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.cluster is None:
        if args.yaml:
            raise UserError("--yaml shows one cluster", "name it: autoplan clusters h100x1024 --yaml")
        rows = [summary(c) for c in topologies.named_clusters()]
        if args.json:
            print(json.dumps(rows, indent=2, sort_keys=True))
        else:
            _print_table(rows)
        return 0
    from autoplan.workload import load_cluster

    cluster = load_cluster(args.cluster)
    if args.yaml:
        print(topologies.dump_yaml(cluster), end="")
    elif args.json:
        print(json.dumps(details(cluster), indent=2, sort_keys=True))
    else:
        _print_details(cluster)
    return 0


def summary(cluster: Cluster) -> dict[str, Any]:
    """One row of the cluster list (units in the key names)."""
    return {
        "name": cluster.name,
        "description": cluster.description,
        "gpu": cluster.gpu.name,
        "gpus": cluster.num_gpus,
        "nodes": cluster.num_nodes,
        "gpus_per_node": cluster.gpus_per_node,
        "nvlink_domain": cluster.nvlink_domain,
        "nics_per_node": cluster.nics_per_node,
        "nic": cluster.nic,
        "nic_gbit_s": round(cluster.nic_bw * 8 / 1e9, 3),
        "fabric": cluster.fabric,
        "pods": cluster.num_pods,
        "pod_size": cluster.pod_size,
        "pod_oversubscription": cluster.pod_oversubscription,
        "peak_bf16_pflop_s": round(cluster.peak_bf16_flops / 1e15, 3),
    }


def details(cluster: Cluster) -> dict[str, Any]:
    """Every schema field of the cluster plus the derived sizes."""
    out = topologies.to_mapping(cluster)
    out.update(nodes=cluster.num_nodes, domains=cluster.num_domains, pods=cluster.num_pods,
               peak_bf16_pflop_s=round(cluster.peak_bf16_flops / 1e15, 3),
               node_network_gbyte_s=round(cluster.node_network_bw / 1e9, 3))
    return out


def _print_table(rows: list[dict[str, Any]]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Named clusters (also <gpu>x<N> or a YAML path); PFLOP/s = BF16 peak",
                  box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for header in ("name", "GPUs", "GPU", "nodes", "NVLink", "NICs/node", "pods", "PFLOP/s"):
        table.add_column(header, justify="left" if header in ("name", "GPU", "NICs/node") else "right",
                         no_wrap=True)
    for r in rows:
        pods = str(r["pods"])
        if r["pods"] > 1:
            over = r["pod_oversubscription"]
            pods = f"{r['pods']}x{r['pod_size']} {'1:1' if over == 1.0 else f'1:{over:g}'}"
        table.add_row(r["name"], str(r["gpus"]), r["gpu"], str(r["nodes"]), str(r["nvlink_domain"]),
                      f"{r['nics_per_node']}x{r['nic_gbit_s']:g}G {r['fabric']}", pods,
                      f"{r['peak_bf16_pflop_s']:,.0f}")
    Console().print(table)


def _print_details(cluster: Cluster) -> None:
    from rich.console import Console
    from rich.table import Table

    c = cluster
    g = c.gpu
    table = Table(title=f"{c.name}: {c.description}", show_header=False)
    table.add_column("field")
    table.add_column("value")
    fp8 = "-" if g.fp8_flops is None else f"{g.fp8_flops / 1e12:,.0f}"
    table.add_row("GPU", f"{g.name}: {g.bf16_flops / 1e12:,.0f} BF16 / {fp8} FP8 TFLOP/s, "
                         f"{g.hbm_bytes / 1e9:g} GB HBM at {g.hbm_bw / 1e12:g} TB/s")
    table.add_row("GPUs", f"{c.num_gpus} = {c.num_nodes} nodes x {c.gpus_per_node}")
    table.add_row("NVLink", f"domains of {c.nvlink_domain} GPUs, {g.nvlink_bw / 1e9:g} GB/s per "
                            f"direction per GPU (ring {c.nvlink_efficiency:.3f}), "
                            f"NVLS {'yes' if c.nvls else 'no'}")
    table.add_row("NICs", f"{c.nics_per_node} x {c.nic} ({c.nic_bw * 8 / 1e9:g} Gb/s, achieved "
                          f"{c.nic_achieved_bw / 1e9:.1f} GB/s) per node, {c.fabric}, "
                          f"SHARP {'yes' if c.sharp else 'no'}")
    table.add_row("rail groups", f"{c.leaf_nodes} nodes ({c.leaf_size} GPUs) per leaf group")
    over = "non-blocking" if c.pod_oversubscription == 1.0 else f"1:{c.pod_oversubscription:g}"
    table.add_row("pods", f"{c.num_pods} of {c.pod_size} GPUs, {over} above the pods")
    table.add_row("latency per step", f"launch {c.launch_latency * 1e6:g} us, NVLink "
                  f"{c.nvlink_latency * 1e6:g}, rail {c.rail_latency * 1e6:g}, spine "
                  f"{c.spine_latency * 1e6:g}, pod {c.pod_latency * 1e6:g} us")
    table.add_row("peak", f"{c.peak_bf16_flops / 1e15:,.1f} BF16 PFLOP/s")
    Console().print(table)
