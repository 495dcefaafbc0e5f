"""``python -m benchmarks list``: every experiment's name and the first line of its docstring.
``python -m benchmarks <name> [args...]``: run that experiment's ``main()`` with the args (as
``python -m benchmarks.<name> [args...]`` does)."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def experiments() -> dict[str, str]:
    """The modules here with a top-level ``main``, by name, each with its docstring's first line (read,
    not imported: listing stays fast and starts nothing)."""
    found = {}
    for path in sorted(HERE.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        tree = ast.parse(path.read_text())
        if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
            found[path.stem] = (ast.get_docstring(tree) or "").split("\n", 1)[0]
    return found


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    known = experiments()
    if args[0] == "list":
        width = max(map(len, known))
        for name, line in known.items():
            print(f"{name:<{width}}  {line}")
        return 0
    name, rest = args[0], args[1:]
    if name not in known:
        print(f"no experiment {name!r} (python -m benchmarks list names them)", file=sys.stderr)
        return 2
    from sagegate.harness.procs import exit_on_sigterm

    exit_on_sigterm()  # a killed experiment stops the servers it started
    module = importlib.import_module(f"benchmarks.{name}")
    sys.argv = [name, *rest]  # each experiment's main() parses sys.argv[1:]
    result = module.main()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
