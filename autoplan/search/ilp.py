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
* ``w[t,a,b] ∈ {0,1}`` for ``a ∈ A_t, b ∈ B_t, a ≠ b, cost(a→b) > 0``: tensor ``t`` is
  produced as ``a`` and redistributed to ``b`` (paid once, however many consumers read ``b``).

Constraints
-----------
1. one strategy per node:                Σ_s x[n,s] = 1
2. redistribution is paid when needed:   w[t,a,b] ≥ Σ_{s: out_t(s)=a} x[p(t),s] + Σ_{s': in_{t,c}(s')=b} x[c,s'] − 1
                                         for every consumer c of t
3. tied nodes choose alike (a parameter and the sink of its gradient; a block's output and
   the next block's input):              x[n,s] = x[m,σ(s)]
4. memory:                               Σ_{n,s} mem[n,s]·x[n,s] + Σ w[t,a,b]·0 ≤ M
5. forbidden choices (a per-layer collective that would leave the NVLink domain):
                                         x[n,s] = 0,  w[t,a,b] = 0

Objective
---------
    min  Σ_{n,s} cost[n,s]·x[n,s]  +  Σ_{t,a,b} redist[t,a,b]·w[t,a,b]

``cost[n,s]``: compute seconds of the node's (merged) ops under strategy s, forward and
backward, recomputation included; ``redist[t,a,b]``: seconds of the collective that turns
placement a into b on the tp group (all-gather, reduce-scatter, all-to-all, all-reduce of
a partial sum; a slice is free).  Because every ``w`` is pushed to its lower bound by the
objective, constraint 2 linearises the product of producer and consumer choices.

Backends: OR-Tools CP-SAT (integer objective, costs scaled to nanoseconds) and PuLP/CBC.
A time limit returns the best solution found, with its optimality gap.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

BACKENDS = ("cpsat", "cbc")
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
    consumers: tuple[tuple[int, tuple[int, ...]], ...]   # (node index, placement id per consumer strategy)
    redist: tuple[tuple[int, int, float], ...]           # (a, b, seconds) for a != b with nonzero cost
    forbidden_redist: tuple[tuple[int, int], ...] = ()   # (a, b) pairs that may not happen


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
        w = sum(len(t.redist) for t in self.tensors)
        c2 = sum(len(t.redist) * len(t.consumers) for t in self.tensors)
        return {"nodes": len(self.nodes), "x_vars": x, "w_vars": w,
                "constraints": len(self.nodes) + c2 + sum(len(s) for _, _, s in self.ties)
                + (1 if self.memory_budget is not None else 0)}


@dataclass(frozen=True)
class IlpSolution:
    choice: tuple[int, ...]          # strategy index per node
    objective: float                 # seconds
    bound: float                     # best lower bound, seconds
    status: str                      # optimal | feasible | infeasible
    solve_seconds: float
    backend: str

    @property
    def gap(self) -> float:
        """Relative optimality gap (objective − bound) / objective."""
        if self.objective <= 0:
            return 0.0
        return max(0.0, (self.objective - self.bound) / self.objective)


class IlpInfeasible(Exception):
    """No strategy assignment satisfies the constraints (e.g. the memory row)."""


def solve(problem: IlpProblem, backend: str = "cpsat", time_limit_s: float = 30.0) -> IlpSolution:
    """Solve ``problem`` with ``backend`` ("cpsat" or "cbc")."""
    if backend == "cpsat":
        return _solve_cpsat(problem, time_limit_s)
    if backend == "cbc":
        return _solve_cbc(problem, time_limit_s)
    raise ValueError(f"unknown ILP backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def evaluate(problem: IlpProblem, choice: Sequence[int]) -> float:
    """Objective value of a full assignment (used by tests and brute force)."""
    total = sum(n.cost[s] for n, s in zip(problem.nodes, choice))
    for t in problem.tensors:
        a = t.out_placement[choice[t.producer]]
        needed = {pl[choice[c]] for c, pl in t.consumers}
        costs = {(ra, rb): sec for ra, rb, sec in t.redist}
        total += sum(costs.get((a, b), 0.0) for b in needed if b != a)
    return total


# --- helpers shared by both backends ------------------------------------------

def _placement_terms(choices: Sequence[int]) -> dict[int, list[int]]:
    """Group strategy indices by the placement id they induce."""
    groups: dict[int, list[int]] = {}
    for s, pl in enumerate(choices):
        groups.setdefault(pl, []).append(s)
    return groups


def _redist_rows(problem: IlpProblem):
    """Yield (tensor index, a, b, seconds, [(producer strategies), (consumer node, its strategies)])."""
    for ti, t in enumerate(problem.tensors):
        prod = _placement_terms(t.out_placement)
        for a, b, sec in t.redist:
            if a not in prod:
                continue
            rows = []
            for c, pl in t.consumers:
                cons = _placement_terms(pl).get(b)
                if cons:
                    rows.append((c, cons))
            if rows:
                yield ti, a, b, sec, prod[a], rows


def _solve_cpsat(problem: IlpProblem, time_limit_s: float) -> IlpSolution:
    from ortools.sat.python import cp_model

    start = time.perf_counter()
    m = cp_model.CpModel()
    x = [[m.NewBoolVar(f"x{n}_{s}") for s in range(len(node.cost))] for n, node in enumerate(problem.nodes)]
    objective = []
    for n, node in enumerate(problem.nodes):
        m.AddExactlyOne(x[n])
        for s in node.forbidden:
            m.Add(x[n][s] == 0)
        objective += [int(round(c * _SCALE)) * x[n][s] for s, c in enumerate(node.cost) if c]
    for ti, a, b, sec, prod, rows in _redist_rows(problem):
        forbidden = (a, b) in problem.tensors[ti].forbidden_redist
        w = m.NewBoolVar(f"w{ti}_{a}_{b}")
        for c, cons in rows:
            m.Add(w >= sum(x[problem.tensors[ti].producer][s] for s in prod)
                  + sum(x[c][s] for s in cons) - 1)
        if forbidden:
            m.Add(w == 0)
        objective.append(int(round(sec * _SCALE)) * w)
    for n, k, sigma in problem.ties:
        for s, t in enumerate(sigma):
            m.Add(x[n][s] == x[k][t])
    if problem.memory_budget is not None:
        # integer memory row: the budget maps to 10^6 units (1 ppm resolution)
        unit = max(problem.memory_budget, 1e-30) / 1e6
        terms = [int(round(mem / unit)) * x[n][s]
                 for n, node in enumerate(problem.nodes) for s, mem in enumerate(node.memory) if mem]
        m.Add(sum(terms) <= 1_000_000)
    m.Minimize(sum(objective))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = 1          # deterministic
    solver.parameters.random_seed = 0
    status = solver.Solve(m)
    elapsed = time.perf_counter() - start
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise IlpInfeasible(f"CP-SAT status {solver.StatusName(status)}")
    choice = tuple(next(s for s, v in enumerate(row) if solver.Value(v)) for row in x)
    obj = evaluate(problem, choice)
    bound = obj if status == cp_model.OPTIMAL else min(obj, solver.BestObjectiveBound() / _SCALE)
    return IlpSolution(choice, obj, bound, "optimal" if status == cp_model.OPTIMAL else "feasible",
                       elapsed, "cpsat")


def _solve_cbc(problem: IlpProblem, time_limit_s: float) -> IlpSolution:
    import pulp

    start = time.perf_counter()
    lp = pulp.LpProblem("sharding", pulp.LpMinimize)
    x = [[lp.add_variable(f"x{n}_{s}", cat="Binary") for s in range(len(node.cost))]
         for n, node in enumerate(problem.nodes)]
    objective = []
    for n, node in enumerate(problem.nodes):
        lp += pulp.lpSum(x[n]) == 1, f"one_{n}"
        for s in node.forbidden:
            lp += x[n][s] == 0, f"forbid_{n}_{s}"
        objective += [c * x[n][s] for s, c in enumerate(node.cost) if c]
    for ti, a, b, sec, prod, rows in _redist_rows(problem):
        w = lp.add_variable(f"w{ti}_{a}_{b}", lowBound=0, upBound=1)   # integral at the optimum
        for c, cons in rows:
            lp += w >= (pulp.lpSum(x[problem.tensors[ti].producer][s] for s in prod)
                        + pulp.lpSum(x[c][s] for s in cons) - 1), f"w{ti}_{a}_{b}_{c}"
        if (a, b) in problem.tensors[ti].forbidden_redist:
            lp += w == 0, f"forbid_w{ti}_{a}_{b}"
        objective.append(sec * w)
    for i, (n, k, sigma) in enumerate(problem.ties):
        for s, t in enumerate(sigma):
            lp += x[n][s] == x[k][t], f"tie_{i}_{s}"
    if problem.memory_budget is not None:
        lp += pulp.lpSum(mem * x[n][s] for n, node in enumerate(problem.nodes)
                         for s, mem in enumerate(node.memory) if mem) <= problem.memory_budget, "memory"
    lp += pulp.lpSum(objective)
    status = lp.solve(_cbc_command(time_limit_s))
    elapsed = time.perf_counter() - start
    if pulp.LpStatus[status] not in ("Optimal", "Not Solved") or any(
            all((v.value() or 0) < 0.5 for v in row) for row in x):
        raise IlpInfeasible(f"CBC status {pulp.LpStatus[status]}")
    choice = tuple(max(range(len(row)), key=lambda s: row[s].value() or 0) for row in x)
    obj = evaluate(problem, choice)
    optimal = pulp.LpStatus[status] == "Optimal" and elapsed < time_limit_s
    # CBC via PuLP does not expose its bound; the LP relaxation is a valid one.
    bound = obj if optimal else min(obj, _lp_bound(problem))
    return IlpSolution(choice, obj, bound, "optimal" if optimal else "feasible", elapsed, "cbc")


def _cbc_command(time_limit_s: float):
    """CBC through PuLP: the ``cbcbox`` binary (``pulp[cbc]``) when present, else PuLP's bundled one."""
    import pulp

    try:
        import cbcbox
        return pulp.COIN_CMD(path=cbcbox.cbc_bin_path(), msg=False, timeLimit=time_limit_s, threads=1)
    except ImportError:
        return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, threads=1)


def _lp_bound(problem: IlpProblem) -> float:
    """Lower bound: every node at its cheapest strategy, no redistribution."""
    return sum(min(n.cost) for n in problem.nodes)
