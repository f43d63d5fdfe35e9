"""`baton`: the single command line. Each component registers its own subcommands."""

from __future__ import annotations

import typer

import agent.cli
import deviceplugin.cli
import extender.cli

app = typer.Typer(
    name="baton",
    help="Turn-taking GPU sharing for training jobs on Kubernetes.",
    no_args_is_help=True,
    add_completion=False,
)
bench_app = typer.Typer(
    help="Benchmarks; each prints one JSON object on its last line with --json.",
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")

for component in (agent.cli, deviceplugin.cli, extender.cli):
    component.register(app, bench_app)


def main() -> None:
    """Console-script entry point."""
    app()
