"""What the node agent answered a client's reconnects: the refusal the calls made meanwhile say.

An agent that restarts may refuse the session it used to serve (the tenant is not its own any
more, a GPU it names is gone, the agent is not yet done starting). The client goes on trying
either way; a call it cannot serve meanwhile says the refusal: at once where the agent's answer
means never (`FINAL`), in its "still reconnecting" error where it may pass.
"""

from __future__ import annotations

from agent.client.errors import (
    AcquireTimeout,
    AgentUnavailable,
    BatonError,
    InvalidRequest,
    PermissionDenied,
)

FINAL: tuple[type[BatonError], ...] = (PermissionDenied, InvalidRequest)
"""Refusals that do not pass by trying again: the tenant may not register here (another UID,
no pod where the agent serves pods), or what it registers is wrong (a GPU the node lacks)."""


class Refusals:
    """The last refusal heard from the agent since the session broke (none once it is open)."""

    def __init__(self, socket: str) -> None:
        self.socket = socket
        self._kind: type[BatonError] = BatonError
        self._message = ""
        """The agent's own words ("": no refusal heard since the session broke)."""
        self._standing = False
        """Whether the agent's latest answer was a refusal that means never."""

    def heard(self, exc: BatonError) -> bool:
        """A reconnect failed with `exc`: the agent's refusal, or no answer (it is away); True
        if the refusal means never (calls waiting for the reconnect fail now)."""
        if isinstance(exc, AgentUnavailable | AcquireTimeout):
            self._standing = False
        else:
            self._kind, self._message = type(exc), " ".join(str(exc).split())  # one line
            self._standing = isinstance(exc, FINAL)
        return self._standing

    def welcomed(self) -> None:
        """The session is open again."""
        self._message, self._standing = "", False

    def final(self) -> BatonError | None:
        """The error a call raises at once while the agent's latest answer means never."""
        if not self._standing:
            return None
        return self._kind(
            f"the Baton agent at {self.socket} refused this client's session after it "
            f"restarted: {self._message}"
        )

    def still_reconnecting(self, waited: float) -> AgentUnavailable:
        """The error of a call that waited `waited` seconds for the reconnect in vain."""
        why = f"; the agent last refused the session: {self._message}" if self._message else ""
        return AgentUnavailable(
            f"not connected to the Baton agent at {self.socket}: still reconnecting after "
            f"{max(0.0, waited):.3g} s{why}"
        )
