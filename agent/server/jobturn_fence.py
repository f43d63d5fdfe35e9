"""The fence against deposed coordinators: the highest epoch this agent has obeyed and the
identity of the leader it obeys in it, kept on disk (`agent.node.jobturn_store`) before a
command that raised them is answered. A lower epoch is refused, and so is the same epoch from
another leader: a Lease deleted and created again counts from 1 again, so two leaders may hold
one epoch, and the agent obeys only the first to name itself in it."""

from __future__ import annotations

import logging

from agent.core.errors import AgentError
from agent.node.jobturn_store import JobTurnStore

log = logging.getLogger(__name__)


class StaleEpoch(AgentError):
    """A command from a leader older than one this agent has obeyed, or from another leader in
    the epoch it obeys (FAILED_PRECONDITION)."""


class NotRecorded(AgentError):
    """The node could not write what it must keep before answering (a full disk): UNAVAILABLE,
    and the same call sent again is answered once it can."""


class Fence:
    """The epoch (and its leader) that this node obeys."""

    def __init__(self, node: str, store: JobTurnStore) -> None:
        self.node = node
        self._store = store
        self.epoch = 0
        """The highest epoch seen: commands from an older one are refused."""
        self.holder = ""
        """The identity of the leader obeyed in `epoch` ("" until one names itself): commands
        from another leader in that epoch are refused."""
        self._unfenced = ""
        """Why the last new epoch could not be recorded (logged once), until one is."""

    def load(self) -> None:
        """The fence as it was saved before a restart."""
        self.epoch = self._store.load_epoch()
        self.holder = self._store.load_holder(self.epoch)

    def raises(self, epoch: int, holder: str) -> bool:
        """Whether a command in `epoch` from `holder` would change the fence."""
        return epoch > self.epoch or (epoch == self.epoch and bool(holder) and not self.holder)

    def check(self, epoch: int, holder: str = "") -> None:
        """Refuse an older epoch, or this one from another `holder` (the leader's identity; ""
        from an older coordinator: not checked); remember (durably) a newer one, or the first
        holder named in this one, before answering."""
        if epoch < self.epoch:
            raise StaleEpoch(
                f"epoch {epoch} is older than epoch {self.epoch} this agent already obeys: "
                "a newer coordinator leads"
            )
        if epoch == self.epoch and holder and self.holder and holder != self.holder:
            raise StaleEpoch(
                f"epoch {epoch} is led by {self.holder} here, not by {holder} (the coordinator "
                "Lease was created again?): a coordinator must lead in a higher epoch"
            )
        if not self.raises(epoch, holder):
            return
        try:
            self._store.save_epoch(epoch, holder)
        except OSError as exc:
            if epoch == self.epoch:  # only its leader is new: kept here until a restart
                log.warning(
                    "node %s could not record that %s leads epoch %d (%s); kept until a restart",
                    self.node, holder, epoch, exc,
                )  # fmt: skip
                self.holder = holder
                return
            # a newer epoch is obeyed only once it would survive a restart
            why = f"node {self.node} could not record coordinator epoch {epoch} ({exc})"
            if why != self._unfenced:  # its calls come again, with backoff: said once
                log.error("%s; it obeys epoch %d until it can", why, self.epoch)
            self._unfenced = why
            raise NotRecorded(  # (the coordinator names the node)
                f"coordinator epoch {epoch} could not be recorded here ({exc}): "
                "commands are refused until it can"
            ) from None
        if self._unfenced:
            log.info("node %s recorded coordinator epoch %d", self.node, epoch)
            self._unfenced = ""
        if self.epoch and epoch > self.epoch:
            log.info("coordinator epoch %d follows %d", epoch, self.epoch)
        self.epoch, self.holder = epoch, holder
