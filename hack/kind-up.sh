#!/usr/bin/env bash
# Baton on a local kind cluster with simulated GPUs: create the cluster, build and load the image,
# apply manifests/overlays/kind, run the example GRPO tenants and print `baton status` while they
# take turns. Needs docker, kind and kubectl. CI does not run this (no container engine there).
#
#   hack/kind-up.sh            # cluster "baton"; BATON_KIND_CLUSTER=name to choose another
#   BATON_KIND_KEEP_JOB=1 hack/kind-up.sh   # leave an existing example Job in place
set -euo pipefail
cd "$(dirname "$0")/.."

cluster="${BATON_KIND_CLUSTER:-baton}"
image="baton:dev"
namespace="baton-system"
demo_namespace="baton-demo"
gpu_node_label="baton.dev/gpu-node"

need() {
    command -v "$1" >/dev/null 2>&1 || { echo "kind-up: needs '$1' on PATH" >&2; exit 1; }
}
need docker
need kind
need kubectl

if ! kind get clusters 2>/dev/null | grep -qx "$cluster"; then
    echo "kind-up: creating cluster $cluster (one control plane, one worker)"
    kind create cluster --name "$cluster" --wait 120s --config - <<'KIND'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
KIND
fi
kubectl config use-context "kind-$cluster" >/dev/null

echo "kind-up: building $image"
docker build --build-arg BATON_EXTRAS= -t "$image" .
kind load docker-image "$image" --name "$cluster"

for node in $(kubectl get nodes -o name -l '!node-role.kubernetes.io/control-plane'); do
    kubectl label --overwrite "$node" "$gpu_node_label=true" >/dev/null
done

echo "kind-up: installing Baton (manifests/overlays/kind)"
kubectl get namespace "$namespace" >/dev/null 2>&1 || kubectl create namespace "$namespace"
kubectl -n "$namespace" get secret baton-coordination >/dev/null 2>&1 ||
    kubectl -n "$namespace" create secret generic baton-coordination \
        --from-literal=token="$(openssl rand -hex 32)"
kubectl apply -k manifests/overlays/kind
kubectl -n "$namespace" rollout status daemonset/baton-deviceplugin --timeout=180s
kubectl -n "$namespace" rollout status daemonset/baton-agent --timeout=180s
kubectl -n "$namespace" rollout status deployment/baton-extender --timeout=180s
kubectl -n "$namespace" rollout status deployment/baton-scheduler --timeout=180s
kubectl -n "$namespace" rollout status deployment/baton-coordinator --timeout=180s

if [ -z "${BATON_KIND_KEEP_JOB-}" ]; then
    kubectl -n "$demo_namespace" delete job grpo-tenant --ignore-not-found --wait=true
fi
echo "kind-up: starting the example tenants (manifests/overlays/kind-examples)"
kubectl apply -k manifests/overlays/kind-examples

# Print every node agent's view each time the Job is still running after a short wait.
until kubectl -n "$demo_namespace" wait --for=condition=complete job/grpo-tenant \
    --timeout=5s >/dev/null 2>&1; do
    if kubectl -n "$demo_namespace" wait --for=condition=failed job/grpo-tenant \
        --timeout=1s >/dev/null 2>&1; then
        echo "kind-up: the example Job failed; its logs:" >&2
        kubectl -n "$demo_namespace" logs -l job-name=grpo-tenant --prefix --tail=50 >&2 || true
        exit 1
    fi
    for pod in $(kubectl -n "$namespace" get pods -l app.kubernetes.io/name=baton-agent -o name); do
        echo "--- $pod"
        kubectl -n "$namespace" exec "$pod" -c agent -- baton status || true
    done
done

echo "kind-up: the tenants finished; their last turns:"
kubectl -n "$demo_namespace" logs -l job-name=grpo-tenant --prefix --tail=5
