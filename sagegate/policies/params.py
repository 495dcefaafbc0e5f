"""Declared bounds on a policy's parameters, checked when the policy is built.

A policy annotates each bounded keyword of its ``__init__`` (``queues: Annotated[int, Range(ge=1)]``)
and decorates the ``__init__`` with :func:`checked`, so the bound is stated once, next to the
parameter, and read by three parties: the check (a ``ValueError`` naming the parameter, its bound
and the value), the registry (which lists it among the valid parameters) and readers of the code.
"""

from __future__ import annotations

import functools
import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, get_type_hints

F = TypeVar("F", bound=Callable[..., None])


@dataclass(frozen=True, slots=True)
class Range:
    """A numeric parameter's bounds (any of ``gt``, ``ge``, ``lt``, ``le``); NaN never lies in one.

    ``note`` says what a boundary value means (``"0 = support points only"``). A parameter typed
    ``X | None`` may also be None.
    """

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    note: str = ""

    def holds(self, value: float) -> bool:
        return not (
            math.isnan(value)
            or (self.gt is not None and not value > self.gt)
            or (self.ge is not None and not value >= self.ge)
            or (self.lt is not None and not value < self.lt)
            or (self.le is not None and not value <= self.le)
        )

    def describe(self) -> str:
        """The bound in words: ``positive``, ``>= 1``, ``in (0, 1]``, ``a number``."""
        low = ("(", self.gt) if self.gt is not None else ("[", self.ge) if self.ge is not None else None
        high = (")", self.lt) if self.lt is not None else ("]", self.le) if self.le is not None else None
        if low and high:
            text = f"in {low[0]}{_num(low[1])}, {_num(high[1])}{high[0]}"
        elif low:
            text = "positive" if low == ("(", 0) else f"{'>' if low[0] == '(' else '>='} {_num(low[1])}"
        elif high:
            text = f"{'<' if high[0] == ')' else '<='} {_num(high[1])}"
        else:
            text = "a number"
        return f"{text} ({self.note})" if self.note else text

    def check(self, name: str, value: Any, *, optional: bool = False) -> None:
        """Raise ``ValueError`` unless ``value`` lies in the range (or is None, when ``optional``)."""
        if value is None and optional:
            return
        if not self.holds(value):
            also = " or None" if optional else ""
            raise ValueError(f"{name} must be {self.describe()}{also}, got {value!r}")


def _num(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True, slots=True)
class Bound:
    """One parameter's declared :class:`Range`, and whether None is also allowed."""

    range: Range
    optional: bool

    def check(self, name: str, value: Any) -> None:
        self.range.check(name, value, optional=self.optional)


def bounds_of(func: Callable[..., Any]) -> dict[str, Bound]:
    """The parameters of ``func`` annotated with a :class:`Range`, by name (in declaration order).

    ``Annotated[float | None, Range(...)]`` and ``Annotated[float, Range(...)] | None`` both allow None."""
    hints = get_type_hints(inspect.unwrap(func), include_extras=True)
    out: dict[str, Bound] = {}
    for name, hint in hints.items():
        optional = _allows_none(hint)
        members = typing.get_args(hint) if _is_union(hint) else (hint,)
        for member in members:
            if typing.get_origin(member) is Annotated:
                base, *extras = typing.get_args(member)
                ranges = [e for e in extras if isinstance(e, Range)]
                if ranges:
                    out[name] = Bound(ranges[0], optional or _allows_none(base))
    return out


def _is_union(t: Any) -> bool:
    return typing.get_origin(t) in (typing.Union, types.UnionType)


def _allows_none(t: Any) -> bool:
    return _is_union(t) and type(None) in typing.get_args(t)


Positive = Annotated[float, Range(gt=0)]
NonNegative = Annotated[float, Range(ge=0)]


_CHECKED: set[Callable[..., Any]] = set()


def checked(init: F) -> F:
    """Decorate a policy's ``__init__``: its :class:`Range`-annotated parameters are checked first.

    The annotations are read on the first call (the module has finished importing by then)."""
    sig = inspect.signature(init)
    bounds: dict[str, Bound] | None = None

    @functools.wraps(init)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        nonlocal bounds
        if bounds is None:
            bounds = bounds_of(init)
        call = sig.bind(*args, **kwargs)
        call.apply_defaults()
        check_values(bounds, call.arguments)
        init(*args, **kwargs)

    _CHECKED.add(wrapper)
    return typing.cast(F, wrapper)


def check_values(bounds: Mapping[str, Bound], values: Mapping[str, Any]) -> None:
    """Check ``values`` against ``bounds`` in declaration order (the first violation raises)."""
    for name, bound in bounds.items():
        if name in values:
            bound.check(name, values[name])


def is_checked(func: Callable[..., Any]) -> bool:
    """Whether ``func`` was decorated with :func:`checked`."""
    return func in _CHECKED
