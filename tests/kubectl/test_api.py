"""The plugin's API client with a real kubeconfig and HTTP, against the fake API server."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from commands.kubectl import api as api_module
from commands.kubectl import cli
from commands.kubectl.agents import read_agent
from commands.kubectl.api import Forbidden, KubeApi, PluginError
from tests.harness.fakeapi import FakeApiServer
from tests.harness.kubeconfigs import NOT_KUBECONFIGS

MESSAGE = (
    'pods is forbidden: User "bob" cannot list resource "pods" in API group "" in the'
    ' namespace "baton-system"'
)


def test_reads_with_the_kubeconfig_and_names_a_missing_permission(tmp_path: Path) -> None:
    with FakeApiServer() as server:
        server.put_object(
            {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p", "namespace": "ml"}}
        )
        api = KubeApi(str(server.kubeconfig_path(tmp_path)))
        assert api.get("/api/v1/namespaces/ml/pods/p")["metadata"]["name"] == "p"
        server.fail_next("list", "pods", 403, message=MESSAGE)
        with pytest.raises(
            Forbidden, match=r'^forbidden: pods is forbidden: User "bob" cannot list'
        ):
            api.get("/api/v1/namespaces/baton-system/pods", labelSelector="a=b")
        (asked,) = [r for r in server.requests("list", "pods")]
        assert asked.query == {"labelSelector": "a=b"}
        assert server.requests()[0].path == "/api/v1/namespaces/ml/pods/p"
        api.close()


def test_an_unusable_kubeconfig_is_one_line_naming_it(tmp_path: Path) -> None:
    missing, empty = tmp_path / "missing", tmp_path / "empty"
    with pytest.raises(PluginError) as refused:
        KubeApi(str(missing))
    assert str(refused.value) == f"no usable kubeconfig {missing}: no such file"
    empty.write_text("")
    with pytest.raises(PluginError, match=f"^no usable kubeconfig {empty}: .+"):
        KubeApi(str(empty))


@pytest.mark.parametrize(
    ("content", "says"),
    NOT_KUBECONFIGS,
)
def test_a_file_that_is_no_kubeconfig_is_one_line_not_a_traceback(
    tmp_path: Path, content: bytes, says: str
) -> None:
    """A kubeconfig with a YAML typo (or a binary, or a list) was a Python traceback."""
    path = tmp_path / "kubeconfig"
    path.write_bytes(content)
    said = CliRunner().invoke(cli.app, ["status", "--kubeconfig", str(path)])
    assert said.exit_code == 1 and isinstance(said.exception, SystemExit), said.exception
    assert said.output.startswith(f"kubectl baton: no usable kubeconfig {path}: ")
    assert says in said.output and said.output.count("\n") == 1, said.output


def test_a_credential_plugin_that_is_not_installed_is_named_not_sent_as_anonymous(
    tmp_path: Path,
) -> None:
    """Before: a bare "ERROR:root:" line, then every GET refused as an anonymous user's (a
    'forbidden' that names RBAC, not the missing plugin)."""
    with FakeApiServer() as server:
        found = yaml.safe_load(server.kubeconfig_path(tmp_path).read_text())
        plugin = str(tmp_path / "gke-gcloud-auth-plugin")
        exec_user = {"apiVersion": "client.authentication.k8s.io/v1", "command": plugin}
        found["users"] = [{**u, "user": {"exec": exec_user}} for u in found["users"]]
        kubeconfig = tmp_path / "plugin.yaml"
        kubeconfig.write_text(yaml.safe_dump(found))
        said = CliRunner().invoke(cli.app, ["status", "--kubeconfig", str(kubeconfig)])
        asked = server.requests()
    assert said.exit_code == 1 and isinstance(said.exception, SystemExit), said.exception
    assert said.output == (
        f"kubectl baton: no usable kubeconfig {kubeconfig}: its user's credential plugin (exec) "
        f"gave no credential: [Errno 2] No such file or directory: '{plugin}'\n"
    )
    assert asked == []


def test_a_kubeconfig_list_is_merged_as_kubectl_merges_it(tmp_path: Path) -> None:
    """KUBECONFIG=a:b: contexts from every file; the current one from the first that sets it."""
    other = tmp_path / "other.yaml"
    other.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "o", "cluster": {"server": "https://192.0.2.9:6443"}}],
                "users": [{"name": "o", "user": {"token": "o"}}],
                "contexts": [{"name": "o", "context": {"cluster": "o", "user": "o"}}],
                "current-context": "o",
            }
        )
    )
    with FakeApiServer() as server:
        server.put_object(
            {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p", "namespace": "ml"}}
        )
        both = os.pathsep.join([str(other), str(server.kubeconfig_path(tmp_path))])
        assert KubeApi(both).server == "https://192.0.2.9:6443"  # the first file's context
        said = CliRunner().invoke(
            cli.app, ["--context", "fake", "why", "ml/p"], env={"KUBECONFIG": both}
        )
        assert said.exit_code == 0, said.output
        assert said.output.startswith("ml/p (None), scheduling:")
        (asked, *_) = server.requests()
        assert asked.path == "/api/v1/namespaces/ml/pods/p"
        assert KubeApi(os.pathsep.join(["/nonexistent", both])).server == "https://192.0.2.9:6443"


def test_why_without_a_namespace_looks_in_the_kubeconfig_contexts_as_kubectl_does(
    tmp_path: Path,
) -> None:
    """`why p` reads the pod in the namespace of the context in use (the current one, or
    --context's), "default" in a context that sets none; -n and NS/POD still name their own."""
    with FakeApiServer() as server:
        for namespace in ("ml", "ops", "default"):
            server.put_object(
                {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "metadata": {"name": "p", "namespace": namespace},
                }
            )
        found = yaml.safe_load(server.kubeconfig_path(tmp_path).read_text())
        fake = found["contexts"][0]
        found["contexts"] = [
            {"name": "ml", "context": {**fake["context"], "namespace": "ml"}},
            {"name": "ops", "context": {**fake["context"], "namespace": "ops"}},
            fake,
        ]
        found["current-context"] = "ml"
        kubeconfig = tmp_path / "contexts.yaml"
        kubeconfig.write_text(yaml.safe_dump(found))
        for args, asked in (
            (["why", "p"], "ml"),
            (["--context", "ops", "why", "p"], "ops"),
            (["--context", "fake", "why", "p"], "default"),
            (["why", "p", "--context", "ops"], "ops"),
            (["--context", "ml", "why", "p", "--context", "fake"], "default"),
            (["why", "p", "-n", "ops"], "ops"),
            (["-n", "ops", "why", "p"], "ops"),
            (["-n", "ml", "why", "p", "-n", "ops"], "ops"),
            (["why", "default/p"], "default"),
        ):
            before = len(server.requests())
            said = CliRunner().invoke(cli.app, args, env={"KUBECONFIG": str(kubeconfig)})
            assert said.exit_code == 0, (args, said.output)
            assert said.output.startswith(f"{asked}/p (None), scheduling:"), (args, said.output)
            assert server.requests()[before].path == f"/api/v1/namespaces/{asked}/pods/p", args


def kubeconfig_for(tmp_path: Path, server: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return str(path)


@contextlib.contextmanager
def silent_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """A server that takes every connection and never answers: its URL, and the connections it
    took (closed as the block ends)."""
    held: list[socket.socket] = []
    stop = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(0.05)

        def take() -> None:
            while not stop.is_set():
                try:
                    held.append(listener.accept()[0])
                except TimeoutError:
                    continue

        taker = threading.Thread(target=take, daemon=True)
        taker.start()
        try:
            yield f"http://127.0.0.1:{listener.getsockname()[1]}", held
        finally:
            stop.set()
            taker.join(timeout=5)
            for connection in held:
                connection.close()


def test_a_silent_api_server_is_asked_once_and_named_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that takes the connection and never answers costs one request timeout, not one
    per urllib3 retry, and the line says so without urllib3's wrapping."""
    monkeypatch.setattr(api_module, "REQUEST_TIMEOUT_S", 0.3)
    with silent_server() as (server, held):
        api = KubeApi(kubeconfig_for(tmp_path, server))
        try:
            with pytest.raises(PluginError) as silent:
                api.get("/api/v1/namespaces/baton-system/pods")
        finally:
            api.close()
        taken = len(held)
    assert str(silent.value) == f"cannot reach the API server at {server}: no answer within 0.3 s"
    assert taken == 1, "asked again after the timeout"


def test_an_agent_silent_behind_the_pod_proxy_is_named_not_the_api_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node down: the API server takes the proxied GET and its dial to the agent's pod says
    nothing within the request timeout. The line names that agent and the proxy; it does not
    send the operator looking at the API server, which answered everything else."""
    monkeypatch.setattr(api_module, "REQUEST_TIMEOUT_S", 0.3)
    with silent_server() as (server, _):
        api = KubeApi(kubeconfig_for(tmp_path, server))
        try:
            said = read_agent(api, "baton-agent-n2")
        finally:
            api.close()
    assert said == (
        "cannot read agent baton-agent-n2: no answer within 0.3 s through the API server's pod"
        " proxy (is its node down or cut off?)"
    )


def test_a_refused_connection_is_named_in_one_line(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        server = f"http://127.0.0.1:{closed.getsockname()[1]}"
    api = KubeApi(kubeconfig_for(tmp_path, server))
    with pytest.raises(PluginError) as refused:
        api.get("/api/v1/namespaces/ml/pods/p")
    api.close()
    assert str(refused.value) == f"cannot reach the API server at {server}: connection refused"


def test_a_context_given_is_used_where_the_kubeconfig_sets_no_current_one(tmp_path: Path) -> None:
    """A kubeconfig written for several clusters, or after `kubectl config unset
    current-context`, sets none: kubectl takes `--context`, the plugin refused the file ('Invalid
    kube-config file. Expected key current-context'). The context's namespace is still `why`'s."""
    with FakeApiServer() as server:
        server.put_object(
            {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p", "namespace": "ml"}}
        )
        found = yaml.safe_load(server.kubeconfig_path(tmp_path).read_text())
        del found["current-context"]
        found["contexts"][0]["context"]["namespace"] = "ml"
        kubeconfig = tmp_path / "no-current.yaml"
        kubeconfig.write_text(yaml.safe_dump(found))
        for args in (["--context", "fake", "why", "p"], ["why", "p", "--context", "fake"]):
            said = CliRunner().invoke(cli.app, args, env={"KUBECONFIG": str(kubeconfig)})
            assert said.exit_code == 0, (args, said.output)
            assert said.output.startswith("ml/p (None), scheduling:"), (args, said.output)


def test_a_context_the_kubeconfig_lacks_is_named_in_one_line(tmp_path: Path) -> None:
    """`--context` (or the current context) naming none of the kubeconfig's contexts: it said
    'no usable kubeconfig ...: Invalid kube-config file. Expected object with name nope in
    <the list's first file>/contexts list', as if the file were broken."""
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"contexts": [{"name": "o", "context": {"cluster": "o"}}]}))
    with FakeApiServer() as server:
        both = os.pathsep.join([str(other), str(server.kubeconfig_path(tmp_path))])
        for args in (["--context", "nope", "status"], ["why", "p", "--context", "nope"]):
            said = CliRunner().invoke(cli.app, args, env={"KUBECONFIG": both})
            assert said.exit_code == 1 and isinstance(said.exception, SystemExit), said.output
            assert said.output == (
                f"kubectl baton: kubeconfig {both} has no context 'nope' (its contexts: fake, o)\n"
            )
        asked = server.requests()
    assert asked == []
