"""`baton`: the single command line. Each module here registers its own subcommands."""

from __future__ import annotations

import typer

from commands.cli import agent, coordinator, demo, deviceplugin, dra, extender, status

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

for component in (agent, deviceplugin, dra, extender, coordinator, status, demo):
    component.register(app, bench_app)


def main() -> None:
    """Console-script entry point."""
    app()
