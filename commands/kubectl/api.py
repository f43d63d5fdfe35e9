"""The API server as `kubectl baton` reads it: GETs with the user's kubeconfig, and refusals
turned into one line naming the permission that is missing."""

from __future__ import annotations

import json
import os
import socket
import ssl
from typing import Any, Protocol
from urllib.parse import quote

import yaml

from baton.contract.kube import (
    KUBECONFIG_UNREADABLE,
    credential_plugin_failures,
    unreadable_kubeconfig,
)
from baton.contract.names import NAMESPACE, PORT_AGENT, PORT_EXTENDER


class PluginError(RuntimeError):
    """Something `kubectl baton` cannot do, in one line a user can act on."""


class Forbidden(PluginError):
    """The user's RBAC does not allow a read; the message names the verb and resource."""


class NotFound(PluginError):
    """The object asked for does not exist."""


class Unreachable(PluginError):
    """The API server itself could not be reached (no connection, TLS, name)."""


class NoAnswer(PluginError):
    """The API server took the GET and said nothing within `timeout_s` (through its proxy, the
    pod or Service behind it may be the silent one)."""

    def __init__(self, message: str, timeout_s: float) -> None:
        super().__init__(message)
        self.timeout_s = timeout_s


class Api(Protocol):
    """What the commands need: GET a path of the API server as JSON, and the namespace a name
    given without one is in."""

    namespace: str
    """The kubeconfig context's namespace, as kubectl takes it ("default" where it sets none)."""

    def get(self, path: str, **params: str) -> Any: ...


def agent_status_path(pod: str, namespace: str = NAMESPACE) -> str:
    """An agent's /v1/status through the API server's pod proxy."""
    return f"/api/v1/namespaces/{namespace}/pods/{pod}:{PORT_AGENT}/proxy/v1/status"


def inventory_path(namespace: str = NAMESPACE, https: bool = False) -> str:
    """The extender's /v1/inventory through the API server's service proxy (to its HTTPS port
    with `https`: the chart's `extender.tls`)."""
    service = f"{'https:' if https else ''}baton-extender:{PORT_EXTENDER}"
    return f"/api/v1/namespaces/{namespace}/services/{service}/proxy/v1/inventory"


def refusal(status: int, body: str, path: str) -> PluginError:
    """The error for an API answer `status` with `body` (a Status object, usually)."""
    try:
        message = str(json.loads(body).get("message") or "")
    except (ValueError, AttributeError):
        message = body.strip().splitlines()[0] if body.strip() else ""
    if status == 403:
        return Forbidden(f"forbidden: {message or f'GET {path}'}")
    if status == 404:
        return NotFound(message or f"not found: {path}")
    return PluginError(f"the API server answered {status} to GET {path}: {message}")


REQUEST_TIMEOUT_S = 10.0
"""How long one GET waits for the API server (tried once: kubectl does not retry either)."""


def unreachable(server: str, err: Exception) -> PluginError:
    """One line for a GET that got no HTTP answer: the cause urllib3 wraps, not its wrapping."""
    from urllib3.exceptions import NewConnectionError
    from urllib3.exceptions import TimeoutError as Timeout

    cause: BaseException = err
    for _ in range(8):  # urllib3 wraps the socket's or TLS's error a level or two deep
        context = cause.__context__ if isinstance(cause.__context__, OSError) else None
        inner = cause.__cause__ or context
        if inner is None:
            break
        cause = inner
    if isinstance(err, Timeout) and not isinstance(err, NewConnectionError):
        said = f"cannot reach the API server at {server}: no answer within {REQUEST_TIMEOUT_S:g} s"
        return NoAnswer(said, REQUEST_TIMEOUT_S)
    if isinstance(cause, ssl.SSLCertVerificationError):
        why = f"its TLS certificate does not verify: {cause.verify_message}"
    elif isinstance(cause, socket.gaierror):
        why = f"cannot resolve its host name ({cause.strerror})"
    elif isinstance(cause, OSError) and cause.strerror:
        why = cause.strerror[:1].lower() + cause.strerror[1:]
    else:
        why = (str(cause) or type(cause).__name__).strip().splitlines()[0]
    return Unreachable(f"cannot reach the API server at {server}: {why}")


DEFAULT_KUBECONFIG = "~/.kube/config"
"""The kubeconfig read where KUBECONFIG is unset, by kubectl and by the kubernetes client."""


def merged_contexts(kubeconfig: str) -> tuple[dict[str, dict[str, Any]], str | None]:
    """The contexts of a KUBECONFIG list by name, and its current context, as kubectl merges
    them: each name's from the first file that has it, the current one from the first file that
    sets one (the kubernetes client takes the last's; its list of contexts refuses a kubeconfig
    that sets none, --context or not)."""
    contexts: dict[str, dict[str, Any]] = {}
    current = None
    for path in kubeconfig.split(os.pathsep):
        try:
            with open(os.path.expanduser(path), encoding="utf-8") as file:
                found = yaml.safe_load(file)
        except (OSError, ValueError, yaml.YAMLError):
            continue  # kubectl skips a file it cannot read; the loader names a broken one
        if not isinstance(found, dict):
            continue
        if not current and found.get("current-context"):
            current = str(found["current-context"])
        for entry in found.get("contexts") or []:
            if isinstance(entry, dict) and entry.get("name") is not None:
                context = entry.get("context")
                context = context if isinstance(context, dict) else {}
                contexts.setdefault(str(entry["name"]), context)
    return contexts, current


class KubeApi:
    """GETs with the user's kubeconfig (and context), through the kubernetes client. A KUBECONFIG
    list of files is merged as kubectl merges it."""

    def __init__(self, kubeconfig: str | None = None, context: str | None = None) -> None:
        from kubernetes import client, config

        configuration = client.Configuration()
        files = [p for p in (kubeconfig or "").split(os.pathsep) if p] or [DEFAULT_KUBECONFIG]
        contexts, current = merged_contexts(os.pathsep.join(files))
        context = context or current
        where = kubeconfig or f"{DEFAULT_KUBECONFIG} (KUBECONFIG unset)"
        try:
            with credential_plugin_failures() as failed:
                config.load_kube_config(
                    config_file=kubeconfig,
                    context=context,
                    client_configuration=configuration,
                    persist_config=False,
                )
        except (config.ConfigException, OSError) as err:
            missing = not any(os.path.exists(os.path.expanduser(p)) for p in files)
            if not missing and context and context not in contexts:  # kubectl names it too
                has = ", ".join(sorted(contexts)) or "none"
                said = f"kubeconfig {where} has no context {context!r} (its contexts: {has})"
                raise PluginError(said) from None
            said = "no such file" if len(files) == 1 else "none of its files exists"
            raise PluginError(f"no usable kubeconfig {where}: {said if missing else err}") from None
        except (*KUBECONFIG_UNREADABLE, yaml.YAMLError) as err:  # a YAML typo, a list
            raise PluginError(
                f"no usable kubeconfig {where}: {unreadable_kubeconfig(err)}"
            ) from None
        if failed:  # else every GET goes as an anonymous user's: "forbidden", naming no cause
            raise PluginError(f"no usable kubeconfig {where}: {failed[0]}")
        configuration.retries = False
        self.namespace = str(contexts.get(context or "", {}).get("namespace") or "default")
        self._configuration = configuration
        self._client = client.ApiClient(configuration)
        self.server = str(configuration.host)

    def get(self, path: str, **params: str) -> Any:
        """GET `path` (with query `params`) as JSON; PluginError with one line on failure."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())
        url = self.server + path + (f"?{query}" if query else "")
        headers = {"Accept": "application/json"}
        auths: dict[str, Any] = dict(self._configuration.auth_settings())
        for auth in auths.values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        try:
            reply = self._client.rest_client.request(
                "GET", url, headers=headers, _request_timeout=REQUEST_TIMEOUT_S
            )
            status = int(reply.status)
            data = reply.data if reply.data is not None else reply.read()
        except ApiException as err:
            if not err.status and isinstance(err.__context__, Exception):  # TLS failed
                raise unreachable(self.server, err.__context__) from None
            status, data = int(err.status), err.body or err.reason
        except (HTTPError, OSError) as err:
            raise unreachable(self.server, err) from None
        text = data.decode(errors="replace") if isinstance(data, bytes) else str(data or "")
        if not 200 <= status < 300:
            raise refusal(status, text, path)
        try:
            return json.loads(text)
        except ValueError:
            raise PluginError(f"GET {path} answered no JSON: {text[:80]!r}") from None

    def close(self) -> None:
        self._client.close()
