"""The ``sagegate`` command line: thin commands that parse flags and call the packages.

Every command imports what it needs inside its own function, so ``sagegate simulate`` never pays for
torch or FastAPI.
"""

from __future__ import annotations

import typer

from sagegate import cmd_demo, cmd_policies, cmd_simulate

app = typer.Typer(
    help="An LLM scheduling gateway with a vLLM-like engine simulator.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command("simulate")(cmd_simulate.simulate)
app.command("policies")(cmd_policies.policies)
app.command("demo")(cmd_demo.demo)


def _register_optional() -> None:
    """Commands whose modules may be absent in a partial checkout register when present."""
    try:
        from sagegate import cmd_backend

        app.command("backend")(cmd_backend.backend)
    except ImportError:  # pragma: no cover
        pass
    try:
        from sagegate import cmd_study

        app.command("study")(cmd_study.study)
    except ImportError:  # pragma: no cover
        pass
    try:
        from sagegate import cmd_serve

        app.command("serve")(cmd_serve.serve)
    except ImportError:  # pragma: no cover
        pass
    try:
        from sagegate.cmd_replay import replay_app

        app.add_typer(replay_app, name="replay", help="Replay a trace against an endpoint; compare and plot.")
    except ImportError:  # pragma: no cover
        pass
    try:
        from sagegate.cmd_predictor import predictor_app

        app.add_typer(predictor_app, name="predictor", help="The semantic output-length predictor.")
    except ImportError:  # pragma: no cover
        pass


_register_optional()

if __name__ == "__main__":  # pragma: no cover
    app()
