"""The ``autoplan`` command line, and its one error path.

Each sub-command lives in ``autoplan/commands/<name>.py`` and exposes
``add_parser(subparsers)`` and ``run(args) -> int``.  ``main`` turns every way a
run can end into one exit code:

* bad input (``UserError``, ``TopologyError``, a count out of bounds): ``error:`` and
  ``  fix:`` on stderr, exit 2, no traceback;
* a usage error (an unknown flag, ``--to torchtitian``, ``--seq abc``): the same ``error:`` and
  ``fix:`` lines (``Parser.error``), exit 2;
* Ctrl-C / SIGINT: ``interrupted`` on stderr, exit 130; SIGTERM: ``terminated``, exit 143; at any
  moment, within 2 s, no process left, output files written whole or not at all
  (``autoplan.interrupts``, ``autoplan.atomic``);
* stdout closed by the reader (``autoplan clusters --json | head -c 1``): exit 0, silent.

The parser is built for the chosen command alone (``build_parser(only=...)``): each command module
imports only what its arguments show (``commands/choices.py``) and the rest in ``run``, so
``autoplan --help`` and a usage error answer without importing numpy or torch.

Every command takes ``-v`` (what the engine decided: the search's passes, bounds and prunings,
the ILPs it solved; ``logging.INFO``) and ``-vv`` (each plan priced and why one was skipped;
``logging.DEBUG``), on stderr through the ``autoplan`` logger.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import math
import os
import re
import signal
import sys
from dataclasses import dataclass

from autoplan import interrupts
from autoplan.errors import EXIT_INTERRUPTED, EXIT_USER, UserError

COMMANDS = {   # name -> the one-line help `autoplan --help` lists (the command's module gives the same)
    "search": "search the K best distinct parallel plans",
    "trace": "trace a model into blocks and show its parameters, FLOPs and heaviest ops",
    "estimate": "price a hand-written plan (step time, MFU, memory, collectives)",
    "clusters": "list the named clusters, or show one",
    "baseline": "the plan a hand-written 4D recipe gives (megatron, megascale, llama3, fsdp, deepseek, published)",
    "explain": "audit a plan: primitive placement, rule verdicts, a baseline side by side",
    "export": "write a plan as torchtitan 0.3.0 arguments, Megatron-LM arguments or JSON",
    "run": "train a model for a few steps under a plan on N local processes",
    "bench": "benchmark the automatic plan against hand-written 4D recipes and a Megatron grid",
    "calibrate": "measure GEMM, attention and HBM efficiency on this GPU; write a profile",
    "memcheck": "memory estimate vs torch's memory tracker on the applied plan",
    "study": "answer an open question of 4D-parallel practice by sweeping the search (q1 … q5)",
}
TRACING = ("search", "trace", "estimate", "baseline", "explain", "export", "memcheck")
"""Commands that may trace a model, and so take ``--trace-timeout``."""

DEFAULT_TRACE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Bound:
    """Inclusive range of one numeric flag.  ``lo`` -inf: the command checks the lower end
    itself (with its own message); ``hi`` None: the machine-dependent process cap."""

    flag: str
    lo: float
    hi: float | None


def process_cap() -> int:
    """Most local processes a command may start: 4 per CPU core, at least 16."""
    return max(16, 4 * (os.cpu_count() or 1))


BOUNDS = {  # argparse dest -> Bound (values of None are "not given" and pass)
    "seq": Bound("--seq", -math.inf, 2 ** 24),
    "batch": Bound("--batch", -math.inf, 2 ** 16),
    "global_batch": Bound("--global-batch", -math.inf, 2 ** 24),
    "top": Bound("--top", -math.inf, 1000),
    "workers": Bound("--workers", 0, None),
    "nproc": Bound("--nproc", 0, None),
    "steps": Bound("--steps", -math.inf, 100_000),
    "time_limit": Bound("--time-limit", 0, 86_400),
    "fsdp_prefetch": Bound("--fsdp-prefetch", 1, 64),               # FSDP units gathered ahead
    "grad_reduce_bytes": Bound("--grad-reduce-bytes", 1, 8),        # bytes per gradient element: fp8 … fp64
    "search_timeout": Bound("--search-timeout", 0, 7 * 86_400),      # 0: no limit
    "trace_timeout": Bound("--trace-timeout", 0, 86_400),
    "lr": Bound("--lr", 0, 1e3),
}


class Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors take the CLI's form: ``error:`` and ``fix:``, exit 2."""

    def error(self, message: str):
        raise UserError(f"{self.prog}: {message}", usage_fix(self, message))


def usage_fix(parser: argparse.ArgumentParser, message: str) -> str:
    """The fix for an argparse message: the closest spelling of a wrong choice or flag, the type a
    value needs, the argument missing."""
    see = f"`{parser.prog} --help` lists what it takes"
    if m := re.search(r"argument (\S+): invalid choice: '(.*)' \(choose from (.*)\)$", message):
        choices = re.findall(r"'([^']*)'", m.group(3))
        near = difflib.get_close_matches(m.group(2), choices, n=1)
        return (f"did you mean {near[0]!r}? " if near else "") + f"{m.group(1)} is one of: {', '.join(choices)}"
    if m := re.search(r"argument (\S+?)(?:/\S+)?: invalid (int|float) value", message):
        kind = "a whole number, e.g. 2048" if m.group(2) == "int" else "a number, e.g. 1.5"
        return f"give {m.group(1)} {kind}"
    if m := re.search(r"unrecognized arguments: (.*)$", message):
        flags = [o for a in parser._actions for o in a.option_strings]
        first = m.group(1).split()[0].split("=")[0]
        near = difflib.get_close_matches(first, flags, n=1)
        return (f"did you mean {near[0]}? " if near else f"drop {first}; ") + see
    if m := re.search(r"the following arguments are required: (.*)$", message):
        return f"add {m.group(1)}; {see}"
    return f"see {see}"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every command's arguments, or (``only``, a command name or "")
    that command's alone, the others listed by name and help without importing their modules."""
    parser = Parser(prog="autoplan", description="Auto-parallel planner for large-model training.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for name, help_text in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        importlib.import_module(f"autoplan.commands.{name}").add_parser(sub)
        sub.choices[name].add_argument(
            "-v", "--verbose", action="count", default=0,
            help="log what the engine decides on stderr (-v: passes, bounds, ILPs; -vv: every plan priced)")
        if name in TRACING:
            sub.choices[name].add_argument(
                "--trace-timeout", type=float, default=DEFAULT_TRACE_TIMEOUT_S, metavar="S",
                help="give up on a model whose import, build or trace runs longer than S seconds "
                     f"(default {DEFAULT_TRACE_TIMEOUT_S:g}; 0: no limit)")
    return parser


def check_bounds(args: argparse.Namespace) -> None:
    """Every numeric flag finite and inside its ``BOUNDS`` range, else a UserError."""
    for dest, b in BOUNDS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        hi = process_cap() if b.hi is None else b.hi
        if not (isinstance(value, (int, float)) and math.isfinite(value) and b.lo <= value <= hi):
            why = f"at most {_num(hi)}" if b.lo == -math.inf else f"between {_num(b.lo)} and {_num(hi)}"
            if b.hi is None:
                why += f" on this machine ({os.cpu_count()} CPU cores)"
            raise UserError(f"{b.flag} {value!r} is out of range: it must be {why}",
                            f"pass {b.flag} with a value {why}")


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, an unknown argument reported by the command's own parser (its
    flags are the ones a misspelt flag is near)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        commands.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def command_in(argv: list[str]) -> str:
    """The command ``argv`` names: its first argument that is not an option ("" if none: the
    top-level parser answers, with the list of commands or the usage error)."""
    return next((a for a in argv if not a.startswith("-")), "")


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) and return its exit code.  Called
    with an ``argv`` (in-process: tests, scripts), the signal handling is put back as it was."""
    restore = _own_signals(quiet=_launched_rank())
    try:
        code = _main(sys.argv[1:] if argv is None else list(argv))
    finally:
        if argv is not None:
            restore()
    if argv is None and interrupts.received():
        interrupts.exit_now(code)       # skip the interpreter's teardown: seconds with torch imported
    return code


def _main(argv: list[str]) -> int:
    try:
        args = parse(build_parser(only=command_in(argv)), argv)
        _log_to_stderr(getattr(args, "verbose", 0))
        check_bounds(args)
        code = int(args.func(args) or 0)
        sys.stdout.flush()
        return code
    except UserError as err:
        return _fail(err.problem, err.fix, err.exit_code)
    except KeyboardInterrupt:
        interrupts.say_once(signal.SIGINT)
        return EXIT_INTERRUPTED
    except interrupts.Terminated:
        interrupts.say_once(signal.SIGTERM)
        return interrupts.EXIT_TERMINATED
    except BrokenPipeError:
        _stdout_to_devnull()
        return 0
    except Exception as err:  # noqa: BLE001
        if interrupts.received():        # a child the same Ctrl-C ended failed first (CBC, a rank)
            interrupts.say_once(interrupts.received())
            return interrupts.exit_code(interrupts.received())
        from topologies import TopologyError

        if isinstance(err, TopologyError):   # the hardware layer cannot import UserError
            return _fail(err.problem, err.fix, EXIT_USER)
        raise


def _log_to_stderr(verbosity: int) -> None:
    """The ``autoplan`` logger (every module logs under it) on stderr: warnings by default,
    INFO with ``-v``, DEBUG with ``-vv``."""
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logger = logging.getLogger("autoplan")
    logger.setLevel(level)
    if not any(getattr(h, "autoplan_cli", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(relativeCreated)7.0f ms  %(name)s: %(message)s"))
        handler.autoplan_cli = True          # type: ignore[attr-defined]
        logger.addHandler(handler)


def _fail(problem: str, fix: str, code: int) -> int:
    # a UserError without a fix is a bug (tests/autoplan/test_errors.py); never show one bare
    _say(f"error: {problem}\n  fix: {fix or 'see `autoplan <command> --help` for what is accepted'}")
    return code


def _say(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _stdout_to_devnull() -> None:
    """After EPIPE: point fd 1 at /dev/null so the interpreter's final flush is silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _launched_rank() -> bool:
    """A rank process ``autoplan run`` (or torchrun) started: its parent reports an interrupt."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _own_signals(quiet: bool):
    """SIGINT and SIGTERM handled by ``autoplan.interrupts``; returns what puts back the handlers
    and the wakeup fd as they were."""
    try:
        old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        wakeup = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(wakeup)
    except ValueError:                  # not the main thread (tests calling main() from a thread)
        return lambda: None
    interrupts.install(quiet=quiet)

    def restore() -> None:
        signal.set_wakeup_fd(wakeup)
        for signum, handler in old.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    return restore


if __name__ == "__main__":
    sys.exit(main())
