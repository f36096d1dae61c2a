"""What the pricing commands share: the workload arguments, the cost model's options (one flag per
``EstimateOptions`` field: ``add_estimate_args`` / ``estimate_options_from``), the band arguments
and the rich tables of an estimate."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from autoplan.commands.choices import (
    ATTENTION_KERNELS,
    BACKENDS,
    DEFAULT_GLOBAL_BATCH,
    DEFAULT_MARGIN_GIB,
    DEFAULT_SAMPLES,
    DEFAULT_SEQ,
    ESTIMATE_DEFAULTS,
    FP8_ENGINES,
    FP8_RECOMPUTES,
    GRAD_SYNCS,
    KERNELS,
    LOSS_KERNELS,
    STATE_PRECISION_NAMES,
)

if TYPE_CHECKING:
    from autoplan.cost import EstimateOptions


def add_workload_args(p: argparse.ArgumentParser, batch_note: str = "") -> None:
    """MODEL, --cluster, --seq and --global-batch: what every pricing command is about."""
    p.add_argument("model", metavar="MODEL", help="zoo name, family spec or model.py")
    p.add_argument("--cluster", required=True, help="cluster name, <gpu>x<N> or YAML path")
    p.add_argument("--seq", type=int, default=DEFAULT_SEQ, help=f"sequence length (default {DEFAULT_SEQ})")
    p.add_argument("--global-batch", type=int, default=DEFAULT_GLOBAL_BATCH,
                   help=f"sequences per optimizer step (default {DEFAULT_GLOBAL_BATCH}{batch_note})")


def _add_engine_args(g: argparse._ArgumentGroup, default: argparse.Namespace) -> None:
    """The flags for what the training engine runs (kernels, FP8, overlap, pipeline engine)."""
    g.add_argument("--kernels", choices=KERNELS, default=default.kernels,
                   help="the engine's kernels where they keep other activations than the traced eager ops: "
                        f"megatron-core's fused SwiGLU keeps only its input (default: {default.kernels})")
    g.add_argument("--attention-kernel", choices=ATTENTION_KERNELS, default=default.attention_kernel,
                   help="the flash-attention kernel the engine runs, priced at its published throughput (FA3 "
                        "paper, H100): fa2, cudnn (Transformer Engine's fused attention), fa3; profile: the "
                        f"compute profile's fitted attention (default {default.attention_kernel})")
    g.add_argument("--loss-kernel", choices=LOSS_KERNELS, default=default.loss_kernel,
                   help="what computes the LM loss: eager, the traced F.cross_entropy on fp32 logits (fp32 "
                        "log-softmax saved, fp32 gradients); fused, one softmax-cross-entropy kernel on the bf16 "
                        "logits that keeps them and writes their bf16 gradient (flash-attn's xentropy, "
                        "llm-foundry's fused_crossentropy, Liger); not with --kernels megatron-core, whose loss "
                        f"is its own (default {default.loss_kernel})")
    g.add_argument("--fp8-engine", choices=FP8_ENGINES, default=default.fp8_engine,
                   help="what runs an FP8 plan's GEMMs: transformer-engine keeps FP8 linear inputs and cached "
                        "FP8 weight copies; torchao (torchtitan's float8) keeps bf16 inputs and no copies "
                        f"(default {default.fp8_engine})")
    g.add_argument("--fp8-recompute", choices=FP8_RECOMPUTES, default=default.fp8_recompute,
                   help="what a recomputed layer of an FP8 plan reruns in: fp8 where the checkpoint re-enters "
                        "Transformer Engine's FP8 context (TE's and Megatron's checkpoints); bf16 where a torch "
                        "checkpoint reruns it outside fp8_autocast, so its recompute and backward run in bf16 "
                        f"(Composer before Apr 2024) (default {default.fp8_recompute})")
    g.add_argument("--fp8-params", action="store_true",
                   help="FP8 parameters (Megatron --fp8-param-gather): no bf16 weight beside the FP8 copies, "
                        "1-byte parameter all-gather")
    g.add_argument("--tp-comm-overlap", action="store_true",
                   help="the engine overlaps sequence-parallel all-gathers and reduce-scatters with the GEMMs "
                        "beside them (Megatron-Core + Transformer Engine userbuffers, --tp-comm-overlap)")
    g.add_argument("--post-validation", action="store_true",
                   help="Zero Bubble's optimizer post-validation: each pipeline rank steps its optimizer when its "
                        "own backward ends, checks validated after (the sail-sg Megatron fork); the pipeline "
                        "costs its steady step instead of its makespan (off: Megatron-LM, torchtitan)")
    g.add_argument("--wgrad-store", action="store_true",
                   help="a split backward (zb-h1, zb-h2, zbv, ...) as Megatron's WeightGradStore runs it (the "
                        "sail-sg fork): B frees every activation but the linears' inputs, kept with their output "
                        "gradients for W (off: torch pipelining, whose B keeps the autograd graph until W)")


def add_estimate_args(p: argparse.ArgumentParser, *, rules: bool = False) -> None:
    """A flag for every option of the cost model (``EstimateOptions``), its default the record's;
    ``estimate_options_from`` reads them back.  ``rules``: the command enforces the hard rules (the
    search), which ``--allow-cross-domain`` lifts; elsewhere a rule break is reported, not avoided."""
    default = argparse.Namespace(**ESTIMATE_DEFAULTS)      # EstimateOptions()'s, without importing the cost model
    g = p.add_argument_group("pricing", "how the cost model prices every plan (EstimateOptions)")
    g.add_argument("--profile", metavar="PATH", help="compute profile YAML (default: the GPU's, costmodels/profiles)")
    g.add_argument("--no-overlap-grad-reduce", action="store_true",
                   help="do not overlap the data-parallel gradient reduction with backward (2021-era Megatron)")
    if rules:
        g.add_argument("--allow-cross-domain", action="store_true",
                       help="let TP/EP/Ulysses groups leave the NVLink domain (off: a hard rule)")
    g.add_argument("--solver", choices=BACKENDS, default=default.solver,
                   help=f"block ILP backend (default {default.solver})")
    g.add_argument("--time-limit", type=float, default=default.time_limit_s, metavar="S",
                   help="seconds per block ILP; on time-out the best solution and its gap are used "
                        f"(default {default.time_limit_s:g})")
    g.add_argument("--fsdp-prefetch", type=int, default=default.fsdp_prefetch, metavar="N",
                   help="ZeRO-3: FSDP units gathered ahead of the one computing "
                        f"(default {default.fsdp_prefetch}, FSDP2's implicit prefetch)")
    g.add_argument("--fsdp-reshard", choices=("on", "off"), default=None,
                   help="ZeRO-3: reshard parameters after forward (default: on at pp=1, off under PP, as torchtitan)")
    g.add_argument("--fsdp-grad-sync", choices=GRAD_SYNCS, default=None,
                   help="ZeRO-2/3: reduce-scatter gradients every micro-batch (sharded fp32 accumulation) or once "
                        "per step (unsharded fp32 accumulation under no-sync); default: microbatch at pp=1, "
                        "step under PP, as FSDP2 under torch pipelining")
    g.add_argument("--grad-reduce-bytes", type=float, default=default.grad_reduce_bytes, metavar="B",
                   help="bytes per gradient element reduced over data parallelism: 4 for fp32 (Megatron's main "
                        "grads, FSDP2's reduce_dtype), 2 where the engine reduces 16-bit gradients (DeepSpeed fp16) "
                        f"(default {default.grad_reduce_bytes:g})")
    g.add_argument("--state-precision", choices=STATE_PRECISION_NAMES, default=default.state_precision,
                   help="zero 0/1: the engine's parameter, gradient and optimizer state dtypes (costmodels/memory.py; "
                        f"default {default.state_precision}: bf16 weights, fp32 grads, masters and moments)")
    _add_engine_args(g, default)
    add_margin_arg(g)
    g.add_argument("--params", metavar="PATH",
                   help="YAML of parameter multipliers the point model runs under (a perturbation, e.g. "
                        "`nic_efficiency: 0.8`; names in costmodels/uncertainty.yaml)")
    g.add_argument("--exact", action="store_true",
                   help="price by the reference path: every pipeline step simulated event by event, every "
                        "schedule variant and recompute policy priced (the same numbers, slower: for checking)")


def estimate_options_from(args: argparse.Namespace, hbm_bytes: float) -> EstimateOptions:
    """The ``EstimateOptions`` of ``add_estimate_args``' flags (the margin checked against ``hbm_bytes``)."""
    from autoplan.cost import EstimateOptions
    from autoplan.cost.params import NOMINAL, load_override

    return EstimateOptions(
        overlap_grad_reduce=not args.no_overlap_grad_reduce,
        allow_cross_domain=getattr(args, "allow_cross_domain", False),
        profile=check_yaml_file(args.profile, "--profile") if args.profile else None, solver=args.solver,
        time_limit_s=args.time_limit,
        fsdp_prefetch=args.fsdp_prefetch,
        fsdp_reshard_after_forward=None if args.fsdp_reshard is None else args.fsdp_reshard == "on",
        fsdp_grad_sync=args.fsdp_grad_sync, memory_margin_gib=memory_margin(args, hbm_bytes),
        grad_reduce_bytes=args.grad_reduce_bytes, state_precision=args.state_precision, kernels=args.kernels,
        attention_kernel=args.attention_kernel, loss_kernel=args.loss_kernel,
        fp8_engine=args.fp8_engine, fp8_recompute=args.fp8_recompute, fp8_params=args.fp8_params,
        tp_comm_overlap=args.tp_comm_overlap,
        post_validation=args.post_validation, wgrad_store=args.wgrad_store,
        params=load_override(check_yaml_file(args.params, "--params")) if args.params else NOMINAL,
        exact=args.exact)


def check_yaml_file(path: str, flag: str) -> str:
    """``path`` if it is a readable UTF-8 YAML file without a key given twice in one mapping (YAML
    keeps the last silently), else a UserError naming the flag; for loaders that do not check."""
    import yaml

    from autoplan.errors import UserError, short_repr
    from topologies.strict_load import DuplicateKey, load_yaml

    fix = (f"pass {flag} PATH to a YAML file of {{parameter: multiplier}}, e.g. `nic_efficiency: 0.8`"
           if flag == "--params" else f"pass {flag} PATH to a compute profile YAML (costmodels/profiles)")
    try:
        with open(path, "rb") as f:
            load_yaml(f.read().decode("utf-8"))
    except DuplicateKey as e:
        raise UserError(f"{flag} {path}: {e}", "keep one of them") from None
    except OSError as e:
        raise UserError(f"cannot read {flag} {path}: {e.strerror or e}", fix) from None
    except UnicodeDecodeError:
        raise UserError(f"{flag} {path} is not UTF-8 text", fix) from None
    except (yaml.YAMLError, RecursionError) as e:
        raise UserError(f"{flag} {path} is not valid YAML: {short_repr(str(e))}", fix) from None
    return path


def add_margin_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--memory-margin: the HBM per GPU a plan must leave free."""
    p.add_argument("--memory-margin", type=float, default=DEFAULT_MARGIN_GIB, metavar="GIB",
                   help=f"GiB of HBM per GPU a plan must leave free for the CUDA context, NCCL buffers and "
                        f"allocator fragmentation (default {DEFAULT_MARGIN_GIB:g}); fits = peak ≤ HBM − margin")


def memory_margin(args: argparse.Namespace, hbm_bytes: float) -> float:
    """The --memory-margin value, checked: 0 ≤ margin < HBM (UserError otherwise)."""
    from autoplan.errors import UserError

    margin, hbm_gib = args.memory_margin, hbm_bytes / 2 ** 30
    if not 0.0 <= margin < hbm_gib:
        raise UserError(f"--memory-margin {margin:g} GiB is outside 0 … {hbm_gib:.1f} GiB (the GPU's HBM)",
                        "pass a margin in GiB of at least 0 and below the HBM per GPU, e.g. --memory-margin 4")
    return float(margin)


def add_band_args(p: argparse.ArgumentParser) -> None:
    """--samples and --seed: the uncertainty bands a pricing command reports (the parameters the
    point model runs under, ``--params``, are an estimate option: ``add_estimate_args``)."""
    p.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, metavar="N",
                   help="paired samples of the uncertain parameters for the p10/p50/p90 band "
                        f"(default {DEFAULT_SAMPLES}; 0: none)")
    p.add_argument("--seed", type=int, default=0, help="seed of those samples (default 0)")


def band_text(fields: dict | None) -> str:
    """'p10–p90' of a band's JSON fields, e.g. '3.950–4.410 s'; '' without a band."""
    from autoplan.explain.units import seconds

    if not fields:
        return ""
    low, high = seconds(fields["step_time_s_p10"]), seconds(fields["step_time_s_p90"])
    unit = low.rsplit(" ", 1)[-1]
    if high.endswith(" " + unit):               # one unit for both ends: "3.95–4.41 s"
        low = low[:-len(unit) - 1]
    return f"{low}–{high}"


def wide_console(min_width: int = 0):
    """A rich Console as wide as the terminal (``COLUMNS`` where set); when stdout is not a
    terminal (a pipe, a file), 200 columns wide so that tables are not wrapped at 80 and the
    output does not depend on the environment; at least ``min_width`` columns in any case
    (``--wide`` tables)."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    return console if console.width >= min_width else Console(width=min_width)


def run_header(graph, cluster, global_batch: int) -> str:
    """The lines above a pricing table: model, cluster and run size, then the hardware.  Token
    models state their sequence length; other inputs (images, features) the positions per sample
    their blocks see, since ``--seq`` does not reach them, and the batch in samples."""
    head = f"[bold]{graph.model.name}[/bold] on {cluster.name}, "
    if graph.model.token_inputs:
        head += f"seq {graph.seq_len:,}, global batch {global_batch:,}"
    else:
        head += (f"{graph.sample_positions:,} positions per sample (not token ids: --seq does not apply), "
                 f"global batch {global_batch:,} samples")
    return head + f"\n[dim]{cluster.describe()}[/dim]"


def print_estimate(console, plan, est, title: str = "", band: dict | None = None) -> None:
    """The plan, its headline numbers (and its band's JSON fields) and its primitive placement as rich tables."""
    from rich import box
    from rich.table import Table

    from autoplan.explain.audit import shown
    from autoplan.explain.units import AXIS_NAMES, KIND_NAMES, count, percent, seconds, size

    console.print(f"{title + ': ' if title else ''}[bold cyan]{plan.to_string(runs=True)}[/bold cyan]")
    head = Table(box=box.SIMPLE_HEAD, show_header=True)
    banded = ("step p10/p50/p90", "MFU p90/p50/p10") if band else ()
    for col in ("step", *banded, f"{est.throughput_unit}/s", "MFU", "HFU", "memory GiB", "fits", "bubble", "comm",
                "comm exposed"):
        head.add_column(col, justify="right")
    cells = (" / ".join(f"{band[f'step_time_s_{q}']:.3f}" for q in ("p10", "p50", "p90")),
             " / ".join(percent(band[f"mfu_{q}"]) for q in ("p90", "p50", "p10"))) if band else ()
    head.add_row(seconds(est.step_time_s), *cells, f"{est.throughput:,.0f}", percent(est.mfu), percent(est.hfu),
                 f"{est.memory_gib:.1f} / {est.memory_limit_gib:.1f}", "yes" if est.fits else "[red]no[/red]",
                 percent(est.bubble_fraction), seconds(est.comm_time_s), seconds(est.comm_exposed_s))
    console.print(head)
    console.print(f"memory: peak {est.memory_gib:.1f} GiB per GPU, limit {est.memory_limit_gib:.1f} GiB = "
                  f"{est.hbm_gib:.1f} GiB HBM − {est.memory_margin_gib:g} GiB margin (--memory-margin)")
    prims = Table(title="Primitive placement (per step, busiest pipeline rank)", box=box.SIMPLE_HEAD)
    for col in ("primitive", "axis", "group", "span", "calls/step", "bytes/call", "time/step", "exposed"):
        prims.add_column(col, justify="right" if col in ("group", "calls/step", "bytes/call", "time/step",
                                                         "exposed") else "left")
    for p in shown(est.primitives):
        prims.add_row(KIND_NAMES.get(p.kind, p.kind), AXIS_NAMES.get(p.traffic, p.traffic), str(p.group_size), p.span,
                      count(p.calls_per_step), size(p.bytes_per_call), seconds(p.time_s), seconds(p.exposed_s))
    console.print(prims)
    for v in est.violations:
        console.print(f"[red]violation[/red] {v.rule}: {v.text}")
