"""Name → factory registry with typed parameters.

``parse_policy("fastserve:base_quantum_ms=10,levels=4")`` builds a policy from a spec string; every
parameter is a typed keyword of the policy's ``__init__`` and a bad name or value fails with a message
that lists what is valid. Policies register with the :func:`register` decorator.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints

from policies.base import Policy

P = TypeVar("P", bound=type[Policy])


class PolicySpecError(ValueError):
    """A policy spec names an unknown policy or a bad parameter."""


@dataclass(frozen=True)
class ParamInfo:
    name: str
    type: type
    default: Any


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
    sig = inspect.signature(cls.__init__)
    hints = get_type_hints(cls.__init__)
    out = []
    for p in sig.parameters.values():
        if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is inspect.Parameter.empty:
            raise RuntimeError(f"{cls.__name__}.{p.name} needs a default (policies take keywords only)")
        out.append(ParamInfo(p.name, hints.get(p.name, type(p.default)), p.default))
    return tuple(out)


def _load_all() -> None:
    """Import every module that registers policies (import is the registration)."""
    import policies.catalog  # noqa: F401


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
    valid = ", ".join(f"{p.name}: {_type_name(p.type)} = {p.default!r}" for p in info.params) or "none"
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
    return getattr(t, "__name__", str(t))


def _coerce(policy: str, param: ParamInfo, value: Any, valid: str) -> Any:
    if not isinstance(value, str):
        return value
    t = param.type
    try:
        if t is bool:
            low = value.lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return low in ("true", "1", "yes")
        if t in (int, float, str):
            return t(value)
        if value.lower() in ("none", "null", ""):
            return None
        # Optional[float] and similar unions: try float, then int.
        return float(value)
    except ValueError as exc:
        raise PolicySpecError(
            f"policy {policy!r}: {param.name}={value!r} is not a valid {_type_name(t)}; "
            f"valid parameters: {valid}"
        ) from exc
