"""Why a gRPC server could not listen on a HOST:PORT: gRPC's `add_insecure_port` says only that
it failed (its reason goes to its own log), so a plain bind of the same address says why."""

from __future__ import annotations

import socket


def served_at(address: str, port: int) -> str:
    """HOST:PORT as `address` is served: its host (0.0.0.0 where it names none) and `port`, the
    one bound (what the kernel chose for a port 0), for a start line."""
    return f"{address.rpartition(':')[0] or '0.0.0.0'}:{port}"


def bind_error(address: str) -> str:
    """What binding `address` (HOST:PORT, a host in [] for IPv6) fails with, as the kernel or
    the resolver says it: "Address already in use", "Cannot assign requested address"..."""
    host, _, port = address.rpartition(":")
    try:
        found = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError) as err:
        return f"{host} does not resolve: {err}" if isinstance(err, socket.gaierror) else str(err)
    family, kind, proto, _, where = found[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        try:
            probe.bind(where)
        except OSError as err:
            return err.strerror or str(err)
    return "gRPC could not bind it"
