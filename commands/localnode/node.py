"""One real Kubernetes node on loopback: control plane, containerd, bridge network, kubelet."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO

from commands.localnode import images
from commands.localnode.binaries import KubeBinaries, cache_dir, find_containerd2, require_binaries
from commands.localnode.controlplane import ControlPlane
from commands.localnode.kubelet import (
    ROOT_DIR,
    clean_kubelet_dirs,
    forget_earlier_nodes,
    kubelet_process,
    remove_pod_cgroups,
)
from commands.localnode.procs import LocalNodeError, Process, run, stop_all, wait_for
from commands.localnode.runtime import Containerd

LOCK_FILE = Path("/run/baton-localnode.lock")
"""One local node per machine: the kubelet's directories and ports are the machine's."""
READY_TIMEOUT = 60.0
CONTAINERD_SYSTEM = "system"
"""The system's containerd (Debian's 1.6: no CDI), what the device-plugin path runs on."""
CONTAINERD_SHARED = "shared"
"""containerd 2.x from the Kubernetes binaries' directory (CDI on), what the DRA path needs."""


def default_node_name() -> str:
    """The hostname if it resolves to loopback (so `kubectl logs` reaches the kubelet)."""
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        address = ""
    return name if address.startswith("127.") else "localhost"


class LocalNode:
    """Start with `start()` (or `with`); `close()` leaves nothing running, mounted or listening."""

    def __init__(
        self,
        root: Path,
        binaries: KubeBinaries | None = None,
        node_name: str | None = None,
        scratch_dirs: tuple[Path, ...] = (),
        containerd: str = CONTAINERD_SYSTEM,
    ) -> None:
        """`containerd`: CONTAINERD_SYSTEM or CONTAINERD_SHARED (each keeps its own images)."""
        self.root = root
        self.binaries = binaries or require_binaries()
        self.node_name = node_name or default_node_name()
        self.plane = ControlPlane(root, self.binaries, self.node_name)
        if containerd == CONTAINERD_SHARED:
            bin_dir = find_containerd2()
            if bin_dir is None:
                raise LocalNodeError("no containerd-v2.*-linux-amd64.tar.xz beside the binaries")
            self.containerd = Containerd(root, cache_dir() / "containerd2", bin_dir)
        elif containerd == CONTAINERD_SYSTEM:
            self.containerd = Containerd(root, cache_dir() / "containerd")
        else:
            raise LocalNodeError(f"containerd must be {CONTAINERD_SYSTEM} or {CONTAINERD_SHARED}")
        self.kubelet: Process | None = None
        self.timings: dict[str, float] = {}
        self._lock: IO[str] | None = None
        self._created_kubelet_root = False
        self._old_handlers: dict[int, object] = {}
        self.scratch_dirs = scratch_dirs
        """Host directories pods will create (hostPath volumes): each starts absent, and is
        removed on close (one already there is set aside meanwhile, `ScratchDirs`)."""
        self._scratch = ScratchDirs(scratch_dirs)

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig."""
        return self.plane.admin_kubeconfig

    def kubectl(
        self, *args: str, timeout: float = 60.0, check: bool = True, stdin: str | None = None
    ) -> str:
        """Run kubectl as the admin; its stdout."""
        argv = ["kubectl", f"--kubeconfig={self.kubeconfig}", *args]
        return run(argv, timeout, check, input=stdin)

    def start(self) -> LocalNode:
        """Bring everything up and wait until the node is Ready; cleans up if anything fails."""
        began = time.monotonic()
        self._take_lock()
        self._trap_signals()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._created_kubelet_root = not ROOT_DIR.exists()
            self._scratch.set_aside()
            self.plane.start()
            self.timings["control_plane_s"] = time.monotonic() - began
            self.containerd.start(self.root / "logs" / "containerd.log")
            self._import_images()
            self.timings["images_s"] = time.monotonic() - began - self.timings["control_plane_s"]
            forget_earlier_nodes()
            self.start_kubelet()
            wait_for("the node to be Ready", self._node_ready, READY_TIMEOUT, every=0.5)
            self.timings["ready_s"] = time.monotonic() - began
        except BaseException:
            self.close()
            raise
        return self

    def _import_images(self) -> None:
        have = self.containerd.images()
        work = self.root / "build"
        wanted = {
            images.PAUSE_IMAGE: images.pause_image(work),
            images.SCHEDULER_IMAGE: images.scheduler_image(self.binaries, work),
            images.BATON_IMAGE: images.baton_image(work / "baton"),
            images.TENANT_IMAGE: images.tenant_image(work / "tenant"),
        }
        stamps = self.containerd.root / "imported"
        stamps.mkdir(parents=True, exist_ok=True)
        for ref, archive in wanted.items():
            stamp = stamps / ref.replace("/", "_")
            known = stamp.exists() and stamp.read_text() == archive.name
            if not known or not any(h.endswith(ref.split("/")[-1]) for h in have):
                self.containerd.import_image(archive)
                stamp.write_text(archive.name)

    def start_kubelet(self) -> None:
        """Start (or start again) the kubelet."""
        self.kubelet = kubelet_process(
            self.binaries.kubelet,
            self.plane.pki,  # type: ignore[arg-type]
            self.root,
            self.plane.server,
            self.node_name,
            self.containerd.socket,
        ).start()

    def stop_kubelet(self) -> None:
        """Stop the kubelet (its containers keep running, as on a real node)."""
        if self.kubelet is not None:
            self.kubelet.stop()
            self.kubelet = None

    def _node_ready(self) -> bool | None:
        assert self.kubelet is not None
        self.kubelet.check()
        self.plane.check()
        try:
            node = self.plane.get(f"/api/v1/nodes/{self.node_name}")
        except LocalNodeError:
            return None
        assert isinstance(node, dict)
        conditions = node.get("status", {}).get("conditions", [])
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        taints = node.get("spec", {}).get("taints") or []
        return True if ready and not taints else None

    def close(self) -> None:
        """Stop the kubelet, every container, containerd and the control plane; undo mounts.

        Every step runs even when one before it failed (a failure must not leave the rest
        running or mounted); the first failure is raised at the end."""
        failures: list[Exception] = []
        steps: list[Callable[[], None]] = [
            self.stop_kubelet,
            self.containerd.stop,
            lambda: clean_kubelet_dirs(self._created_kubelet_root),
            remove_pod_cgroups,
            self._scratch.put_back,
            self.plane.close,
            stop_all,
            self._restore_signals,
            self._release_lock,
        ]
        for step in steps:
            try:
                step()
            except Exception as err:  # each step must run
                failures.append(err)
        if failures:
            raise failures[0]

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _take_lock(self) -> None:
        lock = LOCK_FILE.open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            lock.close()
            raise LocalNodeError(f"another local node runs on this machine ({LOCK_FILE})") from err
        lock.write(str(os.getpid()))
        lock.flush()
        self._lock = lock

    def _trap_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.close()
            raise KeyboardInterrupt(f"signal {signum}")

        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, on_signal)

    def _restore_signals(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._old_handlers.clear()

    def __enter__(self) -> LocalNode:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class ScratchDirs:
    """Host directories a node's pods fill (the agent's state, the fake GPUs, CDI specs), kept
    from one node to the next.

    A node must start without them: an agent that loads an earlier node's state brings back its
    tenants, their parked memory and their accounting. One that is there (left by a node that was
    killed, or a Baton installed on this host) is renamed aside for the node's life and put back
    when it closes; what the node made is removed.
    """

    def __init__(self, dirs: tuple[Path, ...]) -> None:
        self.dirs = dirs
        self._aside: list[tuple[Path, Path]] = []

    @staticmethod
    def aside_of(directory: Path) -> Path:
        """Where `directory` waits while a node runs."""
        return directory.with_name(f".{directory.name}.before-localnode")

    def set_aside(self) -> None:
        """Move every directory that exists aside; `LocalNodeError` if one cannot be."""
        for directory in self.dirs:
            aside = self.aside_of(directory)
            if aside.exists():
                raise LocalNodeError(
                    f"{aside} was set aside by a node that never closed: move it back to "
                    f"{directory} (or remove it) and start again"
                )
            if not directory.exists():
                continue
            try:
                directory.rename(aside)
            except OSError as err:
                raise LocalNodeError(
                    f"cannot set {directory} aside for a fresh node: {err.strerror}"
                ) from None
            self._aside.append((directory, aside))

    def put_back(self) -> None:
        """Remove what the node made; return what was set aside to its place."""
        for directory in self.dirs:
            shutil.rmtree(directory, ignore_errors=True)
        while self._aside:
            directory, aside = self._aside.pop()
            aside.rename(directory)
