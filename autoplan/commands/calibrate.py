"""``autoplan calibrate``: measure this GPU and write a compute profile the cost model loads.

    autoplan calibrate                         time the full plan (~845 GEMMs, 60 attention kernels)
    autoplan calibrate --quick                 a subset, under a minute
    autoplan calibrate --out costmodels/profiles/h100.yaml
    autoplan calibrate --gpu h100              divide by the h100 catalog peaks (default: device name)
    autoplan calibrate --from h100-calibrated.yaml   refit stored measurements; needs no GPU

The profile holds the fitted ``ComputeProfile`` fields (GEMM curve, attention and HBM fractions,
per-kernel overhead; ``fusion`` is kept from the shipped profile of that GPU kind) and, under
``measurements``, every raw time.  Use it with ``--profile PATH`` elsewhere.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING

import yaml

import topologies
from autoplan.calibrate.device import catalog_gpu_name, cuda_device_name
from autoplan.calibrate.plan import measurement_plan
from autoplan.errors import UserError
from topologies.strict_load import DuplicateKey, load_yaml

if TYPE_CHECKING:      # numpy: imported where a profile is fitted, not to parse the command line
    from costmodels.compute import ComputeProfile
    from costmodels.profile_fit import FitResult, Measurements


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calibrate", help="measure GEMM, attention and HBM efficiency on this GPU; write a profile",
        description="Time bf16 GEMMs, flash attention (forward and backward) and HBM copies on the "
                    "local GPU, fit the compute cost model's efficiency parameters, and write them "
                    "with the raw measurements to a profile YAML (use it with --profile).")
    p.add_argument("--out", metavar="PATH",
                   help="profile to write, ending in .yaml (default: ./<gpu>-calibrated.yaml)")
    p.add_argument("--gpu", metavar="NAME",
                   help="catalog GPU kind whose peak FLOP/s and HBM bandwidth the times are divided "
                        "by (default: recognised from the device name)")
    p.add_argument("--quick", action="store_true", help="time fewer shapes (under a minute on a GPU)")
    p.add_argument("--from", dest="from_path", metavar="PATH",
                   help="refit the measurements stored in PATH (a profile written by calibrate) "
                        "instead of measuring; needs no GPU")
    p.add_argument("--json", action="store_true",
                   help="print the fitted profile and fit quality as JSON (sorted keys)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    gpu = _catalog_kind(args.gpu) if args.gpu else None
    if args.out is not None:
        _check_out(args.out)                 # before minutes of measuring
    if args.from_path:
        measurements, file_gpu = read_measurements(args.from_path)
        gpu = gpu or file_gpu or catalog_gpu_name(measurements.device)
        if gpu is None:
            raise UserError(f"{args.from_path} does not say which GPU kind it measured",
                            fix=f"pass --gpu, one of: {', '.join(topologies.gpu_names())}")
        out = _out_path(args.out, gpu)
    else:
        device = cuda_device_name()
        if device is None:
            raise UserError("no CUDA GPU found: autoplan calibrate measures the local GPU",
                            fix="run it on a machine with an NVIDIA GPU; the shipped profiles in "
                                "costmodels/profiles come from published figures (A100: fitted to published runs), "
                                "or refit stored measurements with --from PATH")
        gpu = gpu or catalog_gpu_name(device)
        if gpu is None:
            raise UserError(f"cannot tell which catalog GPU kind '{device}' is",
                            fix=f"pass --gpu, one of: {', '.join(topologies.gpu_names())}")
        out = _out_path(args.out, gpu)
        measurements = _measure(args.quick, quiet=args.json)
    from costmodels.profile_fit import profile_yaml

    result, shipped = fit(measurements, gpu, name=os.path.basename(out)[: -len(".yaml")])
    with open(out, "w") as f:
        f.write(profile_yaml(result.profile, gpu, measurements, comment=_comment(measurements, gpu)))
    if args.json:
        summary = result.summary()
        summary.update(gpu=gpu, out=out, shipped_profile=_fields(shipped))
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        _print_table(result, shipped, gpu, out)
    return 0


def fit(measurements: Measurements, gpu: str, *, name: str) -> tuple[FitResult, ComputeProfile]:
    """Fit ``measurements`` against the catalog peaks of ``gpu``; also return the shipped profile."""
    from costmodels.compute import load_profile
    from costmodels.profile_fit import fit_profile

    spec = topologies.gpu_spec(gpu)
    shipped = load_profile(gpu)
    source = (f"autoplan calibrate on {measurements.device} ({measurements.software}): "
              f"{len(measurements.gemm)} GEMMs, {len(measurements.attention)} "
              f"{measurements.attention_kernel} attention kernels (causal; FLOPs counted at full s^2), "
              f"{len(measurements.copy)} copies, "
              f"{len(measurements.tiny)} tiny kernels; fusion from the shipped {shipped.name} profile")
    try:
        result = fit_profile(measurements, name=name, peak_flops=spec.bf16_flops, hbm_bw=spec.hbm_bw,
                             fusion=shipped.fusion, source=source)
    except ValueError as err:
        raise UserError(f"cannot fit a profile: {err}",
                        fix="measure again with autoplan calibrate") from None
    return result, shipped


def read_measurements(path: str) -> tuple[Measurements, str | None]:
    """The ``measurements`` (and ``gpu``, if present) of a profile YAML written by calibrate."""
    from costmodels.profile_fit import measurements_from_mapping

    try:
        with open(path) as f:
            data = load_yaml(f.read())
    except DuplicateKey as err:
        raise UserError(f"{path}: {err}", fix="keep one of them") from None
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror}",
                        fix="pass a profile written by autoplan calibrate") from None
    except yaml.YAMLError as err:
        raise UserError(f"{path} is not valid YAML: {err}",
                        fix="pass a profile written by autoplan calibrate") from None
    if not isinstance(data, dict) or "measurements" not in data:
        raise UserError(f"{path} has no 'measurements'",
                        fix="pass a profile written by autoplan calibrate (shipped profiles hold no "
                            "measurements)")
    try:
        measurements = measurements_from_mapping(data["measurements"])
    except ValueError as err:
        raise UserError(f"{path}: {err}", fix="pass a profile written by autoplan calibrate") from None
    gpu = data.get("gpu")
    return measurements, None if gpu is None else _catalog_kind(str(gpu))


def _catalog_kind(name: str) -> str:
    """The canonical catalog kind for a ``--gpu`` name or alias; ``UserError`` if unknown."""
    try:
        return topologies.gpu_spec(name).name
    except topologies.TopologyError as err:
        raise UserError(err.problem, err.fix) from None


def _out_path(out: str | None, gpu: str) -> str:
    """``--out``, or ``./<gpu>-calibrated.yaml``; checked."""
    path = out or f"{gpu}-calibrated.yaml"
    _check_out(path)
    return path


def _check_out(path: str) -> None:
    """``--out`` must be a .yaml file in an existing directory (checked before minutes of measuring)."""
    if not path.endswith(".yaml"):
        raise UserError(f"--out {path} does not end in .yaml", fix="name the profile NAME.yaml")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError(f"--out {path}: directory {folder} does not exist",
                        fix="create it or pick another path")
    if os.path.isdir(path):
        raise UserError(f"--out {path} is a directory", fix="name a file: DIR/NAME.yaml")


def _measure(quick: bool, *, quiet: bool) -> Measurements:
    """Time the plan on the current CUDA device, with a progress bar on stderr unless ``quiet``."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from autoplan.calibrate.measure import measure

    plan = measurement_plan(quick)
    with Progress(TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), disable=quiet) as progress:
        task = progress.add_task("starting", total=None)

        def on_step(done: int, total: int, label: str) -> None:
            progress.update(task, completed=done, total=total, description=label)

        return measure(plan, device="cuda", on_step=on_step)


def _comment(m: Measurements, gpu: str) -> str:
    return (f"Compute profile measured by `autoplan calibrate` on {m.device}\n"
            f"({m.software}), divided by the catalog peaks of '{gpu}' (topologies/gpus.yaml).\n"
            f"Load it with --profile PATH.  'measurements' holds the raw seconds per call the fit used\n"
            f"(load_profile ignores it); refit with: autoplan calibrate --from PATH")


def _fields(profile: ComputeProfile) -> dict[str, object]:
    return {k: v for k, v in vars(profile).items() if k not in ("name", "source")}


def _print_table(result: FitResult, shipped: ComputeProfile, gpu: str, out: str) -> None:
    from rich.console import Console
    from rich.table import Table

    p = result.profile
    hbm_bw = topologies.gpu_spec(gpu).hbm_bw
    masks = ", ".join(f"{k} {v:.3f}" for k, v in sorted(result.attention_fractions.items()))
    rows = (
        ("gemm_peak_fraction", p.gemm_peak_fraction, shipped.gemm_peak_fraction,
         f"fit to {result.gemm_samples} GEMMs (rms log error {result.gemm_rms_log_error:.3f})"),
        ("gemm_half_dim", p.gemm_half_dim, shipped.gemm_half_dim, "same fit"),
        ("attention_fwd_fraction", p.attention_fwd_fraction, shipped.attention_fwd_fraction,
         "median, causal, seq >= 4096, FLOPs at full s^2"),
        ("attention_bwd_fraction", p.attention_bwd_fraction, shipped.attention_bwd_fraction,
         "same, backward"),
        ("memory_fraction", p.memory_fraction, shipped.memory_fraction,
         f"copy {result.copy_bandwidth / 1e9:,.0f} GB/s of {hbm_bw / 1e9:,.0f}"),
        ("overhead_s", p.overhead_s, shipped.overhead_s, "median tiny-kernel time"),
        ("fusion", p.fusion, shipped.fusion, "kept from the shipped profile (a software property)"),
    )
    table = Table(title=f"Compute profile for {gpu}, written to {out}")
    for header in ("parameter", "measured", f"shipped {shipped.name}", "how"):
        table.add_column(header)
    for name, new, old, how in rows:
        table.add_row(name, f"{new:.4g}", f"{old:.4g}", how)
    Console().print(table)
    print(f"attention fractions of every mask measured: {masks}")
    print(f"use it with: --profile {out}")
