"""Kubernetes client loading and the RFC 3339 nanosecond timestamps of pod annotations."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import urllib3
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from baton.contract.kube import (
    KubeConfigError,
    api_error_reason,
    format_timestamp_ns,
    load_api_client,
    parse_timestamp_ns,
)
from tests.harness.fakeapi import FakeApiServer
from tests.harness.kubeconfigs import NOT_KUBECONFIGS


def test_kubeconfig_client_reaches_the_server(tmp_path: Path) -> None:
    with FakeApiServer() as server:
        api = load_api_client(str(server.kubeconfig_path(tmp_path)))
        core: Any = client.CoreV1Api(api)
        core.create_node({"metadata": {"name": "gpu-1"}})
        assert server.get_object("Node", "gpu-1") is not None
        (logged,) = server.requests(verb="create", resource="nodes")
        assert logged.path == "/api/v1/nodes"


def test_missing_kubeconfig_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(KubeConfigError, match=str(missing)):
        load_api_client(str(missing))


@pytest.mark.parametrize(
    ("content", "says"),
    NOT_KUBECONFIGS,
)
def test_a_file_that_is_no_kubeconfig_is_named_with_why(
    tmp_path: Path, content: bytes, says: str
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_bytes(content)
    with pytest.raises(KubeConfigError) as caught:
        load_api_client(str(path))
    assert str(caught.value).startswith(f"kubeconfig file '{path}' is not a kubeconfig: ")
    assert says in str(caught.value) and "\n" not in str(caught.value)


PLUGINS = [
    (None, "[Errno 2] No such file or directory: "),
    (
        "import sys\nprint('token expired', file=sys.stderr)\nsys.exit('run: login')",
        "exec: process returned 1. token expired run: login",
    ),
    ("print('Password:')", "exec: failed to decode process output: Expecting value"),
]
"""Credential plugins (`exec`) that give no credential: one not installed, one that fails saying
why on two lines, one that asks for a password (an interactive login where none is possible)."""


def exec_kubeconfig(tmp_path: Path, plugin: str | None) -> Path:
    """A kubeconfig whose user's credential comes from `plugin` (Python; None: not installed)."""
    script = tmp_path / "plugin.py"
    if plugin is not None:
        script.write_text(plugin)
    command = sys.executable if plugin is not None else str(tmp_path / "no-such-plugin")
    run = {"command": command, "args": [str(script)], "interactiveMode": "Never"}
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", **run}}
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.mark.parametrize(("plugin", "says"), PLUGINS, ids=["missing", "failing", "no-json"])
def test_a_credential_plugin_that_gives_no_credential_is_named_not_ignored(
    tmp_path: Path, plugin: str | None, says: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """The Kubernetes client logged a bare "ERROR:root:" line and went on with no credentials:
    a daemon then retried its refused (anonymous) calls for ever, naming no cause."""
    path = exec_kubeconfig(tmp_path, plugin)
    root = logging.getLogger()
    handlers, filters = list(root.handlers), list(root.filters)
    with pytest.raises(KubeConfigError) as caught:
        load_api_client(str(path))
    said = str(caught.value)
    assert said.startswith(f"kubeconfig file '{path}': its user's credential plugin (exec) gave ")
    assert says in said and "\n" not in said
    assert capfd.readouterr().err == ""
    assert (root.handlers, root.filters) == (handlers, filters)


def test_a_kubeconfig_path_that_is_a_directory_is_named_so(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match=f"kubeconfig file '{tmp_path}' is not a file"):
        load_api_client(str(tmp_path))


def test_no_configuration_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    with pytest.raises(KubeConfigError, match="--kubeconfig"):
        load_api_client(None)


def test_kubeconfig_env_is_the_fallback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with FakeApiServer() as server:
        monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig_path(tmp_path)))
        assert client.CoreV1Api(load_api_client(None)).list_node().items == []


def test_timestamp_format_is_fixed_width_utc() -> None:
    assert format_timestamp_ns(7) == "1970-01-01T00:00:00.000000007Z"
    assert format_timestamp_ns(1_700_000_000_123_456_789) == "2023-11-14T22:13:20.123456789Z"


def test_parse_accepts_short_fractions_and_offsets() -> None:
    assert parse_timestamp_ns("1970-01-01T00:00:01Z") == 1_000_000_000
    assert parse_timestamp_ns("1970-01-01T01:00:00.5+01:00") == 500_000_000
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_timestamp_ns("yesterday")


@given(st.integers(min_value=0, max_value=4_102_444_800 * 10**9))
def test_timestamps_round_trip_and_sort(ns: int) -> None:
    text = format_timestamp_ns(ns)
    assert parse_timestamp_ns(text) == ns
    assert (format_timestamp_ns(ns + 1) > text) is True


def test_a_404_names_what_the_api_server_did_not_find() -> None:
    """A node daemon started with a wrong --node-name: the retried patch's warning says which
    node the API server does not have, not only its status."""
    missing = ApiException(status=404, reason="Not Found")
    missing.body = '{"kind":"Status","status":"Failure","message":"nodes \\"n9\\" not found"}'
    assert api_error_reason(missing) == 'API server answered 404 Not Found: nodes "n9" not found'
    gone = ApiException(status=410, reason="Gone")
    gone.body = '{"kind":"Status","message":"too old resource version"}'
    assert api_error_reason(gone) == "API server answered 410 Gone"


def test_a_403_names_what_the_authorizer_denied_and_to_whom() -> None:
    """A daemon whose role lacks a verb: its refused line says which user was denied which verb
    on which resource, in the authorizer's words, not only "403 Forbidden"."""
    denied = ApiException(status=403, reason="Forbidden")
    said = 'nodes is forbidden: User "system:serviceaccount:baton-system:x" cannot watch resource'
    denied.body = json.dumps({"kind": "Status", "message": said})
    assert api_error_reason(denied) == f"API server answered 403 Forbidden: {said}"
    bare = ApiException(status=403, reason="Forbidden")
    assert api_error_reason(bare) == "API server answered 403 Forbidden"


def test_a_read_the_api_server_does_not_answer_is_made_once(
    fake_api: FakeApiServer, api_client: Any
) -> None:
    """The client's default retried a timed-out read three times: a call bounded by its
    timeout took four of them against an API server that accepts but does not answer."""
    fake_api.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}})
    fake_api.hang_next("get", "nodes", times=4)
    core: Any = client.CoreV1Api(api_client)
    try:
        with pytest.raises(urllib3.exceptions.HTTPError):
            core.read_node("gpu-1", _request_timeout=0.2)
    finally:
        fake_api.release_hangs()
    assert len(fake_api.requests("get", "nodes")) == 1, "the read was retried"
