"""`python -m commands.localnode up|image`: the local node from a shell (hack/local-node.sh)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from commands.localnode import images
from commands.localnode.binaries import require_binaries
from commands.localnode.install import HOST_DIRS, install_baton, install_baton_dra
from commands.localnode.node import CONTAINERD_SHARED, CONTAINERD_SYSTEM, LocalNode
from commands.localnode.procs import LocalNodeError


def _up(args: argparse.Namespace) -> int:
    root = Path(args.dir or tempfile.mkdtemp(prefix="baton-localnode-"))
    try:
        return _run_node(root, args.install, args.dra)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


def _run_node(root: Path, install: bool, dra: bool) -> int:
    containerd = CONTAINERD_SHARED if dra else CONTAINERD_SYSTEM
    with LocalNode(root, scratch_dirs=HOST_DIRS, containerd=containerd) as node:
        print(f"node {node.node_name} Ready in {node.timings['ready_s']:.1f} s", flush=True)
        if install:
            began = time.monotonic()
            (install_baton_dra if dra else install_baton)(node)
            print(f"Baton installed in {time.monotonic() - began:.1f} s", flush=True)
        print(f"export KUBECONFIG={node.kubeconfig}", flush=True)
        print("Ctrl-C stops the node and removes everything it started.", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            print("stopping", flush=True)
    return 0


def _image(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="baton-image-"))
    began = time.monotonic()
    built = {
        "baton": str(images.baton_image(work / "baton")),
        "baton-tenant": str(images.tenant_image(work / "tenant")),
        "pause": str(images.pause_image(work / "pause")),
        "kube-scheduler": str(images.scheduler_image(require_binaries(), work / "sched")),
    }
    print(json.dumps({**built, "seconds": round(time.monotonic() - began, 1)}))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the subcommand."""
    parser = argparse.ArgumentParser(prog="python -m commands.localnode", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the node and keep it until Ctrl-C")
    up.add_argument("--dir", help="run directory (default: a new temporary one)")
    up.add_argument(
        "--install", action="store_true", help="kubectl apply -k manifests/overlays/local"
    )
    up.add_argument(
        "--dra",
        action="store_true",
        help="containerd 2.x from the binaries' directory (CDI); --install applies local-dra",
    )
    up.set_defaults(run=_up)
    image = sub.add_parser("image", help="build (or find cached) the node's images")
    image.set_defaults(run=_image)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except LocalNodeError as err:
        print(f"local node: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
