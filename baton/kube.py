"""The one place Baton's daemons get a Kubernetes client, plus shared timestamp helpers."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
_NS_PER_S = 1_000_000_000


class KubeConfigError(RuntimeError):
    """No usable Kubernetes configuration could be found."""


def in_pod(token_path: Path = SERVICE_ACCOUNT_TOKEN) -> bool:
    """Whether this process runs in a pod with a service account."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and token_path.exists()


def load_api_client(kubeconfig: str | None) -> ApiClient:
    """A `kubernetes.client.ApiClient` from the kubeconfig file, or in-cluster config when none.

    Order: the given kubeconfig path, then the pod's service account, then `$KUBECONFIG`.
    """
    from kubernetes import client, config

    configuration = client.Configuration()
    path = kubeconfig or (None if in_pod() else os.environ.get("KUBECONFIG"))
    if path:
        if not Path(path).is_file():
            raise KubeConfigError(f"kubeconfig file {path!r} does not exist")
        try:
            config.load_kube_config(
                config_file=path, client_configuration=configuration, persist_config=False
            )
        except config.ConfigException as err:
            raise KubeConfigError(f"kubeconfig file {path!r} is not usable: {err}") from err
    elif in_pod():
        config.load_incluster_config(client_configuration=configuration)
    else:
        raise KubeConfigError(
            "no Kubernetes configuration: pass --kubeconfig (or set KUBECONFIG), or run in a pod"
            f" (KUBERNETES_SERVICE_HOST unset or {SERVICE_ACCOUNT_TOKEN} missing)"
        )
    return client.ApiClient(configuration)


def format_timestamp_ns(ns: int) -> str:
    """RFC 3339 UTC with exactly nine fraction digits, e.g. `2026-01-02T03:04:05.000000007Z`."""
    seconds, frac = divmod(ns, _NS_PER_S)
    whole = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{frac:09d}Z"


_RFC3339 = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})$"
)


def parse_timestamp_ns(text: str) -> int:
    """Nanoseconds since the epoch from an RFC 3339 time (any fraction length up to nine)."""
    match = _RFC3339.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not an RFC 3339 timestamp")
    date, clock, frac, zone = match.groups()
    offset = "+00:00" if zone in ("Z", "z") else zone
    whole = datetime.fromisoformat(f"{date}T{clock}{offset}")
    return int(whole.timestamp()) * _NS_PER_S + int((frac or "").ljust(9, "0"))
