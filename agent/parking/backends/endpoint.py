"""Parks an inference engine through its own HTTP API: vLLM's sleep / wake_up, SGLang's
release / resume of memory occupation (llm-d's `app_endpoint`).

vLLM (served with `VLLM_SERVER_DEV_MODE=1`): `POST /sleep?level=1` offloads the weights and
drops the KV cache, `level=2` drops both; `POST /wake_up` (with a `tags` query parameter per tag)
brings them back. SGLang: `POST /release_memory_occupation` and `POST /resume_memory_occupation`
with the JSON body `{"tags": [...]}` (no body: everything). A tenant is parked this way only once
its target (engine, endpoints, mode, tags) is configured; the engine's memory counts as its
declared footprint, as the API reports no bytes. A call that fails (its answer lost) counts as
made where vLLM's GET /is_sleeping says the engine is where it was sent. Which engines sleep, and
their targets, are in the parking record: an engine stays asleep across an agent restart, and the
restarted agent wakes it for its next turn.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from agent.parking.backends.base import (
    Backend,
    BackendError,
    BackendQuarantined,
    Move,
    RecordError,
    Residency,
    TenantRef,
    TenantState,
    Unparkable,
    move_deadline,
)

log = logging.getLogger(__name__)

VLLM, SGLANG = "vllm", "sglang"
STATE_TIMEOUT_S = 2.0
"""At most this long for an engine's `GET /is_sleeping` (under the node's preparer lock, before a
turn on its GPU): an engine that does not answer in time is counted as before its restart."""
SILENT_S = 30.0
"""An engine whose `GET /is_sleeping` timed out is not asked again for this long (it does not
say, as SGLang does not): a hung engine costs the grants on its GPU 2 s twice a minute at most,
not each grant."""
_OTHER = {"park": "restore", "restore": "park"}


@dataclass(frozen=True)
class EndpointTarget:
    """How to park one tenant: its engine kind, base URLs, mode (`offload`/`discard`), tags."""

    app: str
    endpoints: tuple[str, ...]
    mode: str = "offload"
    tags: tuple[str, ...] = ()


def requests_for(target: EndpointTarget, action: str) -> list[tuple[str, bytes | None]]:
    """The POSTs (URL, JSON body) that park (`park`) or restore (`restore`) the target."""
    out: list[tuple[str, bytes | None]] = []
    for base in target.endpoints:
        base = base.rstrip("/")
        if target.app == VLLM and action == "park":
            level = 2 if target.mode == "discard" else 1
            out.append((f"{base}/sleep?{urlencode({'level': level})}", None))
        elif target.app == VLLM:
            query = urlencode([("tags", t) for t in target.tags])
            out.append((f"{base}/wake_up" + (f"?{query}" if query else ""), None))
        else:
            path = "release" if action == "park" else "resume"
            body = {"tags": list(target.tags)} if target.tags else {}
            out.append((f"{base}/{path}_memory_occupation", json.dumps(body).encode()))
    return out


class EndpointBackend(Backend):
    """Calls each tenant's engine endpoints over HTTP; `configure` says which and how."""

    name = "endpoint"

    def __init__(self, timeout: float = 60.0, copy_gbps: float = 1.0) -> None:
        self.timeout = timeout
        """Seconds a call gets beyond the time the engine's bytes take at `copy_gbps`."""
        self.copy_gbps = copy_gbps
        self._refs: dict[str, TenantRef] = {}
        self._targets: dict[str, EndpointTarget] = {}
        self._parked: dict[str, set[str]] = {}
        self._asleep: set[str] = set()
        """Tenants whose engines were told to sleep (one call covers all their GPUs)."""
        self._quarantined: dict[str, str] = {}
        """Why tenants take no more turns: their engines are some asleep, some not."""
        self._mutex = threading.Lock()
        self._silent: dict[str, float] = {}
        """Engine base URL → until when its state is not asked (its last ask timed out)."""

    def configure(self, tenant_id: str, target: EndpointTarget) -> None:
        """Park and restore the tenant through `target` from now on."""
        with self._mutex:
            self._targets[tenant_id] = target

    def attach(self, tenant: TenantRef) -> None:
        with self._mutex:
            self._refs[tenant.tenant_id] = tenant

    def detach(self, tenant_id: str) -> None:
        with self._mutex:
            for table in (self._refs, self._targets, self._parked, self._quarantined):
                table.pop(tenant_id, None)
            self._asleep.discard(tenant_id)

    def tenants(self) -> list[str]:
        with self._mutex:
            return list(self._refs)

    def footprint(self, tenant_id: str, gpu: str) -> int:
        """What it declared (llm-d jobs: the whole GPU)."""
        ref = self._refs.get(tenant_id)
        return (ref.declared_bytes or 0) if ref and gpu in ref.gpus else 0

    def state(self, tenant_id: str) -> TenantState:
        st = TenantState(tenant_id)
        ref = self._refs.get(tenant_id)
        with self._mutex:
            parked = set(self._parked.get(tenant_id, ()))
            target = self._targets.get(tenant_id)
            st.quarantined = self._quarantined.get(tenant_id, "")
        for gpu in ref.gpus if ref else ():
            st.residency[gpu] = Residency.PARKED if gpu in parked else Residency.RESIDENT
            st.footprint_bytes[gpu] = self.footprint(tenant_id, gpu)
        st.parked_bytes = sum(st.footprint_bytes[g] for g in parked if g in st.footprint_bytes)
        if target is None:
            st.unparkable = "no engine endpoint configured for it (llm-d's app_endpoint)"
        return st

    def park(self, tenant_id: str, gpu: str) -> Move:
        return self._move(tenant_id, gpu, "park")

    def restore(self, tenant_id: str, gpu: str) -> Move:
        return self._move(tenant_id, gpu, "restore")

    def _move(self, tenant_id: str, gpu: str, direction: str) -> Move:
        """One call per endpoint for the tenant's first GPU; its other GPUs ride on it."""
        parking = direction == "park"
        with self._mutex:
            target = self._targets.get(tenant_id)
            parked = self._parked.setdefault(tenant_id, set())
            done = (gpu in parked) == parking
            asleep = tenant_id in self._asleep
        if target is None:
            raise Unparkable(f"{tenant_id} has no engine endpoint configured")
        start = time.monotonic()
        if asleep != parking:
            ref = self._refs.get(tenant_id)
            engine = sum(self.footprint(tenant_id, g) for g in ref.gpus) if ref else 0
            timeout = move_deadline(self.timeout, engine, self.copy_gbps)
            try:
                self._call_all(tenant_id, target, direction, timeout)
            except BackendQuarantined as e:
                with self._mutex:
                    self._quarantined[tenant_id] = str(e)
                raise
        with self._mutex:
            (self._asleep.add if parking else self._asleep.discard)(tenant_id)
            (parked.add if parking else parked.discard)(gpu)
        moved = 0 if done else self.footprint(tenant_id, gpu)
        return Move(tenant_id, gpu, direction, moved, time.monotonic() - start)

    def _call_all(self, tenant_id: str, target: EndpointTarget, direction: str, t: float) -> None:
        """Every engine's call; one failing undoes those made before it, so the engines are
        where `state` counts them. `BackendQuarantined` if the undo fails too."""
        calls = list(zip(target.endpoints, requests_for(target, direction), strict=True))
        undo = list(zip(target.endpoints, requests_for(target, _OTHER[direction]), strict=True))
        parking = direction == "park"
        for done, (base, (url, body)) in enumerate(calls):
            try:
                self._call(target.app, base, url, body, t, asleep=parking)
            except BackendError as failed:
                try:
                    for back_base, (back_url, back_body) in undo[:done]:
                        self._call(target.app, back_base, back_url, back_body, t, not parking)
                except BackendError as stuck:
                    raise BackendQuarantined(
                        f"{failed}; undoing the {direction} of its other engines failed too "
                        f"({stuck}): some sleep and some do not; restart them"
                    ) from None
                raise

    def _call(
        self, app: str, base: str, url: str, body: bytes | None, t: float, asleep: bool
    ) -> None:
        """One engine's call, meant to leave it `asleep` or awake. A failed one (its answer may
        be lost) counts as made where the engine says it is there now (`sleeping`)."""
        try:
            self._post(url, body, t)
        except BackendError:
            if self.sleeping(app, base, ask_silent=True) is not asleep:
                raise

    def sleeping(self, app: str, base: str, ask_silent: bool = False) -> bool | None:
        """Whether the engine at `base` sleeps, in its own word (vLLM's GET /is_sleeping); None
        where it does not say (SGLang, no such endpoint, no answer; nor, unless `ask_silent`, an
        engine whose last ask timed out within `SILENT_S`: a move's own outcome asks it)."""
        if app != VLLM:
            return None
        with self._mutex:
            if not ask_silent and time.monotonic() < self._silent.get(base, 0.0):
                return None
        url = f"{base.rstrip('/')}/is_sleeping"
        try:
            with urllib.request.urlopen(url, timeout=min(self.timeout, STATE_TIMEOUT_S)) as reply:
                answer = json.loads(reply.read())
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
            if isinstance(getattr(exc, "reason", exc), TimeoutError):  # hung, not refused
                log.warning(
                    "the %s engine at %s did not say within %g s whether it sleeps: counted as "
                    "it was; not asked again for %g s",
                    app, base, min(self.timeout, STATE_TIMEOUT_S), SILENT_S,
                )  # fmt: skip
                with self._mutex:
                    self._silent[base] = time.monotonic() + SILENT_S
            return None
        with self._mutex:
            self._silent.pop(base, None)
        said = answer.get("is_sleeping") if isinstance(answer, dict) else None
        return said if isinstance(said, bool) else None

    def asleep_on(self, gpus: Collection[str]) -> list[str]:
        """Tenants whose engines were told to sleep, counted parked on one of `gpus`."""
        with self._mutex:
            return [t for t in self._asleep if not self._parked.get(t, set()).isdisjoint(gpus)]

    def awake_again(self, tenant_id: str) -> bool:
        """An engine of the tenant's that says it is awake (restarted since it was told to
        sleep) holds its memory: the tenant counts resident, so that its next park puts every
        engine to sleep again. One that does not say (404, SGLang, no answer) counts asleep."""
        with self._mutex:
            target = self._targets.get(tenant_id)
            asleep = tenant_id in self._asleep
        if target is None or not asleep:
            return False
        if all(self.sleeping(target.app, base) is not False for base in target.endpoints):
            return False
        with self._mutex:
            self._asleep.discard(tenant_id)
            self._parked[tenant_id] = set()
        return True

    # Restarts.

    def durable(self) -> dict[str, Any]:
        """Each tenant with memory parked or quarantined: its target, the GPUs counted parked,
        whether its engine sleeps and why it is quarantined. The engine outlives the agent: a
        restarted agent must still wake it, or still give it no turn."""
        with self._mutex:
            held = {t for t, gpus in self._parked.items() if gpus} | self._asleep
            held |= self._quarantined.keys()
            return {
                t: {
                    "app": self._targets[t].app,
                    "endpoints": list(self._targets[t].endpoints),
                    "mode": self._targets[t].mode,
                    "tags": list(self._targets[t].tags),
                    "parked": sorted(self._parked.get(t, ())),
                    "asleep": t in self._asleep,
                }
                | ({"quarantined": self._quarantined[t]} if t in self._quarantined else {})
                for t in sorted(held)
                if t in self._targets
            }

    def adopt(self, saved: dict[str, Any]) -> None:
        """Take back `durable`'s record; `RecordError` naming the field for another shape."""
        if not isinstance(saved, dict):
            raise RecordError(
                f"the endpoint record is a JSON {type(saved).__name__}, not an object"
            )
        adopted = {t: _adopted(f"tenant {t!r}", entry) for t, entry in saved.items()}
        with self._mutex:
            for tenant_id, (target, parked, asleep, why) in adopted.items():
                self._targets[tenant_id] = target
                self._parked[tenant_id] = parked
                if asleep:
                    self._asleep.add(tenant_id)
                if why:
                    self._quarantined[tenant_id] = why

    def _post(self, url: str, body: bytes | None, timeout: float) -> None:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        request = urllib.request.Request(url, data=body or b"", headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                reply.read()
        except urllib.error.HTTPError as e:
            raise BackendError(f"POST {url}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            raise BackendError(f"POST {url}: {getattr(e, 'reason', e)}") from None
        except http.client.HTTPException as e:  # not HTTP, or cut short
            raise BackendError(f"POST {url}: no HTTP answer ({e!r})") from None


def _adopted(where: str, entry: Any) -> tuple[EndpointTarget, set[str], bool, str]:
    """One tenant's entry of `durable`'s record: its target, parked GPUs, whether it sleeps and
    why it is quarantined (empty: it is not)."""
    if not isinstance(entry, dict):
        raise RecordError(f"{where}: not an object")
    if entry.get("app") not in (VLLM, SGLANG):
        raise RecordError(f"{where}: 'app' is {entry.get('app')!r}, not {VLLM!r} or {SGLANG!r}")
    if not isinstance(entry.get("mode"), str) or not isinstance(entry.get("asleep"), bool):
        raise RecordError(f"{where}: 'mode' is not a string or 'asleep' not a boolean")
    why = entry.get("quarantined", "")
    if not isinstance(why, str):
        raise RecordError(f"{where}: 'quarantined' is {why!r}, not a reason")
    lists: dict[str, list[str]] = {}
    for key in ("endpoints", "tags", "parked"):
        value = entry.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise RecordError(f"{where}: {key!r} is {value!r}, not a list of strings")
        lists[key] = value
    target = EndpointTarget(
        entry["app"], tuple(lists["endpoints"]), entry["mode"], tuple(lists["tags"])
    )
    return target, set(lists["parked"]), entry["asleep"], why
