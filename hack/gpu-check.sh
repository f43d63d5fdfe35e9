#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (driver 570 or newer), as root, on cgroup v2: run
# `baton agent --backend cuda` as it runs on a Kubernetes node, with two PyTorch tenants as pods.
#
# Each tenant runs in a cgroup of its own, named as the kubelet (cgroupfs driver) names pod
# cgroups: /sys/fs/cgroup/baton-gpu-check-<pid>/kubepods/besteffort/pod<UID>/trainer. A fake API
# server (tests/harness/fakeapi.py) serves the two pods to the agent's pod watch, so the agent
# learns each tenant from its pod and finds its processes from that cgroup. Each tenant holds
# GIB GiB on GPU 0 and takes TURNS turns of HOLD seconds; the headroom leaves room for one at a
# time, so every turn parks the other with the CUDA checkpoint API. Each tenant checks after
# every restore that its tensors are bit-identical and that NVML no longer lists the parked
# peer. Once a tenant is parked the agent is killed (SIGKILL) and started again on the same
# state directory: the parked tenant's next turn must restore it. Last, it prints park (out)
# and restore (in) GB/s from the agents' logs against the host<->device copy rate measured in
# the same run, as JSON. Then it checks that real SFT and GRPO tenants trained on the GPU while
# taking turns (parked by their own TorchParker, `app` backend) match the same tenants trained
# alone bit for bit (hack/train-exactness.py --device cuda).
#
# Needs: pip install torch '.[cuda,dev]' into the virtualenv (PYTHON / BATON override the paths).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
BATON=${BATON:-.venv/bin/baton}
GIB=${GIB:-4}
TURNS=${TURNS:-6}
HOLD=${HOLD:-2}
PORT=${PORT:-19460}
NODE="gpu-check-node"

fail() {
    echo "gpu-check: $*" >&2
    exit 2
}
command -v nvidia-smi >/dev/null || fail "nvidia-smi not found; this check needs an NVIDIA GPU and its driver"
[ "$(id -u)" -eq 0 ] || fail "run as root: it creates cgroups and the agent reads every process's /proc"
[ -f /sys/fs/cgroup/cgroup.controllers ] || fail "needs cgroup v2 mounted at /sys/fs/cgroup"
"$PYTHON" -c 'import torch, pynvml, kubernetes, yaml; from cuda.bindings import driver' 2>/dev/null ||
    fail "needs PyTorch and the cuda and dev extras: $PYTHON -m pip install torch '.[cuda,dev]'"

echo "GPU and driver:"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0
gpu=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
# One tenant needs about GIB GiB plus 1 GiB of its own and 1 GiB of CUDA context; leave room
# for one and a half of them, so the second one's turn must park the first.
tenant_mib=$(((GIB + 2) * 1024))
headroom_mib=$((total_mib - tenant_mib * 3 / 2))

work=$(mktemp -d /tmp/baton-gpu-check.XXXXXX)
cgroot=/sys/fs/cgroup/baton-gpu-check-$$
declare -A uid cgroup
for name in a b; do
    uid[$name]=$(cat /proc/sys/kernel/random/uuid)
    cgroup[$name]=$cgroot/kubepods/besteffort/pod${uid[$name]}/trainer
done
pids=()
agent_pid=""
cleanup() {
    for pid in "${pids[@]}" ${agent_pid:+"$agent_pid"}; do
        kill "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    for name in a b; do # the deepest first: a cgroup goes only once it is empty
        dir=${cgroup[$name]}
        while [ "$dir" != /sys/fs/cgroup ] && [ -d "$dir" ]; do
            rmdir "$dir" 2>/dev/null || break
            dir=$(dirname "$dir")
        done
    done
    rm -rf "$work"
}
trap cleanup EXIT

wait_for_line() { # FILE PATTERN SECONDS
    local end=$((SECONDS + $3))
    until grep -q "$2" "$1" 2>/dev/null; do
        [ "$SECONDS" -lt "$end" ] || return 1
        sleep 0.2
    done
}

for name in a b; do
    mkdir -p "${cgroup[$name]}"
done
PYTHONPATH=. "$PYTHON" hack/gpu-check-helper.py pods "$work/kubeconfig" "$NODE" "$gpu" \
    "$tenant_mib" "a=${uid[a]}" "b=${uid[b]}" >"$work/api.log" 2>&1 &
pids+=("$!")
wait_for_line "$work/api.log" "fake API server on" 30 || {
    cat "$work/api.log" >&2
    fail "the fake API server did not start"
}

start_agent() { # LOG
    "$BATON" agent --backend cuda --socket "$work/agent.sock" --state-dir "$work/state" \
        --node-name "$NODE" --kubeconfig "$work/kubeconfig" --http-host 127.0.0.1 \
        --http-port "$PORT" --headroom "$headroom_mib" --max-hold 600 >"$1" 2>&1 &
    agent_pid=$!
    if ! wait_for_line "$1" "agent ready" 60; then
        echo "gpu-check: the agent did not start; its log:" >&2
        cat "$1" >&2
        exit 1
    fi
}
start_agent "$work/agent1.log"

tenant() { # NAME PEER: runs in its pod's cgroup (the subshell moves itself there, then execs)
    (
        echo "$BASHPID" >"${cgroup[$1]}/cgroup.procs"
        exec env BATON_AGENT_SOCKET="$work/agent.sock" CUDA_VISIBLE_DEVICES="$gpu" PYTHONPATH=. \
            "$PYTHON" hack/gpu-check-tenant.py --name "$1" --peer "$2" --gpu "$gpu" \
            --gib "$GIB" --turns "$TURNS" --hold "$HOLD" --workdir "$work"
    ) >"$work/$1.json" 2>"$work/$1.err"
}
tenant a b &
a=$!
tenant b a &
b=$!
pids+=("$a" "$b")

parked=$(PYTHONPATH=. "$PYTHON" hack/gpu-check-helper.py wait-parked "http://127.0.0.1:$PORT" 300) ||
    fail "no tenant was parked; agent log: $(tail -n 30 "$work/agent1.log")"
echo "gpu-check: $parked is parked; killing the agent and starting it again"
kill -KILL "$agent_pid"
wait "$agent_pid" 2>/dev/null || true
start_agent "$work/agent2.log"

status=0
wait "$a" || status=1
wait "$b" || status=1
cat "$work/a.json" "$work/b.json"
if [ "$status" -ne 0 ]; then
    echo "gpu-check: a tenant failed:" >&2
    tail -n 20 "$work/a.err" "$work/b.err" >&2
    tail -n 50 "$work/agent2.log" >&2
    exit 1
fi
if ! grep -q "restore $parked on" "$work/agent2.log"; then
    echo "gpu-check: the restarted agent never restored $parked" >&2
    exit 1
fi
echo "gpu-check: both tenants verified their tensors after every restore, across an agent restart"

"$PYTHON" hack/gpu-check-helper.py copy-rate "$GIB" >"$work/copy.json"
"$PYTHON" hack/gpu-check-helper.py figures "$work/copy.json" "$work/agent1.log" "$work/agent2.log"

echo "Real training tenants on the GPU, alone against taking turns (must be identical):"
PYTHONPATH=. "$PYTHON" hack/train-exactness.py --device cuda
