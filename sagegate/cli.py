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


def _register() -> None:
    """The command groups. A module that fails to import fails the whole command line loudly: a
    swallowed ImportError would make its subcommand vanish without a word."""
    from sagegate import cmd_backend, cmd_serve, cmd_study
    from sagegate.cmd_data import data_app
    from sagegate.cmd_predictor import predictor_app
    from sagegate.cmd_replay import replay_app

    app.command("backend")(cmd_backend.backend)
    app.command("study")(cmd_study.study)
    app.command("serve")(cmd_serve.serve)
    app.add_typer(replay_app, name="replay", help="Replay a trace against an endpoint; compare and plot.")
    app.add_typer(predictor_app, name="predictor", help="The semantic output-length predictor.")
    app.add_typer(data_app, name="data", help="The public data sets: list what is present, fetch more.")


_register()

if __name__ == "__main__":  # pragma: no cover
    app()
