"""Groups of GPUs that llm-d jobs share, and the state a group is in. Pure: no sockets, no clock."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from baton.contract.names import LABEL_LLMD_GROUP, LABEL_LLMD_JOB

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
    """The groups given with `--llmd-group`, each a set of GPUs (pods' groups come on top)."""

    static: dict[str, tuple[str, ...]] = field(default_factory=dict)

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

    def check_gpus(self, known: Collection[str]) -> None:
        """`GroupSpecError` for a group naming a GPU not in `known` (empty: any name goes)."""
        for name, gpus in sorted(self.static.items()):
            unknown = [gpu for gpu in gpus if known and gpu not in known]
            if unknown:
                raise GroupSpecError(
                    f"{name}={','.join(gpus)}: {', '.join(unknown)}: not a GPU of this node "
                    f"(it has {', '.join(sorted(known))})"
                )

    def names(self) -> list[str]:
        """Every group id, sorted."""
        return sorted(self.static)

    def gpus(self, group: str) -> tuple[str, ...] | None:
        """The group's GPUs (None if there is no such group)."""
        return self.static.get(group)


def pod_membership(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """(job id, group) from a pod's `timeslice.io/job-id` and `timeslice.io/group` labels."""
    job, group = labels.get(LABEL_LLMD_JOB, ""), labels.get(LABEL_LLMD_GROUP, "")
    return (job, group) if valid_id(job) and valid_id(group) else None


def pod_groups(
    members: Iterable[tuple[tuple[str, str], tuple[str, ...]]],
) -> dict[str, tuple[str, ...]]:
    """Group → the union of its member pods' GPUs, from ((job, group), GPUs) pairs."""
    gpus: dict[str, set[str]] = {}
    for (_, group), pod_gpus in members:
        gpus.setdefault(group, set()).update(pod_gpus)
    return {group: tuple(sorted(found)) for group, found in gpus.items()}


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
