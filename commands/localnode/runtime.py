"""containerd with the CRI plugin, a bridge CNI network, and the teardown that leaves nothing."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from commands.localnode.procs import LocalNodeError, Process, run, wait_for

CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
BRIDGE = "baton0"
POD_SUBNET = "10.244.0.0/24"
NAMESPACE = "k8s.io"
PAUSE_IMAGE = "localhost/baton-localnode-pause:1"


def cni_bin_dir() -> Path:
    """The directory holding the bridge, host-local and loopback plugins."""
    for candidate in CNI_BIN_DIRS:
        if (Path(candidate) / "bridge").exists():
            return Path(candidate)
    raise LocalNodeError(
        f"no CNI plugins in {' or '.join(CNI_BIN_DIRS)}: install containernetworking-plugins"
    )


class Containerd:
    """containerd for the node: images in a persistent root, sockets and state in the run dir."""

    def __init__(self, run_dir: Path, image_root: Path, bin_dir: Path | None = None) -> None:
        """`bin_dir`: containerd 2.x's binaries (CDI on); None runs the system's (Debian's 1.6)."""
        self.run_dir = run_dir
        self.bin_dir = bin_dir
        self.state = Path("/run/baton-localnode/containerd")
        self.root = image_root
        self.socket = self.state / "containerd.sock"
        self.cni_conf = run_dir / "cni"
        self.ipam = run_dir / "cni-ipam"
        self.proc: Process | None = None

    def _command(self, name: str) -> str:
        return str(self.bin_dir / name) if self.bin_dir else name

    def _config(self) -> Path:
        if self.bin_dir is not None:
            return self._config_v3()
        if shutil.which("containerd") is None or shutil.which("runc") is None:
            raise LocalNodeError("containerd and runc are needed: apt-get install containerd runc")
        text = run(["containerd", "config", "default"])
        cri = {
            "restrict_oom_score_adj": "true",
            "sandbox_image": f'"{PAUSE_IMAGE}"',
            "bin_dir": f'"{cni_bin_dir()}"',
            "conf_dir": f'"{self.cni_conf}"',
        }
        for key, value in cri.items():
            text, count = re.subn(rf"(?m)^(\s*){key} = .*$", rf"\g<1>{key} = {value}", text)
            if count == 0:
                raise LocalNodeError(f"containerd's default config has no {key} setting")
        text = re.sub(r'(?m)^root = ".*"$', f'root = "{self.root}"', text)
        text = re.sub(r'(?m)^state = ".*"$', f'state = "{self.state}"', text)
        text = re.sub(
            r'(?m)^(\[grpc\]\n\s*address = )".*"$', rf'\g<1>"{self.socket}"', text, count=1
        )
        config = self.run_dir / "containerd.toml"
        config.write_text(text)
        return config

    def _config_v3(self) -> Path:
        """containerd 2.x's config (version 3): CDI on, the same CRI settings as for 1.6."""
        if shutil.which("runc") is None:
            raise LocalNodeError("runc is needed: apt-get install runc")
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        text = f"""version = 3
root = "{self.root}"
state = "{self.state}"
[grpc]
  address = "{self.socket}"
[{runtime}]
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  restrict_oom_score_adj = true
  [{runtime}.cni]
    bin_dirs = ["{cni_bin_dir()}"]
    conf_dir = "{self.cni_conf}"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{PAUSE_IMAGE}"
"""
        config = self.run_dir / "containerd.toml"
        config.write_text(text)
        return config

    def _network(self) -> None:
        self.cni_conf.mkdir(parents=True, exist_ok=True)
        conflist = {
            "cniVersion": "0.4.0",
            "name": "baton-localnode",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.ipam),
                        "ranges": [[{"subnet": POD_SUBNET}]],
                    },
                },
                {"type": "loopback"},
            ],
        }
        (self.cni_conf / "10-baton.conflist").write_text(json.dumps(conflist, indent=2))

    def start(self, logs: Path) -> None:
        """Start containerd and wait for its socket to answer."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)
        self._network()
        config = self._config()
        env = {"PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}"} if self.bin_dir else None
        argv = [self._command("containerd"), "--config", str(config)]
        self.proc = Process("containerd", argv, logs, env).start()
        wait_for("containerd to serve", self._answers, 30.0)

    def _answers(self) -> bool | None:
        assert self.proc is not None
        self.proc.check()
        done = subprocess.run(
            self.ctr("version"), capture_output=True, timeout=10, check=False, text=True
        )
        return True if done.returncode == 0 else None

    def ctr(self, *args: str) -> list[str]:
        """A `ctr` command line against this containerd, in the CRI namespace."""
        ctr = self._command("ctr")
        return [ctr, "--address", str(self.socket), "--namespace", NAMESPACE, *args]

    def images(self) -> set[str]:
        """References of the images it holds."""
        return set(run(self.ctr("images", "ls", "-q")).split())

    def import_image(self, archive: Path) -> None:
        """Import a docker-archive tarball."""
        run(self.ctr("images", "import", str(archive)), timeout=300)

    def containers(self) -> list[str]:
        """IDs of every container (pod sandboxes included)."""
        return run(self.ctr("containers", "ls", "-q"), check=False).split()

    def remove_all_containers(self) -> None:
        """Kill and delete every task and container it runs."""
        for cid in self.containers():
            run(self.ctr("tasks", "kill", "-s", "SIGKILL", cid), check=False)
        for cid in self.containers():
            run(self.ctr("tasks", "delete", "-f", cid), check=False)
            run(self.ctr("containers", "rm", cid), check=False)

    def stop(self) -> None:
        """Remove its containers, stop it, and undo what pods left: mounts, netns, the bridge."""
        if self.proc is not None and self.proc.running():
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                self.remove_all_containers()
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
        kill_shims(self.state)
        unmount_under(self.state, Path("/run/netns"), Path("/var/run/netns"))
        for netns in Path("/run/netns").glob("cni-*"):
            remove_netns(netns)
        if Path(f"/sys/class/net/{BRIDGE}").exists():
            run(["ip", "link", "delete", BRIDGE], check=False)
        shutil.rmtree(self.state.parent, ignore_errors=True)
        shutil.rmtree(self.ipam, ignore_errors=True)


def kill_shims(state: Path) -> None:
    """SIGKILL containerd-shim processes serving containers under `state`."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "containerd-shim" in cmdline and str(state) in cmdline:
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), 9)


def remove_netns(path: Path) -> None:
    """Remove a pod's network namespace file; one mounted again since the unmount pass (a
    sandbox the CNI plugin was still setting up) is detached lazily first."""
    try:
        path.unlink(missing_ok=True)
        return
    except OSError:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
    try:
        path.unlink(missing_ok=True)
    except OSError as err:
        raise LocalNodeError(f"cannot remove network namespace {path}: {err.strerror}") from None


def mounts_under(*roots: Path) -> list[str]:
    """Mount points at or below any of `roots`, deepest first."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if any(point == str(r) or point.startswith(f"{r}/") for r in roots):
            found.append(point)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def unmount_under(*roots: Path) -> None:
    """Unmount (lazily, as a last resort) every mount below `roots`."""
    for point in mounts_under(*roots):
        done = subprocess.run(["umount", point], capture_output=True, check=False)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
