"""POSTs of ready-made JSON to the API server: one kept-alive connection per bind thread.

A bind is one such call per pod, and the bind threads share the interpreter with the event
loop that answers kube-scheduler's filter and prioritize. The generated client's request path
(argument validation, serialisation, urllib3's pool and retry machinery) took several times the
CPU of the call itself, so binds use `http.client` directly, with the API client's address,
TLS settings and credentials. Through a proxy (rare for an in-cluster extender) they go by the
API client's own pool instead.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from typing import Any
from urllib.parse import urlsplit

from extender.errors import ApiConflict, ApiFailure

_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)
"""What a kept-alive connection the API server closed while idle raises on reuse."""


def status_message(body: Any) -> str:
    """The `message` of a Kubernetes Status body, or ""."""
    try:
        return str(json.loads(body).get("message", ""))
    except (TypeError, ValueError, AttributeError):
        return ""


class ApiPost:
    """`post(path, body, what)`: the answer's body; `ApiConflict` for a 409, `ApiFailure` for
    any other failure, each naming `what`."""

    def __init__(self, api_client: Any, timeout_s: float):
        self._configuration = api_client.configuration
        self._pool = api_client.rest_client.pool_manager
        self._timeout_s = timeout_s
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": api_client.user_agent,
        }
        url = urlsplit(self._configuration.host)
        self._https = url.scheme == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if self._https else 80)
        self._prefix = url.path.rstrip("/")
        self._proxied = bool(self._configuration.proxy)
        self._tls = _tls_context(self._configuration) if self._https else None
        self._local = threading.local()

    def __call__(self, path: str, body: bytes, what: str) -> bytes:
        headers = dict(self._headers)
        # auth_settings() reads the token afresh (in a pod, the rotating service-account token).
        token = self._configuration.auth_settings().get("BearerToken")
        if token:
            headers[token["key"]] = token["value"]
        if self._proxied:
            status, reason, data = self._through_pool(path, body, headers, what)
        else:
            status, reason, data = self._direct(path, body, headers, what)
        if status >= 300:
            message = status_message(data) or reason or "no message"
            kind = ApiConflict if status == 409 else ApiFailure
            raise kind(f"{what}: API server answered {status}: {message}")
        return data

    def _direct(
        self, path: str, body: bytes, headers: dict[str, str], what: str
    ) -> tuple[int, str, bytes]:
        for attempt in (1, 2):
            conn, reused = self._connection()
            try:
                conn.request("POST", self._prefix + path, body, headers)
                resp = conn.getresponse()
                data = resp.read()
                if resp.will_close:
                    self._drop()
                return resp.status, resp.reason, data
            except _STALE as err:
                self._drop()
                if not reused or attempt == 2:
                    raise _unreachable(what, err) from err
            except (OSError, http.client.HTTPException) as err:
                self._drop()
                raise _unreachable(what, err) from err
        raise AssertionError("unreachable")

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        if self._tls is not None:
            name = self._configuration.tls_server_name or self._host
            conn = _Https(self._host, self._port, self._timeout_s, self._tls, name)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s)
        self._local.conn = conn
        return conn, False

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def _through_pool(
        self, path: str, body: bytes, headers: dict[str, str], what: str
    ) -> tuple[int, str, bytes]:
        import urllib3

        url = self._configuration.host + path
        timeout = urllib3.Timeout(total=self._timeout_s)
        try:
            resp = self._pool.request("POST", url, body=body, headers=headers, timeout=timeout)
        except urllib3.exceptions.HTTPError as err:
            raise _unreachable(what, err) from err
        return resp.status, resp.reason or "", bytes(resp.data)


class _Https(http.client.HTTPConnection):
    """HTTPS whose certificate is checked against `server_name`, which may differ from the
    address connected to (a kubeconfig's `tls-server-name`)."""

    def __init__(
        self, host: str, port: int, timeout_s: float, tls: ssl.SSLContext, server_name: str
    ):
        super().__init__(host, port, timeout=timeout_s)
        self._tls = tls
        self._server_name = server_name

    def connect(self) -> None:
        super().connect()
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


def _unreachable(what: str, err: BaseException) -> ApiFailure:
    return ApiFailure(f"{what}: API server unreachable: {type(err).__name__}: {err}")


def _tls_context(configuration: Any) -> ssl.SSLContext:
    """The API client's TLS settings (CA, client certificate, verification) as a context."""
    if configuration.verify_ssl:
        context = ssl.create_default_context(
            cafile=configuration.ssl_ca_cert, cadata=configuration.ca_cert_data
        )
        if configuration.assert_hostname is False:
            context.check_hostname = False
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return context
