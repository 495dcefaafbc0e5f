"""Placement plugins by name: adding one is a module and one line here (docs/placement.md).

A name not listed may be ``package.module:Class`` (a plugin outside this package: a class made with
no arguments that keeps ``policies.placement.plugins``'s interface)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from sagegate.policies.placement.forecast import Forecast
from sagegate.policies.placement.pickers import Incumbent, MaxScore
from sagegate.policies.placement.scorers.fewest_running import FewestRunning
from sagegate.policies.placement.scorers.least_held import LeastHeld
from sagegate.policies.placement.scorers.prefix_hit import PrefixHit
from sagegate.policies.placement.scorers.queued_prefill import QueuedPrefill
from sagegate.policies.placement.scorers.room import Room

SCORERS: dict[str, Callable[[], Any]] = {
    "prefix_hit": PrefixHit,
    "queued_prefill": QueuedPrefill,
    "room": Room,
    "least_held": LeastHeld,
    "fewest_running": FewestRunning,
}
PICKERS: dict[str, Callable[[], Any]] = {
    "incumbent": Incumbent,
    "max_score": MaxScore,
    "forecast": Forecast,
}
FILTERS: dict[str, Callable[[], Any]] = {}
"""Filters a profile may add to the admission rule's own (none are built in yet)."""


def make_plugin(kind: str, name: str, table: Mapping[str, Callable[[], Any]], method: str) -> Any:
    """The plugin ``name`` of ``kind`` (``table``'s, or ``module:Class``); a ValueError that names
    what exists when it is unknown or lacks ``method``."""
    if name in table:
        return table[name]()
    if ":" not in name:
        known = ", ".join(sorted(table)) or "none built in"
        raise ValueError(f"unknown placement {kind} {name!r} (known: {known}; or module:Class)")
    module, _, attr = name.partition(":")
    try:
        plugin = getattr(importlib.import_module(module), attr)()
    except Exception as e:  # whatever its import or constructor raises: a config error, not a crash
        raise ValueError(f"placement {kind} {name!r} could not be made: {e}") from e
    if not callable(getattr(plugin, method, None)):
        raise ValueError(f"placement {kind} {name!r} has no {method}() method")
    return plugin
