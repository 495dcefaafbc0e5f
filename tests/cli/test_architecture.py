"""The floors: who may import whom (docs/architecture.md). A change that reaches up a floor fails here."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("core", "loadgen", "policies", "predictor", "sim", "gateway", "study")
PACKAGES = (*PRODUCT, "harness", "sagegate")
"""The floors: ``sagegate.<name>`` for each, and ``sagegate`` itself (the command line: the modules
directly in ``sagegate/``)."""
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "loadgen": {"core"},
    "policies": {"core"},
    "predictor": {"core"},
    "sim": {"core", "policies"},
    "gateway": {"core", "policies", "predictor"},
    "study": {"core", "loadgen", "policies", "predictor", "sim"},
    "harness": set(PRODUCT),
    "sagegate": set(PACKAGES),
}
LAB = ("benchmarks", "tools")
"""Beside the floors, with ``tests``: they may import any package, and no package imports them."""


def floor(module: str) -> str:
    """The floor of a project module (``sagegate.sim.des`` → ``sim``; ``sagegate.cli`` → ``sagegate``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else parts[0]


def imports_of(path: Path, *, top_level_only: bool = False) -> set[str]:
    """Project modules ``path`` imports (all of them, or only those imported when it loads);
    ``from pkg import sub`` counts as importing the submodule ``pkg.sub``."""
    known = modules()
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & set(known)
            out.update(subs or {node.module})
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.split(".")[0] == "sagegate"}


def import_roots(path: Path) -> set[str]:
    """The top-level names of every absolute import in ``path`` (project or not)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
    return out


@cache
def modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "sagegate").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


@pytest.mark.parametrize("pkg", PACKAGES)
def test_a_package_imports_only_the_floors_below_it(pkg: str) -> None:
    bad = []
    for name, path in modules().items():
        if floor(name) != pkg:
            continue
        for target in imports_of(path):
            if floor(target) != pkg and floor(target) not in ALLOWED[pkg]:
                bad.append(f"{name} imports {target}")
    assert not bad, "\n".join(bad)


def test_no_package_imports_the_lab() -> None:
    """``benchmarks`` and ``tools`` use the packages; no package, the harness included, uses them."""
    bad = [
        f"{name} imports {root}" for name, path in modules().items() for root in import_roots(path) & set(LAB)
    ]
    assert not bad, "\n".join(bad)


def test_nothing_outside_tests_imports_tests() -> None:
    bad = [
        str(path.relative_to(ROOT))
        for top in ("sagegate", *LAB)
        for path in (ROOT / top).rglob("*.py")
        if "tests" in import_roots(path)
    ]
    assert not bad, bad


def test_the_wheel_installs_one_distinctive_top_level_package() -> None:
    """Installing sagegate shadows no other distribution's ``core``, ``sim`` or ``tools``: every
    package it ships is under ``sagegate``, and no test fixture ships with it."""
    import tomllib

    from setuptools import find_packages

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    shipped = find_packages(ROOT, include=cfg["include"], exclude=cfg.get("exclude", ()))
    assert shipped and all(p == "sagegate" or p.startswith("sagegate.") for p in shipped), shipped
    assert {f"sagegate.{p}" for p in PRODUCT} <= set(shipped)
    assert not any("fake" in path.stem for path in (ROOT / "sagegate").rglob("*.py"))


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """The import circles of ``graph`` (module → the modules it imports), each written out."""
    state: dict[str, int] = {}
    found: list[str] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return found


def test_no_import_circles_when_modules_load() -> None:
    """Module-level imports form no cycle (a late import inside a function, e.g. registration, is fine)."""
    mods = modules()
    graph = {
        name: {t for t in imports_of(path, top_level_only=True) if t in mods} for name, path in mods.items()
    }
    found = cycles(graph)
    assert not found, "\n".join(found)


RELAY = ("proxy", "stream", "resume", "relay_ports", "continuation", "sse", "director")


def test_the_relay_imports_one_way() -> None:
    """The relay's modules (a try, its stream, its resume) form no circle even counting imports made
    only for type checking: each talks to the one above through ``gateway.relay_ports``."""
    names = {f"sagegate.gateway.{m}" for m in RELAY}
    mods = modules()
    found = cycles({n: {t for t in imports_of(mods[n]) if t in names and t != n} for n in names})
    assert not found, "\n".join(found)


MAX_LINES = 450
"""A module past ~400 lines is doing more than one job (docs/architecture.md); this leaves some slack."""


def test_no_module_is_long() -> None:
    long = {
        name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long
