"""``sagegate policies``: the registry, with each policy's levels and typed parameters."""

from __future__ import annotations

from typing import Annotated

import typer


def policies(as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False) -> None:
    """List every registered scheduling policy with its levels and parameters."""
    import json

    from sagegate.policies.registry import registry

    reg = registry()
    if as_json:
        out = {
            name: {
                "levels": sorted(info.cls.levels),
                "summary": info.summary,
                "params": {
                    p.name: {"type": getattr(p.type, "__name__", str(p.type)), "default": p.default}
                    for p in info.params
                },
            }
            for name, info in sorted(reg.items())
        }
        typer.echo(json.dumps(out, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Scheduling policies")
    table.add_column("policy")
    table.add_column("levels")
    table.add_column("parameters")
    table.add_column("what it does")
    for name, info in sorted(reg.items()):
        params = ", ".join(f"{p.name}={p.default!r}" for p in info.params) or "-"
        table.add_row(name, "/".join(sorted(info.cls.levels)), params, info.summary)
    Console().print(table)
