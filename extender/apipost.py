"""POSTs of ready-made bodies to the API server, on the event loop, over kept-alive connections.

The body is JSON unless the caller names another content type (binds go as protobuf,
`extender.kubeproto`); the answer is asked for in JSON. A bind is one such call per pod, run on
the extender's event loop beside the verbs kube-scheduler waits for: a bind thread would hold
the interpreter lock for its HTTP client work while the loop waits for it, so here the loop only
writes the request and reads the answer, and the waits on the API server are its idle time. The
API client's address, TLS settings and credentials are used. Through a proxy (rare for an
in-cluster extender) the call goes by the API client's own pool, in a thread.
"""

from __future__ import annotations

import asyncio
import ssl
import weakref
from typing import Any
from urllib.parse import urlsplit

from baton.contract.kube import status_message
from extender.errors import ApiConflict, ApiFailure, ApiUnsure

_STALE = (ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError)
"""What a kept-alive connection the API server closed while idle raises on reuse."""


GAVE_UP = 504
"""kube-apiserver stopped waiting for the request ("Timeout: request did not complete within
requested timeout"); the write it started may still land."""


def refusal(what: str, status: int, body: Any, reason: str = "") -> ApiFailure:
    """The API server's refusal of `what`, with the message of its Status body: `ApiConflict`
    for a 409, `ApiUnsure` for a 504, else `ApiFailure`."""
    message = (
        f"{what}: API server answered {status}: {status_message(body) or reason or 'no message'}"
    )
    if status == GAVE_UP:
        return ApiUnsure(f"{message} (it may still take effect)")
    return (ApiConflict if status == 409 else ApiFailure)(message)


def unreachable(what: str, err: BaseException, sent: bool = False) -> ApiFailure:
    """`what` got no answer from the API server; `sent`: after the request went out, so it may
    have been carried out (`ApiUnsure`)."""
    detail = str(err) or ("no answer in time" if isinstance(err, TimeoutError) else "no detail")
    message = f"{what}: API server unreachable: {type(err).__name__}: {detail}"
    if sent:
        return ApiUnsure(f"{message} (after the request was sent: it may have taken effect)")
    return ApiFailure(message)


class _Connection:
    """One HTTP/1.1 connection, one exchange at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer

    async def exchange(self, request: bytes) -> tuple[int, str, bytes, bool]:
        """Status, reason, body, and whether the connection may be used again."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise ValueError(f"not an HTTP/1.1 answer: {status_line[:60]!r}")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            if name:
                headers[name.strip().lower()] = value.strip()
        keep = headers.get("connection", "").lower() != "close"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = await self._chunks()
        elif "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        else:
            body, keep = await self.reader.read(), False
        return int(code), reason, body, keep

    async def _chunks(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while await self.reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers
                return b"".join(parts)
            parts.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)

    def close(self) -> None:
        self.writer.close()


class ApiPost:
    """`await post(path, body, what)`: the answer's body; `ApiConflict` for a 409,
    `ApiFailure` for any other failure, each naming `what`. The body is JSON unless
    `content_type` says otherwise; the answer is asked for in JSON."""

    def __init__(self, api_client: Any, timeout_s: float):
        self._configuration = api_client.configuration
        self._pool = api_client.rest_client.pool_manager
        self._timeout_s = timeout_s
        url = urlsplit(self._configuration.host)
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._prefix = url.path.rstrip("/")
        self._head = (
            f"Host: {url.netloc}\r\n"
            f"Accept: application/json\r\nUser-Agent: {api_client.user_agent}\r\n"
        )
        self._proxied = bool(self._configuration.proxy)
        self._tls = _tls_context(self._configuration) if url.scheme == "https" else None
        self._server_name = self._configuration.tls_server_name or self._host
        self._idle: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[_Connection]] = (
            weakref.WeakKeyDictionary()
        )

    async def __call__(
        self, path: str, body: bytes, what: str, content_type: str = "application/json"
    ) -> bytes:
        # auth_settings() reads the token afresh (in a pod, the rotating service-account token).
        token = self._configuration.auth_settings().get("BearerToken")
        auth = f"{token['key']}: {token['value']}\r\n" if token else ""
        if self._proxied:
            headers = {"Content-Type": content_type}
            if token:
                headers["Authorization"] = token["value"]
            status, reason, data = await asyncio.to_thread(
                self._through_pool, path, body, headers, what
            )
            answer = status, reason, data, False
        else:
            request = (
                f"POST {self._prefix}{path} HTTP/1.1\r\n{self._head}{auth}"
                f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode("latin-1") + body
            answer = await self._direct(request, what)
        status, reason, data, resent = answer
        if status >= 300:
            failure = refusal(what, status, data, reason)
            if resent:  # the refusal may be of the first copy's effect (a 409 for a bound pod)
                raise ApiUnsure(
                    f"{failure} (sent again after the connection was reset with the request "
                    "sent: the first may have taken effect)"
                )
            raise failure
        return data

    async def _direct(self, request: bytes, what: str) -> tuple[int, str, bytes, bool]:
        """Status, reason, body, and whether the request went out twice (the first copy, on
        a kept-alive connection that turned out closed, may have been carried out)."""
        idle = self._idle.setdefault(asyncio.get_running_loop(), [])
        for attempt in (1, 2):
            reused = bool(idle)
            conn: _Connection | None = idle.pop() if idle else None
            sent = False
            try:
                async with asyncio.timeout(self._timeout_s):
                    if conn is None:
                        conn = _Connection(*await self._open())
                    sent = True
                    status, reason, data, keep = await conn.exchange(request)
            except _STALE as err:
                _close(conn)
                if not reused or attempt == 2:
                    raise unreachable(what, err, sent) from err
                continue
            except (OSError, TimeoutError, ValueError, asyncio.LimitOverrunError) as err:
                _close(conn)
                raise unreachable(what, err, sent) from err
            except BaseException:
                _close(conn)  # cancelled mid-exchange: the stream is out of step
                raise
            if keep:
                idle.append(conn)
            else:
                conn.close()
            return status, reason, data, attempt == 2
        raise AssertionError("unreachable")

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._tls is None:
            return await asyncio.open_connection(self._host, self._port)
        return await asyncio.open_connection(
            self._host, self._port, ssl=self._tls, server_hostname=self._server_name
        )

    def close(self) -> None:
        """Close the kept-alive connections of the running loop."""
        for conn in self._idle.pop(asyncio.get_running_loop(), []):
            conn.close()

    def _through_pool(
        self, path: str, body: bytes, headers: dict[str, str], what: str
    ) -> tuple[int, str, bytes]:
        import urllib3

        url = self._configuration.host + path
        headers = {**headers, "Accept": "application/json"}
        timeout = urllib3.Timeout(total=self._timeout_s)
        try:
            resp = self._pool.request("POST", url, body=body, headers=headers, timeout=timeout)
        except urllib3.exceptions.HTTPError as err:
            sent = isinstance(
                err, urllib3.exceptions.ReadTimeoutError | urllib3.exceptions.ProtocolError
            )
            raise unreachable(what, err, sent) from err
        return resp.status, resp.reason or "", bytes(resp.data)


def _close(conn: _Connection | None) -> None:
    if conn is not None:
        conn.close()


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
