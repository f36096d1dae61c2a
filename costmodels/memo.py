"""One memo layer: every cache the cost model and the search keep goes through here.

A cache is right when its key holds every input its value depends on.  Here the key *is* the
input: a memoised function is called with hashable values (numbers, strings, tuples, frozen
dataclasses hashed whole) and keyed on all of its arguments, so no key is listed by hand and none
is built from ``id()``.  Where a value depends on part of a record (a graph's price reads the
plan's tp, cp, ep and micro-batch size, not its pipeline degree), the caller passes that part as
a record of its own (e.g. ``cost.memo.PartKey``) and the function reads nothing else.

Two forms, one size policy (a bound on entries; past it the table starts again empty, which
costs a few recomputations and never a wrong value):

* ``memo(limit)``: a decorator for a module-level pure function (where ``functools.lru_cache``
  was), keyed on the call's arguments;
* ``Table(name, limit)``: a table an object owns (an Estimator's parts, a search's estimates),
  ``table.get(key, compute)``; ``errors=`` lists exception types remembered and raised again.

Every memo registers itself by name in ``REGISTRY``: ``clear_all()`` empties them,
``tests/costmodels/test_memo.py`` and ``tests/autoplan/cost/test_memo_keys.py`` find them all.
"""
from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Hashable, TypeVar

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

REGISTRY: dict[str, Callable[[], None]] = {}        # name -> its clear(); functions and table kinds
_TABLES: "weakref.WeakSet[Table[Any]]" = weakref.WeakSet()


def memo(limit: int) -> Callable[[F], F]:
    """Memoise a pure module-level function on all its arguments, at most ``limit`` entries."""
    def wrap(fn: F) -> F:
        table: dict[Hashable, Any] = {}

        @functools.wraps(fn)
        def cached(*args: Hashable, **kwargs: Hashable) -> Any:
            key = (args, tuple(sorted(kwargs.items()))) if kwargs else args
            try:
                return table[key]
            except KeyError:
                pass
            value = fn(*args, **kwargs)
            if len(table) >= limit:
                table.clear()
            table[key] = value
            return value

        cached.cache_clear = table.clear            # type: ignore[attr-defined]
        cached.cache_size = table.__len__           # type: ignore[attr-defined]
        REGISTRY[f"{fn.__module__}.{fn.__qualname__}"] = table.clear
        return cached                               # type: ignore[return-value]
    return wrap


@dataclass(eq=False)
class Table(Generic[T]):
    """A memo table one object owns: ``get(key, compute)`` is ``compute()`` remembered under
    ``key`` (a hashable value holding every input ``compute`` reads that the owner does not fix).
    Exceptions of the types in ``errors`` are remembered too and raised again."""

    name: str
    limit: int
    errors: tuple[type[BaseException], ...] = ()
    _entries: dict[Hashable, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        _TABLES.add(self)
        # ignore[misc]: mypy cannot infer the type of a lambda whose parameter has a default
        REGISTRY.setdefault(f"table:{self.name}", lambda name=self.name: _clear_tables(name))  # type: ignore[misc]

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        try:
            hit = self._entries[key]
        except KeyError:
            try:
                hit = compute()
            except self.errors as err:
                hit = _Raised(err)
            if len(self._entries) >= self.limit:
                self._entries.clear()
            self._entries[key] = hit
        if isinstance(hit, _Raised):
            raise hit.error
        return hit  # type: ignore[no-any-return]

    def peek(self, key: Hashable) -> T | None:
        """The value under ``key`` if remembered (an error counts as none), else None."""
        hit = self._entries.get(key)
        return None if isinstance(hit, _Raised) else hit

    def put(self, key: Hashable, value: T) -> None:
        if len(self._entries) >= self.limit:
            self._entries.clear()
        self._entries[key] = value

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[Hashable, T]]:
        return [(k, v) for k, v in self._entries.items() if not isinstance(v, _Raised)]

    def clear(self) -> None:
        self._entries.clear()


@dataclass(frozen=True)
class _Raised:
    error: BaseException


def _clear_tables(name: str) -> None:
    for table in list(_TABLES):
        if table.name == name:
            table.clear()


def clear_all() -> None:
    """Empty every memo (module functions and every live table)."""
    for clear in REGISTRY.values():
        clear()
