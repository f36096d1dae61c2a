"""One memo layer: every cache the cost model and the search keep goes through here.

A cache is right when its key holds every input its value depends on.  Here the key *is* the
input: a memoised function is called with hashable values (numbers, strings, tuples, frozen
dataclasses hashed whole) and keyed on all of its arguments, so no key is listed by hand and none
is built from ``id()``.  Where a value depends on part of a record (a graph's price reads the
plan's tp, cp, ep and micro-batch size, not its pipeline degree), the caller passes that part as
a record of its own (e.g. ``autoplan.cost.memo.PartKey``), projected from the plan by one
function beside the pricer it serves.

Two forms, one size policy (a bound on entries; past it the table starts again empty, which
costs a few recomputations and never a wrong value):

* ``memo(limit)``: a decorator for a module-level pure function (where ``functools.lru_cache``
  was), keyed on the call's arguments; ``memo(limit, shared=True)`` also shares its results with
  the processes a search forks, through the pickle directory of ``costmodels.pipeline.shared``
  (a miss reads a sibling's result before computing);
* ``Table(name, limit)``: a table an object owns (an Estimator's parts, a search's estimates),
  ``table.get(key, compute)``, keyed on what ``compute`` reads that the owner does not fix;
  ``errors=`` lists exception types remembered and raised again.

``audit()`` checks the keys: under it every hit (each key once per audit) is recomputed and
compared with the value it returns (``same``: exact, numpy arrays element by element, fields
named in ``volatile`` — wall seconds of a solve — skipped), and a difference raises
``StaleHit``: a key that misses an input the value depends on.
``tests/autoplan/cost/test_memo_keys.py`` prices plans differing in one input each under it.
Every memo registers itself by name in ``REGISTRY``: ``clear_all()`` empties them all.

Outside this layer, by design: the vocabulary's tiny pure functions of a few ints and strings
(``autoplan.plan``'s stage splits, ``autoplan.mesh``'s rank groups) keep ``functools.lru_cache``
(also keyed on every argument; at ~300k lookups a search, the Python wrapper here would cost more
than they do), and ``topologies`` (below this package) caches its data files the same way.
"""
from __future__ import annotations

import dataclasses
import functools
import weakref
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Generic, TypeVar

import numpy as np

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

REGISTRY: dict[str, Callable[[], None]] = {}        # name -> its clear(); functions and table kinds
_TABLES: weakref.WeakSet[Table[Any]] = weakref.WeakSet()
_MISSING = object()


class StaleHit(AssertionError):
    """A memo returned a value its inputs no longer give: its key misses an input."""


class Audit:
    """What an ``audit()`` checked: hits recomputed per memo name.  Each (memo, key) is
    recomputed once per audit: open one audit per changed input."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self._checked: set[tuple[object, Hashable]] = set()

    def check(self, owner: object, name: str, key: Hashable, stored: Any, compute: Callable[[], Any],
              equal: Callable[[Any, Any], bool]) -> None:
        """Recompute a hit of ``name`` (a memo of ``owner``) under ``key`` and raise ``StaleHit``
        where it differs; once per (owner, key)."""
        if (owner, key) in self._checked:
            return
        self._checked.add((owner, key))
        self.hits[name] += 1
        try:
            fresh: Any = compute()
        except Exception as err:           # a remembered error must be raised again alike
            fresh = _Raised(err)
        if not equal(stored, fresh):
            raise StaleHit(f"memo {name}: the value under key {key!r} is stale\n"
                           f"  stored: {_short(stored)}\n  fresh:  {_short(fresh)}")


_AUDIT: ContextVar[Audit | None] = ContextVar("memo_audit", default=None)


@contextmanager
def audit() -> Iterator[Audit]:
    """Recompute every memo hit while open and compare it with the stored value (module docstring)."""
    record = Audit()
    token = _AUDIT.set(record)
    try:
        yield record
    finally:
        _AUDIT.reset(token)


def memo(limit: int, *, shared: bool = False, volatile: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Memoise a pure module-level function on all its arguments, at most ``limit`` entries;
    ``shared``: through the search's sharing directory too (positional arguments of stable
    ``repr`` only); ``volatile``: fields the audit does not compare."""
    def wrap(fn: F) -> F:
        name = f"{fn.__module__}.{fn.__qualname__}"
        table: dict[Hashable, Any] = {}
        equal = functools.partial(same, volatile=volatile)
        build: Callable[..., Any] = fn
        if shared:
            # imported here: the directory's module sits in costmodels.pipeline, whose modules
            # import this one
            from costmodels.pipeline.shared import read_or_build
            label = f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"

            def build(*args: Any) -> Any:
                return read_or_build(label, args, lambda: fn(*args))

        @functools.wraps(fn)
        def cached(*args: Any, **kwargs: Any) -> Any:
            key = (args, tuple(sorted(kwargs.items()))) if kwargs else args
            hit = table.get(key, _MISSING)
            if hit is _MISSING:
                hit = build(*args, **kwargs)
                if len(table) >= limit:
                    table.clear()
                table[key] = hit
                return hit
            record = _AUDIT.get()
            if record is not None:
                record.check(name, name, key, hit, lambda: fn(*args, **kwargs), equal)
            return hit

        cached.cache_clear = table.clear            # type: ignore[attr-defined]
        cached.cache_size = table.__len__           # type: ignore[attr-defined]
        REGISTRY[name] = table.clear
        return cached                               # type: ignore[return-value]
    return wrap


class Table(Generic[T]):
    """A memo table one object owns: ``get(key, compute)`` is ``compute()`` remembered under
    ``key`` (a hashable value holding every input ``compute`` reads that the owner does not fix).
    Exceptions of the types in ``errors`` are remembered too and raised again; ``volatile``:
    fields the audit does not compare (wall seconds); ``compare``: how the audit compares values
    that are not plain data (a solver's model), in place of ``same``."""

    __slots__ = ("name", "limit", "errors", "_equal", "_entries", "__weakref__")

    def __init__(self, name: str, limit: int, *, errors: tuple[type[BaseException], ...] = (),
                 volatile: tuple[str, ...] = (), compare: Callable[[Any, Any], bool] | None = None) -> None:
        self.name = name
        self.limit = limit
        self.errors = errors
        self._equal = compare or functools.partial(same, volatile=volatile)
        self._entries: dict[Hashable, Any] = {}
        _TABLES.add(self)
        REGISTRY.setdefault(f"table:{name}", functools.partial(_clear_tables, name))

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        hit = self._entries.get(key, _MISSING)
        if hit is _MISSING:
            try:
                hit = compute()
            except self.errors as err:
                hit = _Raised(err)
            self.put(key, hit)
        else:
            record = _AUDIT.get()
            if record is not None:
                record.check(self, self.name, key, hit, compute, self._equal)
        if type(hit) is _Raised:
            raise hit.error
        return hit  # type: ignore[no-any-return]

    def peek(self, key: Hashable) -> T | None:
        """The value under ``key`` if remembered (an error counts as none), else None; not audited."""
        hit = self._entries.get(key)
        return None if type(hit) is _Raised else hit

    def put(self, key: Hashable, value: T) -> None:
        """Remember ``value`` under ``key`` (what a batch computed for many keys at once)."""
        if len(self._entries) >= self.limit:
            self._entries.clear()
        self._entries[key] = value

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[Hashable, T]]:
        """The remembered (key, value) pairs, errors left out."""
        return [(k, v) for k, v in self._entries.items() if type(v) is not _Raised]

    def clear(self) -> None:
        self._entries.clear()


def kept_hash(record: Any, whole: Callable[[Any], Hashable] | None = None) -> int:
    """The hash of a frozen record that keys memos many times, computed once and kept on it:
    ``whole(record)``, by default every field.  The record's ``__hash__`` returns this and its
    ``__getstate__`` is ``without_kept_hash``."""
    known = record.__dict__.get("_hash")
    if known is None:
        known = hash(whole(record) if whole is not None else
                     tuple(getattr(record, f.name) for f in dataclasses.fields(record)))
        object.__setattr__(record, "_hash", known)
    return known  # type: ignore[no-any-return]


def without_kept_hash(record: Any) -> dict[str, Any]:
    """A record's pickled state without its kept hash: another process may hash strings otherwise."""
    return {k: v for k, v in record.__dict__.items() if k != "_hash"}


@dataclasses.dataclass(frozen=True)
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


def same(a: Any, b: Any, volatile: tuple[str, ...] = ()) -> bool:
    """Whether two computed values are equal: by ``==`` where it says so (at C speed), else
    floats exactly (NaN equals NaN), numpy arrays element by element, dataclasses field by field
    (``volatile`` fields skipped; their own equality, e.g. by identity, does not count),
    containers entry by entry, errors by type and text, other objects attribute by attribute
    where their ``==`` is identity."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        if (a == b) is True:                # value equality, where it holds, settles it at C speed
            return True
    except ValueError:                      # an array inside: compared below
        pass
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and bool(np.all((a == b) | _both_nan(a, b)))
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y, volatile) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(v, b[k], volatile) for k, v in a.items())
    if isinstance(a, _Raised):
        return type(a.error) is type(b.error) and str(a.error) == str(b.error)
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name), volatile)
                   for f in dataclasses.fields(a) if f.name not in volatile)
    if type(a).__eq__ is object.__eq__:    # type: ignore[comparison-overlap]  # identity is the question
        return same(_attributes(a), _attributes(b), volatile)
    return bool(a == b)


def _attributes(x: Any) -> dict[str, Any]:
    slots = [s for cls in type(x).__mro__ for s in getattr(cls, "__slots__", ())]
    return {**getattr(x, "__dict__", {}), **{s: getattr(x, s) for s in slots if hasattr(x, s)}}


def _both_nan(a: np.ndarray, b: np.ndarray) -> np.ndarray | bool:
    return np.isnan(a) & np.isnan(b) if a.dtype.kind in "fc" else False


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 400 else text[:400] + "…"
