"""The coordination token on the wire, between the coordinator and the node agents: every call
carries `authorization: Bearer <token>` (the token both read from one Secret)."""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from baton.contract.names import COORDINATION_TOKEN_METADATA


def token_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The gRPC metadata a caller sends."""
    return ((COORDINATION_TOKEN_METADATA, f"Bearer {token}"),)


def carries_token(metadata: Iterable[tuple[str, object]] | None, token: str) -> bool:
    """Whether a call's metadata presents `token` (compared in constant time)."""
    given = str(dict(metadata or ()).get(COORDINATION_TOKEN_METADATA, "")).encode()
    return hmac.compare_digest(given, f"Bearer {token}".encode())
