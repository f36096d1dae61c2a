r"""The sharding ILP, written out first; the code below reads as this formulation.

Sets
----
* ``N``: nodes (ops after merging followers), node ``n`` has strategies ``S_n``.
* ``T``: tensors.  Tensor ``t`` is produced by node ``p(t)``; under strategy ``s`` of
  the producer it has placement ``out_t(s)``.  Each consumer ``c ∈ C_t`` needs it in
  placement ``in_{t,c}(s')`` under the consumer's strategy ``s'``.
* ``A_t``: placements tensor ``t`` can be produced in, ``B_t``: placements consumers ask for.

Variables
---------
* ``x[n,s] ∈ {0,1}``: node ``n`` runs strategy ``s``.
* ``e[t,c,a,b] ∈ {0,1}``: consumer ``c`` reads tensor ``t`` produced as ``a`` in layout ``b``
  (one per consumer edge and placement pair: the classic edge variables).
* ``w[t,a,b,g] ∈ {0,1}`` for ``a ≠ b`` with cost(a→b) > 0: tensor ``t`` is redistributed from
  ``a`` to ``b`` for the consumers of sharing group ``g`` — paid once per group however many
  consumers read ``b`` (a group is a phase: the forward consumers of a tensor share one
  all-gather; backward consumers of a saved tensor redistribute it again, as Megatron's
  sequence parallelism re-gathers its input in backward).

Constraints
-----------
1. one strategy per node:                Σ_s x[n,s] = 1
2. edge marginals (tight: the edge polytope of a tree is integral):
                                         Σ_b e[t,c,a,b] = Σ_{s: out_t(s)=a} x[p(t),s]
                                         Σ_a e[t,c,a,b] = Σ_{s': in_{t,c}(s')=b} x[c,s']
   redistribution is paid once per group: w[t,a,b,g] ≥ e[t,c,a,b]   for every consumer c in g
3. tied nodes choose alike (a parameter and the sink of its gradient; a block's output and
   the next block's input):              x[n,s] = x[m,σ(s)]
4. memory:                               Σ_{n,s} mem[n,s]·x[n,s] + Σ w[t,a,b]·0 ≤ M
5. forbidden choices (a per-layer collective that would leave the NVLink domain):
                                         x[n,s] = 0,  w[t,a,b] = 0

The backends below take all five; the block builder (``autoplan.sharding.solve.build_problem``)
emits 1, 2 and 5 only: its boundary and gradient-sink reads already tie what 3 would, and the
memory row (4) is left to the search, which prices memory per plan.

Objective
---------
    min  Σ_{n,s} cost[n,s]·x[n,s]  +  Σ_{t,a,b,g} redist[t,a,b,g]·w[t,a,b,g]

``cost[n,s]``: compute seconds of the node's (merged) ops under strategy s, forward and
backward, recomputation included; ``redist[t,a,b]``: seconds of the collective that turns
placement a into b on the tp group (all-gather, reduce-scatter, all-to-all, all-reduce of
a partial sum; a slice is free).  Every ``w`` is pushed to its lower bound by the objective,
so ``w = max_c e`` over its group.

Backends: OR-Tools (``cpsat``: the LP relaxation first, by GLOP — where its optimum is
integral it is the ILP's, ``relaxation.py`` — else CP-SAT: integer objective, costs scaled to
nanoseconds; one worker and a deterministic time limit, so a timed-out solve is reproducible; no
probing or symmetry detection in presolve, ``_fast_presolve``) and PuLP/CBC (wall-clock limit).  A
time limit returns the best solution found, with its optimality gap.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar, get_args

from costmodels.memo import Table

if TYPE_CHECKING:
    from ortools.sat.python import cp_model, cp_model_helper

Backend = Literal["cpsat", "cbc"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)
_SCALE = 1e9          # CP-SAT works in integers: objective coefficients in nanoseconds


@dataclass(frozen=True)
class IlpNode:
    name: str
    cost: tuple[float, ...]                  # seconds, per strategy
    memory: tuple[float, ...] = ()           # bytes per strategy (empty: 0)
    forbidden: tuple[int, ...] = ()          # strategy indices fixed to 0


@dataclass(frozen=True)
class IlpTensor:
    name: str
    producer: int                            # node index
    out_placement: tuple[int, ...]           # placement id per producer strategy
    consumers: tuple[tuple[int, tuple[int, ...], int], ...]   # (node, placement id per its strategy, group)
    redist: tuple[tuple[int, int, int, float], ...]           # (a, b, group, seconds), a != b, cost > 0
    forbidden_redist: tuple[tuple[int, int], ...] = ()        # (a, b) pairs that may not happen


@dataclass(frozen=True)
class IlpProblem:
    nodes: tuple[IlpNode, ...]
    tensors: tuple[IlpTensor, ...]
    ties: tuple[tuple[int, int, tuple[int, ...]], ...] = ()  # (n, m, σ): x[n,s] = x[m,σ[s]]
    memory_budget: float | None = None       # bytes

    @property
    def size(self) -> dict[str, int]:
        """Variable/constraint counts, for the record."""
        x = sum(len(n.cost) for n in self.nodes)
        e = sum(len(set(t.out_placement)) * len(set(pl)) for t in self.tensors for _, pl, _ in t.consumers)
        w = sum(len(t.redist) for t in self.tensors)
        marg = sum(len(set(t.out_placement)) + len(set(pl)) for t in self.tensors for _, pl, _ in t.consumers)
        return {"nodes": len(self.nodes), "x_vars": x, "e_vars": e, "w_vars": w,
                "constraints": len(self.nodes) + marg + e + sum(len(s) for _, _, s in self.ties)
                + (1 if self.memory_budget is not None else 0)}


@dataclass(frozen=True)
class IlpSolution:
    choice: tuple[int, ...]          # strategy index per node
    objective: float                 # seconds
    bound: float                     # best lower bound, seconds
    status: str                      # optimal | feasible | infeasible
    solve_seconds: float
    backend: str
    note: str = ""                   # how a failed solve was recovered (empty: it was not)

    @property
    def gap(self) -> float:
        """Relative optimality gap (objective − bound) / objective."""
        if self.objective <= 0:
            return 0.0
        return max(0.0, (self.objective - self.bound) / self.objective)


class IlpInfeasible(Exception):
    """No strategy assignment satisfies the constraints (e.g. the memory row)."""


def solve(problem: IlpProblem, backend: str = "cpsat", time_limit_s: float = 30.0) -> IlpSolution:
    """Solve ``problem`` with ``backend`` ("cpsat" or "cbc").

    A solve that ends without a solution (time-out before the first incumbent, a solver
    failure) falls back, in order, to the greedy start (each node's cheapest allowed
    strategy) when it meets the constraints, then to the other backend; the solution's
    ``note`` says so and its gap is against the LP bound.  Only a problem neither finds
    a solution to raises ``IlpInfeasible``.
    """
    solvers = {"cpsat": _solve_cpsat, "cbc": _solve_cbc}
    if backend not in solvers:
        raise ValueError(f"unknown ILP backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    start = time.perf_counter()
    if backend == "cpsat":
        from autoplan.sharding.relaxation import solve_relaxation
        relaxed = solve_relaxation(problem)
        if relaxed is not None:
            return relaxed
    try:
        return solvers[backend](problem, time_limit_s)
    except IlpInfeasible as failed:
        hint = _greedy_choice(problem)
        if feasible(problem, hint):
            obj = evaluate(problem, hint)
            return IlpSolution(hint, obj, min(obj, _lp_bound(problem)), "feasible",
                               time.perf_counter() - start, backend, f"{failed}: used the greedy start")
        other = next(b for b in BACKENDS if b != backend)
        try:
            sol = solvers[other](problem, max(time_limit_s, 1.0))
        except IlpInfeasible:
            raise failed from None
        return replace(sol, note=f"{failed}: solved with {other}")


def load_backend(backend: str) -> None:
    """Import ``backend``'s solver now, e.g. before forking workers, which then share the module
    instead of each importing it.  For ``cpsat`` that is GLOP's, which solves the relaxation of
    every block ILP; CP-SAT's module (it pulls in pandas: ~0.35 s a process) is imported where a
    relaxation does not certify its optimum, which no block the zoo traces needs
    (experiments/check_relaxation.py)."""
    if backend == "cpsat":
        from ortools.linear_solver.python import model_builder_helper  # noqa: F401
    elif backend == "cbc":
        import pulp  # noqa: F401


def feasible(problem: IlpProblem, choice: Sequence[int]) -> bool:
    """Every constraint met: no forbidden strategy or redistribution, ties kept, memory row."""
    if any(s in n.forbidden for n, s in zip(problem.nodes, choice)):
        return False
    if any(choice[m] != sigma[choice[n]] for n, m, sigma in problem.ties):
        return False
    for t in problem.tensors:
        a = t.out_placement[choice[t.producer]]
        if any((a, pl[choice[c]]) in t.forbidden_redist for c, pl, _ in t.consumers):
            return False
    if problem.memory_budget is None:
        return True
    return sum(n.memory[s] if n.memory else 0.0 for n, s in zip(problem.nodes, choice)) <= problem.memory_budget


def evaluate(problem: IlpProblem, choice: Sequence[int]) -> float:
    """Objective value of a full assignment (used by tests and brute force)."""
    total = sum(n.cost[s] for n, s in zip(problem.nodes, choice))
    for t in problem.tensors:
        a = t.out_placement[choice[t.producer]]
        needed = {(pl[choice[c]], g) for c, pl, g in t.consumers}
        costs = {(ra, rb, g): sec for ra, rb, g, sec in t.redist}
        total += sum(costs.get((a, b, g), 0.0) for b, g in needed if b != a)
    return total


# --- the model, written once for both backends ---------------------------------------------

def _placement_terms(choices: Sequence[int]) -> dict[int, list[int]]:
    """Group strategy indices by the placement id they induce."""
    groups: dict[int, list[int]] = {}
    for s, pl in enumerate(choices):
        groups.setdefault(pl, []).append(s)
    return groups


V = TypeVar("V")                        # a backend's variable
L = TypeVar("L", bound=int)             # a variable that is its index (``_Literal``, an LP column)
M = TypeVar("M")                        # a backend's model
S = TypeVar("S")


class ModelApi(Protocol[V]):
    """What ``_build`` writes a model through: one backend's variables and constraints."""

    def boolvar(self, name: str) -> V: ...
    def exactly_one(self, literals: list[V]) -> object: ...
    def add_eq(self, lhs: list[V], rhs: list[V]) -> object: ...
    def add_ge(self, a: V, b: V) -> object: ...
    def fix0(self, v: V) -> object: ...


class _Indexed(Protocol):
    """A CP-SAT variable, built or parsed: its proto index."""

    @property
    def index(self) -> int: ...


def _build(problem: IlpProblem, api: ModelApi[V]) -> tuple[list[list[V]], list[tuple[float, V]]]:
    """Emit variables, constraints and the objective through a tiny backend ``api``.

    ``api`` provides: boolvar(name), add_eq(lhs_terms, rhs_terms), add_ge(var, var),
    fix0(var), objective terms are returned as (coefficient seconds, var).
    """
    x = [[api.boolvar(f"x{n}_{s}") for s in range(len(node.cost))] for n, node in enumerate(problem.nodes)]
    objective: list[tuple[float, V]] = []
    for n, node in enumerate(problem.nodes):
        api.exactly_one(x[n])
        for s in node.forbidden:
            api.fix0(x[n][s])
        objective += [(c, x[n][s]) for s, c in enumerate(node.cost) if c]
    for ti, t in enumerate(problem.tensors):
        prod = _placement_terms(t.out_placement)
        w: dict[tuple[int, int, int], V] = {}
        for a, b, g, sec in t.redist:
            if a in prod:
                w[(a, b, g)] = api.boolvar(f"w{ti}_{a}_{b}_{g}")
                objective.append((sec, w[(a, b, g)]))
                if (a, b) in t.forbidden_redist:
                    api.fix0(w[(a, b, g)])
        for ci, (c, pl, g) in enumerate(t.consumers):
            cons = _placement_terms(pl)
            e = {(a, b): api.boolvar(f"e{ti}_{ci}_{a}_{b}") for a in prod for b in cons}
            for a, sa in prod.items():
                api.add_eq([e[(a, b)] for b in cons], [x[t.producer][s] for s in sa])
            for b, sb in cons.items():
                api.add_eq([e[(a, b)] for a in prod], [x[c][s] for s in sb])
            for (a, b), var in e.items():
                if (a, b, g) in w:
                    api.add_ge(w[(a, b, g)], var)
                elif a != b and (a, b) in t.forbidden_redist:
                    api.fix0(var)
    for n, k, sigma in problem.ties:
        for s, tied in enumerate(sigma):
            api.add_eq([x[n][s]], [x[k][tied]])
    return x, objective


def _cpsat_model(problem: IlpProblem) -> tuple[cp_model.CpModel, Sequence[Sequence[_Indexed]], tuple[int, ...]]:
    """The CP-SAT model of ``problem`` and its x variables (per node, per strategy; each has the
    ``index`` of its proto variable), with the greedy start as a hint.  Without a memory row the
    model proto is written as text and parsed by CP-SAT (``_TextModel``): its variables and
    constraints once per problem structure (``_skeleton``, copied), its objective and hints per
    problem; else through CP-SAT's direct calls (no operator-overloaded sums); either is the
    model the overloaded form builds, proto for proto (tested)."""
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    if problem.memory_budget is None:
        skeleton = _skeleton(problem)
        parsed = skeleton.x
        hint = _greedy_choice(problem)
        m.proto.copy_from(skeleton.model.proto)
        m.proto.merge_text_format(_objective_text(skeleton.objective(problem),
                                                  [(var, s == best) for best, row in zip(hint, parsed)
                                                   for s, var in enumerate(row)]))
        return m, parsed, hint
    total = cp_model.LinearExpr.sum

    class Api:
        boolvar = staticmethod(m.new_bool_var)
        exactly_one = staticmethod(m.add_exactly_one)

        @staticmethod
        def add_eq(lhs: list[cp_model.IntVar], rhs: list[cp_model.IntVar]) -> None:
            m.add(total(lhs) == total(rhs))

        @staticmethod
        def add_ge(a: cp_model.IntVar, b: cp_model.IntVar) -> None:
            m.add_implication(b, a)

        @staticmethod
        def fix0(v: cp_model.IntVar) -> None:
            m.add(v == 0)

    x, objective = _build(problem, Api)
    if problem.memory_budget is not None:
        # integer memory row: the budget maps to 10^6 units (1 ppm resolution)
        unit = max(problem.memory_budget, 1e-30) / 1e6
        terms = [int(round(mem / unit)) * x[n][s]
                 for n, node in enumerate(problem.nodes) for s, mem in enumerate(node.memory) if mem]
        m.add(sum(terms) <= 1_000_000)
    m.minimize(cp_model.LinearExpr.weighted_sum([v for _, v in objective],
                                                 [int(round(c * _SCALE)) for c, _ in objective]))
    hint = _greedy_choice(problem)
    for n, best in enumerate(hint):            # a feasible start: each node's cheapest allowed strategy
        for s, var in enumerate(x[n]):
            m.add_hint(var, s == best)
    return m, x, hint


class _Literal(int):
    """A Boolean variable of a ``_TextModel``: its proto index."""

    __slots__ = ()

    @property
    def index(self) -> int:
        return int(self)


class _TextModel:
    """``_build``'s backend api writing CP-SAT's model proto in text format, one line per variable
    and constraint, as CP-SAT's Python calls canonicalise them: a linear constraint lists its
    variables ascending with their summed coefficients, zeros dropped; so is the objective; an
    implication b ⇒ a is ``bool_and`` enforced by b; literals and hints keep their order.  One
    parse replaces a Python-to-C++ call per variable and constraint."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.count = 0

    def boolvar(self, name: str) -> _Literal:
        self.lines.append(f'variables {{ name: "{name}" domain: 0 domain: 1 }}')
        self.count += 1
        return _Literal(self.count - 1)

    def exactly_one(self, literals: list[_Literal]) -> None:
        self.lines.append(f"constraints {{ exactly_one {{ literals: {' literals: '.join(map(str, literals))} }} }}"
                          if literals else "constraints { exactly_one { } }")

    def add_eq(self, lhs: list[_Literal], rhs: list[_Literal]) -> None:
        terms: dict[int, int] = {}
        for v in lhs:
            terms[v] = terms.get(v, 0) + 1
        for v in rhs:
            terms[v] = terms.get(v, 0) - 1
        self.lines.append(f"constraints {{ linear {{ {_linear(terms)} domain: 0 domain: 0 }} }}")

    def add_ge(self, a: _Literal, b: _Literal) -> None:
        self.lines.append(f"constraints {{ enforcement_literal: {b} bool_and {{ literals: {a} }} }}")

    def fix0(self, v: _Literal) -> None:
        self.lines.append(f"constraints {{ linear {{ vars: {v} coeffs: 1 domain: 0 domain: 0 }} }}")

    def proto(self, objective: Iterable[tuple[float, int]], hints: Sequence[tuple[int, bool]]) -> str:
        """The whole model: the lines, the objective and the hints (``_objective_text``)."""
        return "\n".join(self.lines) + "\n" + _objective_text(objective, hints)


def _objective_text(objective: Iterable[tuple[float, int]], hints: Sequence[tuple[int, bool]]) -> str:
    """The objective (seconds → integer nanoseconds, summed per variable) and the hints of a
    ``_TextModel``'s proto, in text format."""
    terms: dict[int, int] = {}
    for c, v in objective:
        terms[v] = terms.get(v, 0) + int(round(c * _SCALE))
    hint = " ".join(f"vars: {v}" for v, _ in hints) + " " + " ".join(f"values: {int(b)}" for _, b in hints)
    return f"objective {{ {_linear(terms)} scaling_factor: 1 }}\nsolution_hint {{ {hint} }}\n"


@dataclass(frozen=True)
class Skeleton(Generic[M, L]):
    """A solver's model of every problem of one structure (``_structure``) but its objective and
    hints — CP-SAT's (``_skeleton``) or the LP relaxation's (``relaxation._lp_skeleton``): the
    variables and constraints built once, the x variable per (node, strategy), the w variable per
    (tensor, redistribution entry) (-1 where the producer never makes its ``a``)."""

    model: M                               # a CpModel or a ModelBuilderHelper
    x: tuple[tuple[L, ...], ...]
    w: tuple[tuple[int, ...], ...]

    def objective(self, problem: IlpProblem) -> list[tuple[float, int]]:
        """``_build``'s objective terms for ``problem``, in its order."""
        out: list[tuple[float, int]] = [(c, self.x[n][s]) for n, node in enumerate(problem.nodes)
                                        for s, c in enumerate(node.cost) if c]
        out += [(r[3], v) for t, ws in zip(problem.tensors, self.w) for r, v in zip(t.redist, ws) if v >= 0]
        return out

    def same_model(self, other: Skeleton[M, L]) -> bool:
        """Whether two skeletons are one model, variable for variable and constraint for
        constraint (the memo audit's comparison: a model object has no value equality)."""
        return self.x == other.x and self.w == other.w and _model_text(self.model) == _model_text(other.model)


def _model_text(model: Any) -> str:
    """A CpModel's proto, or a ModelBuilderHelper's LP, as text."""
    return str(model.proto) if hasattr(model, "proto") else model.export_to_lp_string()


_NodesStructure = tuple[tuple[int, tuple[int, ...]], ...]
_TensorsStructure = tuple[tuple[int, tuple[int, ...], tuple[tuple[int, tuple[int, ...], int], ...],
                                tuple[tuple[int, int, int], ...], tuple[tuple[int, int], ...]], ...]
Structure = tuple[_NodesStructure, _TensorsStructure, tuple[tuple[int, int, tuple[int, ...]], ...]]
"""``_structure``: what ``_build`` reads of a problem besides its costs."""
_SKELETONS_LIMIT = 64                  # a skeleton holds ~0.5 MB (a 130-node MoE block); a search meets ~15
_SKELETONS: Table[Skeleton[cp_model.CpModel, _Literal]] = Table("ilp.skeletons", _SKELETONS_LIMIT,
                                                               compare=Skeleton.same_model)


def _structure(problem: IlpProblem) -> Structure:
    """Everything ``_build`` reads of ``problem`` besides its costs: the strategy counts and
    forbidden choices, each tensor's producer, placements, consumers, redistribution entries
    (a, b, group) and forbidden pairs, the ties.  Problems equal in it get one model, variable
    for variable and constraint for constraint."""
    return (tuple((len(n.cost), n.forbidden) for n in problem.nodes),
            tuple((t.producer, t.out_placement, t.consumers, tuple(r[:3] for r in t.redist), t.forbidden_redist)
                  for t in problem.tensors), problem.ties)


def built_variables(problem: IlpProblem,
                    api: ModelApi[L]) -> tuple[tuple[tuple[L, ...], ...], tuple[tuple[int, ...], ...]]:
    """``_build`` through ``api``: (the x variable per (node, strategy), the w variable per (tensor,
    redistribution entry), -1 where the producer never makes its ``a``); the w read off the
    objective, which lists the node terms (nonzero costs) first and then every w in tensor and
    entry order."""
    x, objective = _build(problem, api)
    ws = iter(v for _, v in objective[sum(1 for n in problem.nodes for c in n.cost if c):])
    w = tuple(tuple(next(ws) if r[0] in set(t.out_placement) else -1 for r in t.redist) for t in problem.tensors)
    return tuple(tuple(row) for row in x), w


def per_structure(table: Table[S], problem: IlpProblem, make: Callable[[], S]) -> S:
    """``make()`` remembered in ``table`` under ``problem``'s ``_structure``: a model's variables
    and constraints, built once per structure."""
    return table.get(_structure(problem), make)


def _skeleton(problem: IlpProblem) -> Skeleton[cp_model.CpModel, _Literal]:
    """The ``Skeleton`` of ``problem``'s structure, built on first sight: ``_build`` written by a
    ``_TextModel`` and parsed."""
    from ortools.sat.python import cp_model

    def make() -> Skeleton[cp_model.CpModel, _Literal]:
        text = _TextModel()
        x, w = built_variables(problem, text)
        model = cp_model.CpModel()            # kept: it owns the proto
        model.proto.parse_text_format("\n".join(text.lines) + "\n")
        return Skeleton(model, x, w)
    return per_structure(_SKELETONS, problem, make)


def _linear(terms: dict[int, int]) -> str:
    """``vars``/``coeffs`` fields of a canonical linear expression: ascending, no zero coefficient."""
    kept = sorted(v for v, c in terms.items() if c)
    if not kept:
        return ""
    return "vars: " + " vars: ".join(map(str, kept)) + " coeffs: " + " coeffs: ".join(str(terms[v]) for v in kept)


def _solve_cpsat(problem: IlpProblem, time_limit_s: float) -> IlpSolution:
    from ortools.sat.python import cp_model

    start = time.perf_counter()
    m, x, hint = _cpsat_model(problem)
    solver = cp_model.CpSolver()
    # deterministic time (CP-SAT's work units, about a second each) keeps a timed-out solve
    # reproducible; the wall-clock cap is a safety net
    solver.parameters.max_deterministic_time = float(time_limit_s)
    solver.parameters.max_time_in_seconds = 10.0 * float(time_limit_s)
    solver.parameters.num_workers = 1          # deterministic
    solver.parameters.catch_sigint_signal = False   # Ctrl-C is the CLI's (exit 130), not the solver's
    solver.parameters.random_seed = 0
    # the edge formulation's LP relaxation is nearly integral: keep the full LP in the loop
    # (a 110-node MoE block: 0.1 s instead of a minute)
    solver.parameters.linearization_level = 2
    solver.parameters.add_lp_constraints_lazily = False
    _fast_presolve(solver.parameters)
    status = solver.Solve(m)
    elapsed = time.perf_counter() - start
    if status == cp_model.UNKNOWN and problem.memory_budget is None and not any(n.forbidden for n in problem.nodes):
        # out of time before a first solution: the greedy start is feasible (every assignment is,
        # without a memory row or forbidden choices), so return it with its gap
        obj = evaluate(problem, hint)
        return IlpSolution(hint, obj, min(obj, _lp_bound(problem)), "feasible", time.perf_counter() - start,
                           "cpsat")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise IlpInfeasible(f"CP-SAT status {solver.StatusName(status)}")
    values = solver.response_proto.solution
    choice = tuple(next(s for s, v in enumerate(row) if values[v.index]) for row in x)
    obj = evaluate(problem, choice)
    bound = obj if status == cp_model.OPTIMAL else min(obj, solver.BestObjectiveBound() / _SCALE)
    return IlpSolution(choice, obj, bound, "optimal" if status == cp_model.OPTIMAL else "feasible",
                       elapsed, "cpsat")


def _fast_presolve(parameters: cp_model_helper.SatParameters) -> None:
    """No probing and no symmetry detection in CP-SAT's presolve.  The block ILPs are small
    (≤ ~150 nodes) with an almost integral LP, so both cost more than they save: on the 252
    distinct ILPs of Llama-3 405B on h100x1024 the solves take 2.6 s instead of 8.0 s (CPU),
    on DeepSeek-V3's 264, 6.6 s instead of 14.7 s.  The optimum is unchanged (tested against the default
    presolve on traced blocks); among tied optima CP-SAT may land on another, which the search
    outputs of the nine worst-case rows of experiments/bench_search.py do not show (their top-K
    JSON is byte-identical to the default presolve's)."""
    parameters.cp_model_probing_level = 0
    parameters.symmetry_level = 0


def _solve_cbc(problem: IlpProblem, time_limit_s: float) -> IlpSolution:
    import pulp

    start = time.perf_counter()
    lp = pulp.LpProblem("sharding", pulp.LpMinimize)

    class Api:
        # pulp ships no types: its variables are Any here
        @staticmethod
        def boolvar(name: str) -> Any:
            return lp.add_variable(name, cat="Binary")

        @staticmethod
        def exactly_one(vs: list[Any]) -> None:
            lp.addConstraint(pulp.lpSum(vs) == 1)

        @staticmethod
        def add_eq(lhs: list[Any], rhs: list[Any]) -> None:
            lp.addConstraint(pulp.lpSum(lhs) - pulp.lpSum(rhs) == 0)

        @staticmethod
        def add_ge(a: Any, b: Any) -> None:
            lp.addConstraint(a - b >= 0)

        @staticmethod
        def fix0(v: Any) -> None:
            lp.addConstraint(v == 0)

    x, objective = _build(problem, Api)
    if problem.memory_budget is not None:
        lp.addConstraint(pulp.lpSum(mem * x[n][s] for n, node in enumerate(problem.nodes)
                                    for s, mem in enumerate(node.memory) if mem) <= problem.memory_budget)
    lp.setObjective(pulp.lpSum(c * v for c, v in objective))
    status = lp.solve(_cbc_command(time_limit_s))
    elapsed = time.perf_counter() - start
    if pulp.LpStatus[status] not in ("Optimal", "Not Solved") or any(
            all((v.value() or 0) < 0.5 for v in row) for row in x):
        raise IlpInfeasible(f"CBC status {pulp.LpStatus[status]}")
    choice = tuple(max(range(len(row)), key=lambda s: row[s].value() or 0) for row in x)
    obj = evaluate(problem, choice)
    optimal = pulp.LpStatus[status] == "Optimal" and elapsed < time_limit_s
    # CBC via PuLP does not expose its bound; every node at its cheapest strategy is a valid one.
    bound = obj if optimal else min(obj, _lp_bound(problem))
    return IlpSolution(choice, obj, bound, "optimal" if optimal else "feasible", elapsed, "cbc")


def _cbc_command(time_limit_s: float) -> Any:
    """CBC through PuLP: the ``cbcbox`` binary (``pulp[cbc]``) when present, else PuLP's bundled one."""
    import pulp

    try:
        import cbcbox
        return pulp.COIN_CMD(path=cbcbox.cbc_bin_path(), msg=False, timeLimit=time_limit_s, threads=1)
    except ImportError:
        return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, threads=1)


def _greedy_choice(problem: IlpProblem) -> tuple[int, ...]:
    """Each node's cheapest allowed strategy (ties: the lowest index)."""
    out = []
    for node in problem.nodes:
        allowed = [s for s in range(len(node.cost)) if s not in node.forbidden] or [0]
        out.append(min(allowed, key=lambda s: (node.cost[s], s)))
    return tuple(out)


def _lp_bound(problem: IlpProblem) -> float:
    """Lower bound: every node at its cheapest strategy, no redistribution."""
    return sum(min(n.cost) for n in problem.nodes)
