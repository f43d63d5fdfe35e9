"""The one place Baton's daemons get a Kubernetes client, plus shared timestamp helpers."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
_NS_PER_S = 1_000_000_000


class KubeConfigError(RuntimeError):
    """No usable Kubernetes configuration could be found."""


KUBECONFIG_UNREADABLE = (ValueError, TypeError, AttributeError, KeyError)
"""What the Kubernetes client raises, besides `yaml.YAMLError`, loading a file that is no
kubeconfig (`unreadable_kubeconfig` says why): not UTF-8, a list, a field of the wrong type."""


def in_pod(token_path: Path = SERVICE_ACCOUNT_TOKEN) -> bool:
    """Whether this process runs in a pod with a service account."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and token_path.exists()


def load_api_client(kubeconfig: str | None) -> ApiClient:
    """A `kubernetes.client.ApiClient` from the kubeconfig file, or in-cluster config when none.

    Order: the given kubeconfig path, then the pod's service account, then `$KUBECONFIG`.
    Its calls do not retry: the client's default (urllib3's) retries a timed-out read three
    times, so a call to an API server that does not answer took four times its timeout. Every
    caller retries (with backoff) or fails in its own way instead.
    """
    import yaml
    from kubernetes import client, config

    configuration = client.Configuration()
    configuration.retries = False
    path = kubeconfig or (None if in_pod() else os.environ.get("KUBECONFIG"))
    if path:
        if not Path(path).is_file():
            what = "is not a file" if Path(path).exists() else "does not exist"
            raise KubeConfigError(f"kubeconfig file {path!r} {what}")
        try:
            with credential_plugin_failures() as failed:
                config.load_kube_config(
                    config_file=path, client_configuration=configuration, persist_config=False
                )
        except config.ConfigException as err:
            raise KubeConfigError(f"kubeconfig file {path!r} is not usable: {err}") from err
        except (*KUBECONFIG_UNREADABLE, yaml.YAMLError) as err:
            raise KubeConfigError(
                f"kubeconfig file {path!r} is not a kubeconfig: {unreadable_kubeconfig(err)}"
            ) from None
        if failed:
            raise KubeConfigError(f"kubeconfig file {path!r}: {failed[0]}")
    elif in_pod():
        config.load_incluster_config(client_configuration=configuration)
    else:
        raise KubeConfigError(
            "no Kubernetes configuration: pass --kubeconfig (or set KUBECONFIG), or run in a pod"
            f" (KUBERNETES_SERVICE_HOST unset or {SERVICE_ACCOUNT_TOKEN} missing)"
        )
    return client.ApiClient(configuration)


class _PluginFailures(logging.Filter):
    """Takes the Kubernetes client's root-logger errors about a kubeconfig's credentials."""

    def __init__(self) -> None:
        super().__init__()
        self.said: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "root" or record.module != "kube_config":
            return True
        said = " ".join(record.getMessage().split())
        self.said.append(f"its user's credential plugin (exec) gave no credential: {said}")
        return False


@contextlib.contextmanager
def credential_plugin_failures() -> Iterator[list[str]]:
    """While the Kubernetes client loads a kubeconfig: why its user's credential plugin
    (`exec`) gave no credential (not found, failed, answered no credential), one line each.
    The client only logs that (on the root logger, printed bare where nothing set logging up)
    and goes on with no credentials, every call then refused as an anonymous user's; callers
    refuse the kubeconfig instead, saying why."""
    root, failures = logging.getLogger(), _PluginFailures()
    bare = logging.NullHandler()  # `logging.error` gives a root without handlers a stderr one
    root.addFilter(failures)
    root.addHandler(bare)
    try:
        yield failures.said
    finally:
        root.removeHandler(bare)
        root.removeFilter(failures)


def unreadable_kubeconfig(err: Exception) -> str:
    """Why a kubeconfig file did not read as one, in one line: where its YAML breaks, or the
    Kubernetes client's complaint about its shape."""
    import yaml

    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        return f"not YAML: {err.problem} at line {mark.line + 1}, column {mark.column + 1}"
    if isinstance(err, yaml.YAMLError | UnicodeDecodeError):
        return f"not YAML: {' '.join(str(err).split())}"
    return f"its fields are not shaped as a kubeconfig's ({type(err).__name__}: {err})"


class Outage:
    """Says once that the API server is failing, and what the caller does meanwhile; once again
    when it answers. The failures between go to the debug log."""

    def __init__(self, log: logging.Logger, what: str, meanwhile: str) -> None:
        self.log = log
        self.what = what
        """What fails, e.g. "pod watch of node n1"."""
        self.meanwhile = meanwhile
        """What the caller does until it answers, e.g. "the extender sees old annotations"."""
        self.failures = 0
        self.last = ""
        """Why the latest attempt failed; "" once one succeeds (a daemon's /readyz says it)."""
        self._lock = threading.Lock()

    def failed(self, err: BaseException | str, retry_s: float) -> None:
        """One more failed attempt; the next is in `retry_s` seconds."""
        with self._lock:
            self.failures += 1
            first = self.failures == 1
        why = err if isinstance(err, str) else api_error_reason(err)
        self.last = why
        if first:
            self.log.warning(
                "%s: %s; retrying with backoff (next in %.1f s) until the API server answers; "
                "meanwhile %s",
                self.what,
                why,
                retry_s,
                self.meanwhile,
            )
        else:
            self.log.debug("%s: attempt %d failed: %s", self.what, self.failures, why)

    def answered(self) -> None:
        """An attempt succeeded."""
        with self._lock:
            failures, self.failures = self.failures, 0
        self.last = ""
        if failures:
            self.log.info(
                "%s: the API server answers again after %d failed attempts", self.what, failures
            )


def status_message(body: Any) -> str:
    """The `message` of the Status object a refused API call answered with (its body), or ""
    when the body is none."""
    try:
        return str(orjson.loads(body).get("message") or "")
    except (TypeError, ValueError, AttributeError):
        return ""


def api_error_reason(err: BaseException) -> str:
    """A one-line reason for a failed API call: the HTTP status, or the connection's root cause.

    A 404 adds the API server's message (which object it does not have), a 403 the authorizer's
    (which user was denied which verb on which resource)."""
    status, reason = getattr(err, "status", None), getattr(err, "reason", None)
    if isinstance(status, int) and isinstance(reason, str):
        said = status_message(getattr(err, "body", None)) if status in (403, 404) else ""
        return f"API server answered {status} {reason}" + (f": {said}" if said else "")
    root: BaseException = err
    for _ in range(10):
        inner = getattr(root, "reason", None) or root.__cause__
        if not isinstance(inner, BaseException):
            break
        root = inner
    text = str(root).split(": ", 1)[-1] if "Failed to establish" in str(root) else str(root)
    return f"API server unreachable ({type(root).__name__}: {text})"


def watch_events(
    response: Any, decode: Callable[[bytes], Any] = orjson.loads
) -> Iterator[dict[str, Any]]:
    """The events of a streamed watch response (`_preload_content=False`), one JSON object per
    line of its body, each read by `decode` (orjson: the extender reads every pod event so)."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=True):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield decode(line)


def format_timestamp_ns(ns: int) -> str:
    """RFC 3339 UTC with exactly nine fraction digits, e.g. `2026-01-02T03:04:05.000000007Z`."""
    seconds, frac = divmod(ns, _NS_PER_S)
    return f"{_whole_seconds(seconds)}.{frac:09d}Z"


@functools.lru_cache(maxsize=4)
def _whole_seconds(seconds: int) -> str:
    # Timestamps written one after another mostly fall in the same second (a bind each).
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")


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
