"""A bare real node (containerd 2.x, so the chart's `auto` takes the DRA path) on which the
tests install Baton with Helm themselves, and kubectl as the Baton plugin finds it.

One local node runs per machine: this package's node is brought up for the package and torn
down after it, like tests/k8s/dra's. Skips as tests/k8s does, and without helm or containerd 2.x.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from baton.contract import names
from commands.localnode.binaries import find_containerd2, find_helm, search_dirs
from commands.localnode.node import LocalNode
from tests.k8s.cluster import Cluster
from tests.k8s.conftest import _skip_unless_possible
from tests.k8s.dra.conftest import containerd2_node

CHART = Path(__file__).resolve().parents[3] / "charts" / "baton"


class HelmNode(Cluster):
    """The node, `helm` and `kubectl baton` with the admin's kubeconfig."""

    def __init__(self, node: LocalNode, helm_binary: Path) -> None:
        super().__init__(node)
        self.helm_binary = helm_binary
        self.kubeconfig = str(node.plane.admin_kubeconfig)

    def env(self, kubeconfig: str | None = None) -> dict[str, str]:
        """kubectl finds the plugin beside this Python (the package's console script)."""
        path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
        return {**os.environ, "PATH": path, "KUBECONFIG": kubeconfig or self.kubeconfig}

    def helm(self, *args: str, timeout: float = 240) -> str:
        """helm in the release namespace; stdout (AssertionError with its output on failure)."""
        argv = [str(self.helm_binary), "-n", names.NAMESPACE, *args]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=self.env(), check=False
        )
        if done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def plugin(
        self, *args: str, kubeconfig: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """`kubectl baton ARGS` as a user runs it."""
        kubectl = shutil.which("kubectl")
        assert kubectl, "kubectl"
        done = subprocess.run(
            [kubectl, "baton", *args],
            capture_output=True, text=True, timeout=60, env=self.env(kubeconfig), check=False,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl baton {' '.join(args)}: {done.stdout}{done.stderr}")
        return done


@pytest.fixture(scope="package")
def helm_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HelmNode]:
    """A Ready node on containerd 2.x with nothing of Baton installed."""
    _skip_unless_possible()
    helm_binary = find_helm()
    if helm_binary is None or find_containerd2() is None:
        where = ", ".join(str(d) for d in search_dirs())
        pytest.skip(f"needs containerd-v2 and helm (helm-v*-linux-amd64.xz) in {where}")
    node = containerd2_node(tmp_path_factory, "localnode-helm")
    try:
        node.start()
        yield HelmNode(node, helm_binary)
    finally:
        node.close()
