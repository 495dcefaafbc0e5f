"""Name → factory registry with typed parameters.

``parse_policy("fastserve:base_quantum_ms=10,queues=4")`` builds a policy from a spec string; every
parameter is a typed keyword of the policy's ``__init__``, its bounds declared beside it
(:mod:`policies.params`), and a bad name or value fails with a message that lists what is valid.
Policies register with the :func:`register` decorator.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints

from sagegate.policies.base import Policy
from sagegate.policies.params import Bound, bounds_of, is_checked

P = TypeVar("P", bound=type[Policy])


class PolicySpecError(ValueError):
    """A policy spec names an unknown policy or a bad parameter."""


@dataclass(frozen=True)
class ParamInfo:
    name: str
    type: Any
    """The annotation less its bounds: ``int``, ``float``, ``bool``, ``str`` or ``X | None``."""
    default: Any
    bound: Bound | None = None
    """The declared bounds (checked by the policy's ``__init__``), if any."""

    def describe(self) -> str:
        bound = f" {self.bound.range.describe()}" if self.bound is not None else ""
        return f"{self.name}: {_type_name(self.type)}{bound} = {self.default!r}"


@dataclass(frozen=True)
class PolicyInfo:
    name: str
    cls: type[Policy]
    params: tuple[ParamInfo, ...]
    summary: str


_REGISTRY: dict[str, PolicyInfo] = {}


def register(name: str) -> Callable[[P], P]:
    def deco(cls: P) -> P:
        if name in _REGISTRY:
            raise RuntimeError(f"policy {name!r} registered twice")
        cls.name = name
        _REGISTRY[name] = PolicyInfo(name, cls, _params_of(cls), _first_line(cls.__doc__))
        return cls

    return deco


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if doc else ""


def _params_of(cls: type[Policy]) -> tuple[ParamInfo, ...]:
    init = cls.__init__
    sig = inspect.signature(init)
    hints = get_type_hints(init)
    bounds = bounds_of(init)
    if bounds and not is_checked(init):
        raise RuntimeError(f"{cls.__name__}.__init__ declares bounds but is not decorated with @checked")
    out = []
    for p in sig.parameters.values():
        if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is inspect.Parameter.empty:
            raise RuntimeError(f"{cls.__name__}.{p.name} needs a default (policies take keywords only)")
        out.append(ParamInfo(p.name, hints.get(p.name, type(p.default)), p.default, bounds.get(p.name)))
    return tuple(out)


def _load_all() -> None:
    """Import every module that registers policies (import is the registration)."""
    import sagegate.policies.catalog  # noqa: F401


def registry() -> dict[str, PolicyInfo]:
    _load_all()
    return dict(_REGISTRY)


def names() -> list[str]:
    return sorted(registry())


def parse_policy(spec: str, defaults: Mapping[str, Any] | None = None, **overrides: Any) -> Policy:
    """Build a policy from ``"name"`` or ``"name:key=value,key=value"``. ``defaults`` replace the
    policy's own defaults for the parameters it has and the spec does not set; ``overrides`` win
    over the spec."""
    name, _, arg_text = spec.strip().partition(":")
    reg = registry()
    if name not in reg:
        raise PolicySpecError(f"unknown policy {name!r}; valid policies: {', '.join(sorted(reg))}")
    info = reg[name]
    known = {p.name for p in info.params}
    kwargs: dict[str, Any] = {k: v for k, v in (defaults or {}).items() if k in known}
    for part in filter(None, (s.strip() for s in arg_text.split(","))):
        key, eq, raw = part.partition("=")
        key = key.strip().replace("-", "_")
        if not eq:
            raise PolicySpecError(f"policy parameter {part!r} must be key=value")
        kwargs[key] = raw.strip()
    kwargs.update(overrides)
    return build(info, kwargs)


def build(info: PolicyInfo, raw: dict[str, Any]) -> Policy:
    by_name = {p.name: p for p in info.params}
    valid = ", ".join(p.describe() for p in info.params) or "none"
    typed: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in by_name:
            raise PolicySpecError(f"policy {info.name!r} has no parameter {key!r}; valid parameters: {valid}")
        typed[key] = _coerce(info.name, by_name[key], value, valid)
    try:
        return info.cls(**typed)
    except ValueError as exc:
        raise PolicySpecError(f"policy {info.name!r}: {exc}; valid parameters: {valid}") from exc


def _type_name(t: Any) -> str:
    if _optional_of(t) is not None:
        return " | ".join(_type_name(a) for a in typing.get_args(t))
    return "None" if t is type(None) else getattr(t, "__name__", str(t))


def _optional_of(t: Any) -> Any:
    """``X`` for an ``X | None`` annotation, else None."""
    if typing.get_origin(t) not in (typing.Union, types.UnionType):
        return None
    args = [a for a in typing.get_args(t) if a is not type(None)]
    return args[0] if len(args) == 1 and len(args) < len(typing.get_args(t)) else None


def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low not in _TRUE | _FALSE:
        raise ValueError(text)
    return low in _TRUE


_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})
_NONE = frozenset({"none", "null", ""})
_PARSERS: dict[Any, Callable[[str], Any]] = {bool: _parse_bool, int: int, float: float, str: str}
"""How a spec's text becomes each parameter type; ``X | None`` also takes ``none``/``null``/empty."""


def _coerce(policy: str, param: ParamInfo, value: Any, valid: str) -> Any:
    """A spec's text as the parameter's type (values that are not text pass as they are)."""
    if not isinstance(value, str):
        return value
    inner = _optional_of(param.type)
    try:
        if inner is not None:
            if value.lower() in _NONE:
                return None
            return _PARSERS.get(inner, float)(value)
        return _PARSERS.get(param.type, float)(value)
    except ValueError as exc:
        raise PolicySpecError(
            f"policy {policy!r}: {param.name}={value!r} is not a valid {_type_name(param.type)}; "
            f"valid parameters: {valid}"
        ) from exc
