"""The memo layer itself (costmodels/memo.py): a memoised function and a table remember on their
whole key, bound their size, remember errors, clear through the registry, and under ``audit()``
recompute every hit, so a key that misses an input is caught."""
from dataclasses import dataclass

import numpy as np
import pytest

from costmodels import memo as m

CALLS: list[tuple] = []
GLOBAL = {"scale": 1}          # an input the memo below does not key on: what the audit catches


@m.memo(3)
def _scaled(x: int, *, by: int = 1) -> int:
    CALLS.append((x, by))
    return x * by * GLOBAL["scale"]


def test_a_memoised_function_computes_once_per_whole_key():
    _scaled.cache_clear()
    CALLS.clear()
    assert [_scaled(2), _scaled(2), _scaled(2, by=3), _scaled(2, by=3)] == [2, 2, 6, 6]
    assert CALLS == [(2, 1), (2, 3)]
    assert _scaled.__wrapped__(5) == 5 and _scaled.cache_size() == 2


def test_past_its_limit_a_memo_starts_again_empty():
    _scaled.cache_clear()
    for x in range(3):
        _scaled(x)
    assert _scaled.cache_size() == 3
    _scaled(10)
    assert _scaled.cache_size() == 1


def test_clear_all_empties_functions_and_live_tables():
    _scaled(1)
    table: m.Table[int] = m.Table("test.clear", 10)
    table.get("k", lambda: 1)
    assert f"{__name__}._scaled" in m.REGISTRY and "table:test.clear" in m.REGISTRY
    m.clear_all()
    assert _scaled.cache_size() == 0 and len(table) == 0


def test_a_table_remembers_values_and_listed_errors_and_nothing_else():
    table: m.Table[int] = m.Table("test.table", 2, errors=(KeyError,))
    calls = []

    def compute(x: int) -> int:
        calls.append(x)
        if x < 0:
            raise KeyError(x)
        if x == 0:
            raise ValueError("not remembered")
        return x

    assert table.get(1, lambda: compute(1)) == 1 and table.get(1, lambda: compute(1)) == 1
    for _ in range(2):
        with pytest.raises(KeyError):
            table.get(-1, lambda: compute(-1))
    for _ in range(2):
        with pytest.raises(ValueError):
            table.get(0, lambda: compute(0))
    assert calls == [1, -1, 0, 0]
    assert table.peek(1) == 1 and table.peek(-1) is None and 0 not in table and len(table) == 2
    table.get(2, lambda: compute(2))               # past its limit: starts again empty
    assert len(table) == 1 and 1 not in table


def test_peek_put_and_items_skip_errors():
    table: m.Table[str] = m.Table("test.put", 10, errors=(KeyError,))
    table.put("a", "x")
    with pytest.raises(KeyError):
        table.get("b", lambda: {}["missing"])
    assert table.peek("a") == "x" and table.peek("b") is None and table.items() == [("a", "x")]
    assert "b" in table and len(table) == 2


def test_the_audit_recomputes_hits_and_catches_an_input_missing_from_the_key():
    _scaled.cache_clear()
    GLOBAL["scale"] = 1
    try:
        assert _scaled(4) == 4
        with m.audit() as seen:
            assert _scaled(4) == 4                  # a hit, recomputed: still right
            assert _scaled(4) == 4                  # the same key again: checked once per audit
            assert seen.hits[f"{__name__}._scaled"] == 1
        GLOBAL["scale"] = 2                         # the value moves, its key does not
        with pytest.raises(m.StaleHit, match="_scaled"), m.audit():
            _scaled(4)
        assert _scaled(4) == 4                      # outside the audit the stale value comes back
    finally:
        GLOBAL["scale"] = 1


def test_the_audit_checks_tables_and_their_remembered_errors():
    table: m.Table[float] = m.Table("test.audit", 10, errors=(ValueError,))
    state = {"x": 1.0}
    table.get("k", lambda: state["x"])
    with pytest.raises(ValueError):
        table.get("bad", lambda: float("nope"))
    with m.audit() as seen:
        assert table.get("k", lambda: state["x"]) == 1.0
        with pytest.raises(ValueError):
            table.get("bad", lambda: float("nope"))
    assert seen.hits["test.audit"] == 2
    state["x"] = 1.5
    with pytest.raises(m.StaleHit, match="test.audit"), m.audit():
        table.get("k", lambda: state["x"])
    with pytest.raises(m.StaleHit), m.audit():
        table.get("bad", lambda: 0.0)           # a remembered error that no longer happens
    other: m.Table[float] = m.Table("test.audit", 10)   # another owner's table of the same name
    other.put("k", 1.5)
    with m.audit() as seen:
        table.get("k", lambda: 1.0)
        other.get("k", lambda: 1.5)
    assert seen.hits["test.audit"] == 2             # checked once per table, not per name


@dataclass(frozen=True, eq=False)
class _Shape:
    rows: np.ndarray
    seconds: float
    solve_seconds: float


class _Opaque:
    """Equal only to itself, as a solver's model object is."""

    __slots__ = ("terms",)

    def __init__(self, terms: dict) -> None:
        self.terms = terms


def test_same_is_exact_and_structural():
    assert m.same(0.1 + 0.2, 0.1 + 0.2) and not m.same(0.1 + 0.2, 0.3)
    assert m.same(_Opaque({"a": 1.0}), _Opaque({"a": 1.0})) and not m.same(_Opaque({"a": 1.0}), _Opaque({"a": 2.0}))
    assert m.same(float("nan"), float("nan")) and not m.same(1, 1.0)
    assert m.same([(1, {"a": np.arange(3.0)})], [(1, {"a": np.arange(3.0)})])
    assert not m.same(np.arange(3.0), np.arange(3))                  # another dtype
    assert not m.same(np.array([1.0, 2.0]), np.array([1.0, 2.0 + 1e-15]))
    a, b = _Shape(np.ones(2), 1.0, 0.5), _Shape(np.ones(2), 1.0, 0.7)
    assert a != b and not m.same(a, b) and m.same(a, b, volatile=("solve_seconds",))
    assert not m.same(_Shape(np.ones(2), 1.0, 0.5), _Shape(np.zeros(2), 1.0, 0.5), ("solve_seconds",))
