"""Options and output that the components' `baton` commands share."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Annotated

import typer

from baton.contract import names

Kubeconfig = Annotated[
    str | None,
    typer.Option(envvar=names.ENV_KUBECONFIG, help="Kubeconfig file; default: in-cluster."),
]
LogLevel = Annotated[str, typer.Option(envvar=names.ENV_LOG_LEVEL)]
AsJson = Annotated[bool, typer.Option("--json", help="One JSON object on the last line.")]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def setup_logging(level: str) -> None:
    """Log to stderr at `level` (DEBUG, INFO, ...) in the daemons' one format."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    # The Kubernetes client's connection pool warns on every retry of every request; the
    # daemons say once what is unreachable and what they do about it (`baton.contract.kube.Outage`).
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)


def echo_figures(figures: Mapping[str, object], as_json: bool) -> None:
    """A bench's result: one JSON object on the last line, after a table unless `as_json`."""
    if not as_json:
        width = max(map(len, figures), default=0)
        for key, value in figures.items():
            typer.echo(f"{key:>{width}}: {value}")
    typer.echo(json.dumps(figures))
