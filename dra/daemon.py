"""Wiring: build every part of `baton dra` from its settings, start and stop them."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baton.contract import names, shutdown
from baton.contract.draapi import DraApi
from baton.contract.kube import api_error_reason
from baton.contract.unixsocket import length_problem
from dra import runtime, statelock
from dra.faults import PrepareHold
from dra.prepare import ClaimReader, Preparer
from dra.publisher import SliceApi, SlicePublisher
from dra.record import ClaimRecord
from dra.server import DriverServer, endpoint_path, registration_path
from dra.service import DraPluginService, HealthService, RegistrationService
from nodegpu.inventory import NodeGpu
from nodegpu.node import NodeGpus, NodeSettings, NodeStartError

log = logging.getLogger(__name__)
LOCK_WAIT_S = 45.0
"""How long a driver waits at start for the one that holds its state directory to stop (a
rollout's old pod: 30 s of grace before it is killed, and its lock goes with it)."""


class DraStartError(Exception):
    """Something the driver needs at start is unusable; the message says what."""


class DraStoppedAtStart(DraStartError):
    """A stop signal came while the driver waited to start (for another's state directory)."""


@dataclass(frozen=True)
class Settings(NodeSettings):
    """Everything `baton dra` is told on its command line: the node's, then its own."""

    metrics_port: int = names.PORT_DRA
    plugins_dir: Path = Path(names.KUBELET_PLUGINS_DIR)
    registry_dir: Path = Path(names.KUBELET_PLUGINS_REGISTRY_DIR)
    cdi_dir: Path = Path(names.CDI_SPEC_DIR)
    state_dir: Path = Path(names.DRA_STATE_DIR)
    vendor_cdi: str | None = None
    """A vendor CDI kind (`nvidia.com/gpu`) whose `<kind>=<uuid>` IDs are returned too."""
    runtime_cdi: str = runtime.AUTO


class Driver:
    """The running DRA driver: kubelet sockets, ResourceSlice, claim preparation, over the node
    layer (inventory, health, annotations, metrics)."""

    def __init__(
        self,
        settings: Settings,
        gpus: list[NodeGpu],
        fake: bool,
        api: DraApi | None = None,
        slices: SliceApi | None = None,
        claims: ClaimReader | None = None,
        api_client: Any = None,
        stop: shutdown.StopSignal | None = None,
    ) -> None:
        """`api` serves slices, claims and the node; tests pass `slices`/`claims` instead;
        `DraStartError` before anything is made where a socket path is too long to bind;
        `DraStoppedAtStart` where `stop` comes while it waits for the state directory; one
        that comes while `start` reads the node ends the start there, serving nothing."""
        endpoint = endpoint_path(settings.plugins_dir)
        _short_enough(endpoint, "--plugins-dir (BATON_DRA_PLUGINS_DIR)")
        _short_enough(
            registration_path(settings.registry_dir), "--registry-dir (BATON_DRA_REGISTRY_DIR)"
        )
        self.settings = settings
        self.api = api
        self._stop_signal = stop
        _writable_dir(settings.state_dir, "--state-dir (BATON_DRA_STATE_DIR)")
        _writable_dir(settings.cdi_dir, "--cdi-dir (BATON_CDI_DIR)")
        self._state_lock: int | None = _hold_state_dir(settings.state_dir, stop)
        try:
            self._make(settings, gpus, fake, api, slices, claims, api_client, endpoint)
        except BaseException:
            self._release_state_dir()
            raise

    def _make(
        self,
        settings: Settings,
        gpus: list[NodeGpu],
        fake: bool,
        api: DraApi | None,
        slices: SliceApi | None,
        claims: ClaimReader | None,
        api_client: Any,
        endpoint: Path,
    ) -> None:
        """Every part, made while this driver holds the state directory."""
        try:
            self.record = ClaimRecord(settings.state_dir)
        except OSError as err:
            raise DraStartError(
                f"cannot read the record of prepared claims ({err}); check --state-dir "
                "(BATON_DRA_STATE_DIR)"
            ) from None
        self._node: dict[str, Any] = {}
        self._node_error = ""
        self._node_lock = threading.Lock()
        self.hold = PrepareHold() if fake else None
        try:
            self.node = NodeGpus(
                settings,
                gpus,
                fake,
                api_client,
                self.not_ready,
                {"/fake/hold-prepare": self.hold.arm} if self.hold else None,
            )
        except NodeStartError as err:
            raise DraStartError(str(err)) from None
        self.inventory = self.node.inventory
        self.health = self.node.health
        self.status = self.node.status
        self.preparer = Preparer(
            settings.node_name,
            self.inventory,
            claims or api,  # type: ignore[arg-type]
            self.record,
            settings.cdi_dir,
            settings.vendor_cdi,
            self.cdi_refusal,
            self.hold or (lambda uid: None),
        )
        self.publisher = SlicePublisher(
            slices or api,  # type: ignore[arg-type]
            settings.node_name,
            self.inventory,
            self.node_uid,
        )
        self.registration = RegistrationService(str(endpoint), self.publisher.poke)
        self.server = DriverServer(
            DraPluginService(self.preparer),
            HealthService(settings.node_name, self.inventory),
            self.registration,
            endpoint,
            registration_path(settings.registry_dir),
        )

    def node_object(self) -> dict[str, Any]:
        """This node's object, read from the API until it names its container runtime: a node
        the API server did not answer for at start is read again when a claim or the slice
        needs it."""
        with self._node_lock:
            if _runtime_version(self._node) or self.api is None:
                return self._node
            try:
                self._node = self.api.node()
            except Exception as err:  # any API failure: the next prepare reads it again
                why = f"it could not be read ({api_error_reason(err)})"
            else:
                if _runtime_version(self._node):
                    if self._node_error:
                        log.info("read node %s", self.settings.node_name)
                    return self._node
                why = "it names no container runtime yet"
            if why != self._node_error:
                log.warning(
                    "node %s: %s; read again when a claim or the slice needs it",
                    self.settings.node_name,
                    why,
                )
            self._node_error = why
            return self._node

    def node_uid(self) -> str:
        """This node's UID, read again each time (the slice's owner): a node deleted and
        registered again under its name has a new one. The node read is kept as `node_object`'s;
        where the API does not answer, the UID last read."""
        if self.api is not None:
            try:
                node = self.api.node()
            except Exception as err:  # any API failure: the UID read before serves
                log.warning(
                    "node %s could not be read (%s): its ResourceSlice names the UID read before",
                    self.settings.node_name,
                    api_error_reason(err),
                )
            else:
                with self._node_lock:
                    self._node = node
        with self._node_lock:
            return str((self._node.get("metadata") or {}).get("uid", ""))

    def cdi_refusal(self) -> str | None:
        """Why this node's runtime cannot apply the CDI specs, or None."""
        if self.settings.runtime_cdi != runtime.AUTO:
            return runtime.cdi_refusal("", self.settings.runtime_cdi)
        version = _runtime_version(self.node_object())
        if not version:
            return (
                f"the node's container runtime is not known yet: node {self.settings.node_name}: "
                f"{self._node_error or 'not read'}; it is read again at the next prepare"
            )
        return runtime.cdi_refusal(version, self.settings.runtime_cdi)

    def not_ready(self) -> str | None:
        """Why the driver cannot serve yet, or None."""
        if not self.registration.count:
            return f"not registered with the kubelet through {self.settings.registry_dir}"
        if not self.publisher.published.is_set():
            return "ResourceSlice not published yet"
        return None

    def start(self) -> None:
        """Read the node, clean orphaned specs, then serve and register, then publish the
        ResourceSlice (a registration before that is published once it starts)."""
        why = self.cdi_refusal()
        if why:
            log.error("claims will not be prepared on this node: %s", why)
        if self._stop_signal is not None and self._stop_signal.event.is_set():
            return  # told to stop while it read the node: serve and register nothing
        self.preparer.remove_orphans()
        if not self.settings.registry_dir.is_dir():  # made by the server: no kubelet made it
            log.warning(
                "%s does not exist: creating it, but no kubelet has made it, so none may watch "
                "it; the driver is registered only once its kubelet finds %s there (check "
                "--registry-dir (BATON_DRA_REGISTRY_DIR) if it never is)",
                self.settings.registry_dir,
                registration_path(self.settings.registry_dir).name,
            )
        self.node.start()
        try:
            self.server.start()
        except OSError as err:  # a directory that is a file, or one it may not write
            raise DraStartError(
                f"cannot serve the kubelet plugin sockets ({err}); check --plugins-dir "
                "(BATON_DRA_PLUGINS_DIR) and --registry-dir (BATON_DRA_REGISTRY_DIR)"
            ) from None
        # Only a driver that serves publishes its GPUs: a slice left by one that could not
        # start would have the scheduler send claims to a node with no driver to prepare them.
        self.publisher.start()
        log.info(
            "DRA driver %s serving %d GPUs on %s; metrics on :%d",
            names.DRA_DRIVER,
            len(self.inventory.snapshot()[1].gpus),
            self.server.endpoint,
            self.status.port,
        )

    def _release_state_dir(self) -> None:
        """Let the next driver have the state directory (once)."""
        if self._state_lock is not None:
            statelock.release(self._state_lock)
            self._state_lock = None

    def stop(self) -> None:
        """Stop everything started (the record and specs stay for the next start), then let
        the state directory go."""
        parts: list[tuple[str, Callable[[], object]]] = []
        if self.hold is not None:
            parts.append(("the fault hold on prepares", self.hold.stop))
        parts.append(
            ("the kubelet plugin server", lambda: self.server.stop(self.settings.shutdown_grace))
        )
        # Before the state directory goes: a prepare the server's stop cut may still be reading
        # its claim, and must not write once the next driver may hold the directory.
        parts.append(("claim preparation", self.preparer.close))
        parts.append(("the ResourceSlice publisher", self.publisher.stop))
        parts.append(("the node layer", self.node.stop))
        parts.append(("the state directory's lock", self._release_state_dir))
        shutdown.stop_parts("DRA driver", parts)

    def run_until(
        self, stop: threading.Event, why: Callable[[], str | None] = lambda: None
    ) -> None:
        """Start, block until `stop` is set, stop; log `why()` it stopped."""
        shutdown.run_until(self.start, self.stop, stop)
        log.info("DRA driver stopped on %s", why() or "request")


def _runtime_version(node: dict[str, Any]) -> str:
    """The node's `status.nodeInfo.containerRuntimeVersion`, or ''."""
    return str(
        ((node.get("status") or {}).get("nodeInfo") or {}).get("containerRuntimeVersion", "")
    )


def _short_enough(socket: Path, flag: str) -> None:
    """DraStartError naming `flag` where the driver's `socket` is too long to bind."""
    too_long = length_problem(socket)
    if too_long:
        raise DraStartError(f"{too_long}: pass a shorter {flag}")


def _hold_state_dir(state_dir: Path, stop: shutdown.StopSignal | None) -> int:
    """Lock the state directory, waiting up to LOCK_WAIT_S for a driver that holds it (one
    still stopping) to let it go, or until `stop`: the record is read, and orphaned specs
    judged, only then."""
    try:
        return statelock.hold(state_dir, LOCK_WAIT_S, stop)
    except statelock.StoppedWaiting as stopped:
        raise DraStoppedAtStart(f"{stopped}; nothing was started") from None
    except statelock.StateDirBusy as busy:
        raise DraStartError(
            f"{busy}: is a second driver running on this node? Stop it, or pass another "
            "--state-dir (BATON_DRA_STATE_DIR)"
        ) from None
    except OSError as err:
        raise DraStartError(
            f"cannot lock {state_dir / statelock.LOCK_FILE} ({err.strerror or err}); check "
            "--state-dir (BATON_DRA_STATE_DIR)"
        ) from None


def _writable_dir(path: Path, flag: str) -> None:
    """Make `path` if needed; DraStartError naming `flag` when the driver cannot write there
    (every prepare would fail after the slice is published)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DraStartError(f"cannot use {path} ({err.strerror}); check {flag}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise DraStartError(f"cannot write in {path}; check {flag}")
