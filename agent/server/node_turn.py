"""The record of one job turn on this node (`agent.server.jobturns`), as the turns file keeps it
(`agent.node.jobturn_store`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from agent.server.sessions import Session

PREPARED = "prepared"
COMMITTED = "committed"


@dataclass
class NodeTurn:
    """One job turn on this node."""

    turn_id: str
    namespace: str
    job: str
    epoch: int
    members: tuple[str, ...]
    leases: tuple[str, ...]
    """Each member's lease id, in the order of `members`: after a revocation, the id of the
    turn that gives it back (`agent.server.resumes`)."""
    gpus: tuple[str, ...]
    tokens: tuple[int, ...]
    """Each member's fencing token (its lowest GPU's) as the turn was prepared, in the order of
    `members` (`jobturns_link.live_tokens` gives the live ones)."""
    prepared_at: float
    group: str = ""
    restored: bool = False
    """Whether a member's memory was parked when the preparation began."""
    state: str = PREPARED
    committed_at: float = 0.0
    nodes: tuple[str, ...] = ()
    """Every node of the turn, as the coordinator named them (for a new leader's judgement)."""
    joined: list[str] = field(default_factory=list)
    """Members that joined the turn themselves (`agent.server.coordinated`) and have not left."""
    leaving: list[str] = field(default_factory=list)
    """Members that left the turn whose leave the coordinator has not heard yet (it was away):
    reported as joined, so that a new leader learns of them and hears their leave, sent again
    (by the next agent too, after a restart)."""
    joins: dict[str, str] = field(default_factory=dict)
    """A member that joined → the coordinator's id of its latest join, which its leave names
    (so a leave that reaches the coordinator after the member joined again is ignored there)."""
    revoked: dict[str, str] = field(default_factory=dict)
    """A member's lease id the node revoked in this turn → that member: a yield naming it is
    the member's yield of the turn all the same."""
    sessions: list[Session] = field(default_factory=list, repr=False, compare=False)

    def lease_of(self, member: str) -> str:
        """The member's lease id in this turn."""
        return self.leases[self.members.index(member)]

    def names(self, member: str, lease_id: str) -> bool:
        """Whether `lease_id` is the member's lease in this turn (or was, until revoked)."""
        if member not in self.members:
            return False
        return self.lease_of(member) == lease_id or self.revoked.get(lease_id) == member

    def follow(self, member: str, revoked: str, resume: str) -> bool:
        """The member's lease `revoked` was revoked and `resume` gives the turn back: the record
        names `resume` from now on. False if `revoked` is not the member's lease here."""
        if member not in self.members or self.lease_of(member) != revoked:
            return False
        leases = list(self.leases)
        leases[self.members.index(member)] = resume
        self.leases = tuple(leases)
        self.revoked[revoked] = member
        return True

    def to_json(self) -> dict[str, Any]:
        """Every field but the sessions, for the turns file (`dataclasses.asdict` would deep-copy
        the sessions, their streams with them, only to drop them)."""
        return {name: getattr(self, name) for name in _SAVED}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeTurn:
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data and k != "sessions"}
        for key in ("members", "leases", "gpus", "tokens", "nodes"):
            fields[key] = tuple(fields.get(key, ()))
        fields["joined"] = list(fields.get("joined", []))
        fields["leaving"] = list(fields.get("leaving", []))
        fields["joins"] = {str(k): str(v) for k, v in dict(fields.get("joins", {})).items()}
        fields["revoked"] = {str(k): str(v) for k, v in dict(fields.get("revoked", {})).items()}
        return cls(**fields)


_SAVED = tuple(f.name for f in fields(NodeTurn) if f.name != "sessions")
"""The fields `NodeTurn.to_json` writes (each save of the turns file writes every turn)."""
