"""A kube-scheduler extender that decides nothing: the same-run reference for what any
extender costs on the DRA path (`baton bench schedule --path dra`, the `dra_null_` keys).

Filter passes every node it is sent; prioritize gives every node 0. It speaks HTTP/1.1 with
keep-alive on uvloop, as the real extender does, and keeps no cluster state: what kube-scheduler
spends on the two round trips per pod, and nothing else.

    python -m commands.bench.nullextender PORT
"""

from __future__ import annotations

import asyncio
import sys

import orjson
import uvloop

MAX_BODY = 16 << 20


def answer(path: bytes, body: bytes) -> bytes:
    """The JSON answer to one verb (`/filter`, `/prioritize`); anything else gets `ok`."""
    if path not in (b"/filter", b"/prioritize"):
        return b"ok"
    names = orjson.loads(body).get("NodeNames") or []
    if path == b"/filter":
        return orjson.dumps({"NodeNames": names, "FailedNodes": {}, "Error": ""})
    return orjson.dumps([{"Host": name, "Score": 0} for name in names])


async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            path = lines[0].split(b" ")[1]
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if length > MAX_BODY:
                raise ValueError(f"a body of {length} bytes")
            body = await reader.readexactly(length) if length else b""
            out = answer(path, body)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(out), out)
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError, IndexError, AttributeError):
        writer.close()  # a request it cannot read: the connection ends, the caller learns at once


async def serve(port: int) -> None:
    """Answer on 127.0.0.1:`port` until killed."""
    server = await asyncio.start_server(_serve_connection, "127.0.0.1", port)
    await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        sys.exit("usage: python -m commands.bench.nullextender PORT")
    uvloop.run(serve(int(sys.argv[1])))
