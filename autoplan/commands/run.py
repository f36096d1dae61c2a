"""``autoplan run``: train a model for a few steps under a plan on N local processes.

    autoplan run gpt:layers=4,hidden=64,heads=4,vocab=256 --plan tp=2,pp=2 --nproc 4
    autoplan run llama3-8b --plan tp=8 --nproc 8 --backend nccl --dtype bf16
    torchrun --nproc-per-node 4 -m autoplan run MODEL --plan P     # same, started by torchrun

Without RANK/WORLD_SIZE in the environment the command checks its arguments, then
starts ``--nproc`` copies of itself with torchrun's environment (MASTER_ADDR/PORT,
RANK, LOCAL_RANK, WORLD_SIZE) and waits; each copy is one rank.  The rank holding
the last pipeline stage (first on every other axis) prints the loss of each step,
averaged over the global batch.  ``--check`` turns dropout off, also runs the model
on one process and prints the relative error of the loss and of every gradient
against a tolerance scaled to fp32 rounding over depth and ranks (exit 1 beyond it;
see ``apply.verify.Tolerance``).
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from autoplan.errors import UserError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run", help="train a model for a few steps under a plan on N local processes",
        description="Run K training steps of MODEL (zoo name, family spec or model.py) under PLAN with "
                    "torch.distributed on N local processes, on synthetic token data; print the loss "
                    "per step.")
    p.add_argument("model", metavar="MODEL", help="zoo name, family spec (gpt:layers=4,...) or model.py")
    p.add_argument("--plan", required=True, help="plan string (autoplan search output) or plan JSON file")
    p.add_argument("--nproc", type=int, default=0, help="processes to start (default: the plan's GPU count)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                   help="gloo runs on CPU; nccl on one CUDA device per process")
    p.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    p.add_argument("--seq", type=int, default=64, help="sequence length (default 64)")
    p.add_argument("--global-batch", type=int, default=8, help="sequences per step (default 8)")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--placements", metavar="JSON",
                   help="tp placement per block parameter, a JSON file {name: 'R'|'S(0)'|'S(1)'}")
    p.add_argument("--check", action="store_true",
                   help="also run on one process and compare losses and gradients (fp32)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autoplan.apply.launch import in_worker

    if in_worker():
        return _worker(args)
    cfg, nproc = _checked_config(args)
    print(f"autoplan run: {cfg.model}  plan {cfg.plan}  on {nproc} processes ({cfg.backend})", flush=True)
    if args.check:
        return _run_and_check(cfg, nproc)
    from autoplan.apply.launch import launch

    return launch(["-m", "autoplan", *_argv(args, args.plan)], nproc)


def _checked_config(args: argparse.Namespace):
    """Everything checkable before starting processes (errors exit 2 here, once)."""
    from autoplan.apply.parallel import check_supported
    from autoplan.export.load import load_plan
    from autoplan.frontend.source import load_source

    for flag, value in (("--steps", args.steps), ("--seq", args.seq), ("--global-batch", args.global_batch)):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}", f"pass {flag} 1 or more")
    if args.nproc < 0:
        raise UserError(f"--nproc must be positive, got {args.nproc}", "pass the number of processes")
    plan = load_plan(args.plan, num_gpus=args.nproc or None)
    nproc = args.nproc or plan.num_gpus
    source = load_source(args.model, args.seq)
    info = source.info
    experts = info.experts if info else _experts_on_meta(source, plan)
    plan.validate(num_gpus=nproc, num_layers=info.layers if info else plan.pp * plan.vpp,
                  heads=info.heads if info else 0, kv_heads=info.kv_heads if info else 0,
                  experts=experts, seq=args.seq, global_batch=args.global_batch)
    check_supported(plan, args.global_batch, args.seq)
    if info is not None and info.mtp_layers:
        raise UserError(f"{args.model} has {info.mtp_layers} multi-token-prediction module(s), which `autoplan run` "
                        "cannot train yet: their loss joins the backward at a fixed scale (zoo.mtp.AddLoss) that "
                        "gradient accumulation and the pipeline schedules do not divide by the micro-batch count",
                        "run the model without them (mtp_layers=0 in its spec); estimate and search price them")
    if args.backend == "nccl":
        from autoplan.apply.train import cuda_devices

        if cuda_devices() < nproc:
            raise UserError(f"--backend nccl needs {nproc} CUDA devices, this machine has {cuda_devices()}",
                            "use --backend gloo (CPU) or fewer processes")
    if args.check and args.dtype != "fp32":
        raise UserError("--check compares in fp32", "drop --dtype or use --dtype fp32")
    placements, which = _chosen_placements(args, plan)
    if placements is not None and plan.tp > 1:
        from autoplan.apply.tensor_parallel import check_placements_on_meta

        check_placements_on_meta(source.build, plan.tp, plan.mbs, placements)
    if plan.tp > 1:
        print(f"autoplan run: tensor-parallel layout {which}", flush=True)
    return _config(args, plan.to_string(), placements), nproc


def _experts_on_meta(source, plan) -> int:
    """The expert count of a model file (no config to read it from), probed on the meta device;
    only needed to check an ep > 1 plan (0 otherwise)."""
    if plan.ep == 1:
        return 0
    from autoplan.apply.expert_parallel import model_experts
    from autoplan.apply.layout import probe_on_meta

    model, layout = probe_on_meta(source.build, plan.mbs)
    return model_experts(model, layout.blocks_path)


def _chosen_placements(args: argparse.Namespace, plan) -> tuple[dict[str, str] | None, str]:
    """The tp placements to run with and where they come from: --placements, else the Layout the
    search stored with the plan (``autoplan search --json``), else None (Megatron's rule)."""
    from autoplan.export.load import load_layout

    if args.placements:
        return _placements(args.placements), f"from {args.placements}"
    layout = load_layout(args.plan)
    if layout is not None and plan.tp > 1:
        if layout.tp != plan.tp:
            raise UserError(f"the plan file's layout is for tp={layout.tp}, the plan has tp={plan.tp}",
                            "re-run autoplan search --json, or pass the plan as a string")
        return layout.placements(), f"searched (the block ILP's, from {args.plan})"
    return None, "by Megatron's rule (a bare plan has no searched layout)"


def _config(args: argparse.Namespace, plan: str, placements: dict[str, str] | None):
    """The run's RunConfig; dropout is off under ``--check`` (the two runs would draw different masks)."""
    from autoplan.apply.train import RunConfig

    return RunConfig(model=args.model, plan=plan, steps=args.steps, seq=args.seq,
                     global_batch=args.global_batch, lr=args.lr, optimizer=args.optimizer, dtype=args.dtype,
                     backend=args.backend, seed=args.seed, placements=placements, dropout=not args.check)


def _placements(path: str | None) -> dict[str, str] | None:
    if path is None:
        return None
    from topologies.strict_load import DuplicateKey, load_json

    try:
        data = load_json(Path(path).read_text(encoding="utf-8"))
    except DuplicateKey as e:
        raise UserError(f"placements {path}: {e}", "keep one of them") from None
    except (OSError, ValueError, RecursionError) as e:   # ValueError: not JSON, not UTF-8
        raise UserError(f"cannot read placements {path}: {e}",
                        "give a JSON file mapping block parameter names to R, S(0), S(1), ...") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise UserError(f"placements {path} is not a JSON object of strings",
                        'e.g. {"attn.q_proj.weight": "S(0)", "attn.o_proj.weight": "S(1)"}')
    return dict(sorted(data.items()))


def _argv(args: argparse.Namespace, plan: str) -> list[str]:
    """The command line each worker process runs (the same command and plan argument)."""
    argv = ["run", args.model, "--plan", plan, "--nproc", str(args.nproc), "--backend", args.backend,
            "--steps", str(args.steps), "--seq", str(args.seq), "--global-batch", str(args.global_batch),
            "--lr", repr(args.lr), "--optimizer", args.optimizer, "--dtype", args.dtype, "--seed", str(args.seed)]
    if args.placements:
        argv += ["--placements", args.placements]
    return argv


def _worker(args: argparse.Namespace) -> int:
    from autoplan.apply.train import run_worker
    from autoplan.export.load import load_plan

    plan = load_plan(args.plan, num_gpus=int(os.environ["WORLD_SIZE"]))
    cfg = _config(args, plan.to_string(), _chosen_placements(args, plan)[0])
    width = len(str(cfg.steps))

    def report(step: int, loss: float) -> None:
        print(f"step {step:>{width}}/{cfg.steps}  loss {loss:.6f}", flush=True)

    run_worker(cfg, report)
    return 0


def _run_and_check(cfg, nproc: int) -> int:
    from autoplan.apply.verify import check_against_reference, run_parallel

    with tempfile.TemporaryDirectory(prefix="autoplan-run-") as tmp:
        [(losses, grads)] = run_parallel([cfg], nproc, tmp)
    width = len(str(cfg.steps))
    for i, loss in enumerate(losses):
        print(f"step {i + 1:>{width}}/{cfg.steps}  loss {loss:.6f}")
    check = check_against_reference(cfg, losses, grads, nproc)
    verdict = "OK" if check.ok() else "MISMATCH"
    print(f"check against one process (dropout off, fp32):\n{check.report()}\n{verdict}: "
          f"max relative error {max(check.loss_rel, check.grad_rel, check.worst_tensor_rel):.2e} "
          f"{'<=' if check.ok() else '>'} tolerance {check.tolerance.value:.2e}")
    return 0 if check.ok() else 1

