#!/usr/bin/env bash
# A real single Kubernetes node on loopback (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, containerd + runc with a bridge CNI network, a kubelet), from the binaries in
# $BATON_KUBE_BIN_DIR or ../shared/k8s beside the checkout. Needs root, containerd, runc,
# containernetworking-plugins and mmdebstrap (for the Baton image). Ctrl-C stops it and removes
# every process, container, mount and interface it made.
#
#   hack/local-node.sh up --install   # and install Baton with manifests/overlays/local
#   hack/local-node.sh image          # only build (or find cached) the images
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
[ -x "$python" ] || python=python3
exec "$python" -m commands.localnode "${@:-up}"
