"""Groups of GPUs that llm-d jobs share, and the state a group is in. Pure: no sockets, no clock."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

IDLE = "idle"
IDLE_YIELDED = "idle_yielded"
LOCKED = "locked"
SWITCHING = "switching"

MAX_ID = 253


class GroupSpecError(ValueError):
    """A `--llmd-group` value that is not `NAME=GPU[,GPU...]`."""


def parse_group(spec: str) -> tuple[str, tuple[str, ...]]:
    """`trainers=GPU-0,GPU-1` to its name and GPUs; `GroupSpecError` saying what is wrong."""
    name, sep, gpus = spec.partition("=")
    wanted = tuple(sorted({g.strip() for g in gpus.split(",") if g.strip()}))
    if not sep or not valid_id(name.strip()) or not wanted:
        raise GroupSpecError(f"{spec!r}: give NAME=GPU[,GPU...], e.g. trainers=GPU-0,GPU-1")
    return name.strip(), wanted


def valid_id(value: str) -> bool:
    """Whether a job or group id is 1-253 printable characters without spaces."""
    return 0 < len(value) <= MAX_ID and value.isprintable() and " " not in value


@dataclass
class Groups:
    """The node's groups: configured ones, and ones learned from pods' labels."""

    static: dict[str, tuple[str, ...]] = field(default_factory=dict)
    pods: dict[str, tuple[str, str, tuple[str, ...]]] = field(default_factory=dict)
    """Pod tenant id → (job id, group, its GPUs), from `timeslice.io/*` labels."""

    @classmethod
    def from_specs(cls, specs: Iterable[str]) -> Groups:
        """Groups from `--llmd-group` values; a name given twice is an error."""
        groups = cls()
        for spec in specs:
            name, gpus = parse_group(spec)
            if name in groups.static:
                raise GroupSpecError(f"group {name!r} is given twice")
            groups.static[name] = gpus
        return groups

    def names(self) -> list[str]:
        """Every group id, sorted."""
        return sorted(set(self.static) | {group for _, group, _ in self.pods.values()})

    def gpus(self, group: str) -> tuple[str, ...] | None:
        """The group's GPUs (None if there is no such group)."""
        if group in self.static:
            return self.static[group]
        members = [gpus for _, g, gpus in self.pods.values() if g == group]
        return tuple(sorted({gpu for gpus in members for gpu in gpus})) if members else None

    def pod_of(self, job_id: str, group: str) -> str | None:
        """The pod tenant labelled as `job_id` in `group`, if any."""
        for tenant_id, (job, g, _) in sorted(self.pods.items()):
            if job == job_id and g == group:
                return tenant_id
        return None

    def set_pod(self, tenant_id: str, labels: Mapping[str, str], gpus: tuple[str, ...]) -> None:
        """A pod tenant appeared or changed; it joins the group its labels name, if any."""
        from baton.names import LABEL_LLMD_GROUP, LABEL_LLMD_JOB

        job, group = labels.get(LABEL_LLMD_JOB, ""), labels.get(LABEL_LLMD_GROUP, "")
        if valid_id(job) and valid_id(group) and gpus:
            self.pods[tenant_id] = (job, group, gpus)
        else:
            self.pods.pop(tenant_id, None)

    def drop_pod(self, tenant_id: str) -> None:
        """A pod tenant left."""
        self.pods.pop(tenant_id, None)


@dataclass(frozen=True)
class GroupFacts:
    """What the lease table and the residency layer say about one group's GPUs."""

    holder: str = ""
    """The job that holds the group's turn."""
    switching_to: str = ""
    """The job whose turn is being prepared (memory moving)."""
    loaded: str = ""
    """The job whose memory is resident on the group's GPUs."""
    last_holder: str = ""


def group_state(facts: GroupFacts) -> str:
    """The llm-d state of a group with these facts."""
    if facts.switching_to:
        return SWITCHING
    if facts.holder:
        return LOCKED
    return IDLE_YIELDED if facts.loaded or facts.last_holder else IDLE


@dataclass
class StateClock:
    """When each group entered the state it is in."""

    since: dict[str, tuple[str, float]] = field(default_factory=dict)

    def observe(self, group: str, state: str, now: float) -> float:
        """Record `state` seen at `now`; returns when the group entered it."""
        seen = self.since.get(group)
        if seen is None or seen[0] != state:
            self.since[group] = (state, now)
            return now
        return seen[1]
