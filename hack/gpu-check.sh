#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (driver 570 or newer): run `baton agent --backend cuda` and two
# PyTorch tenants that each hold GIB GiB on GPU 0 and take TURNS turns. The agent's headroom leaves
# room for one tenant at a time, so every turn parks the other one with the CUDA checkpoint API.
# Each tenant checks after every restore that its tensors are bit-identical and that NVML no longer
# lists the parked peer. Then prints `baton bench evacuate --backend cuda --json`.
#
# Needs: pip install torch '.[cuda]' into the virtualenv (PYTHON / BATON override the paths).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
BATON=${BATON:-.venv/bin/baton}
GIB=${GIB:-4}
TURNS=${TURNS:-5}

if ! command -v nvidia-smi >/dev/null; then
    echo "gpu-check: nvidia-smi not found; this check needs an NVIDIA GPU and its driver" >&2
    exit 2
fi
if ! "$PYTHON" -c 'import torch, pynvml; from cuda.bindings import driver' 2>/dev/null; then
    echo "gpu-check: needs PyTorch and the cuda extra: $PYTHON -m pip install torch '.[cuda]'" >&2
    exit 2
fi

echo "GPU and driver:"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0
gpu=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
# One tenant needs about GIB GiB plus 1 GiB of its own and 1 GiB of CUDA context; leave room
# for one and a half of them, so the second one's turn must park the first.
room_mib=$(( (GIB + 2) * 1024 * 3 / 2 ))
headroom_mib=$(( total_mib - room_mib ))

work=$(mktemp -d /tmp/baton-gpu-check.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

"$BATON" agent --backend cuda --socket "$work/agent.sock" --state-dir "$work/state" \
    --http-host 127.0.0.1 --http-port 0 --headroom "$headroom_mib" --max-hold 600 \
    >"$work/agent.log" 2>&1 &
pids+=("$!")
if ! timeout 60 grep -q -m1 "agent ready" <(tail -F "$work/agent.log" 2>/dev/null); then
    echo "gpu-check: the agent did not start; its log:" >&2
    cat "$work/agent.log" >&2
    exit 1
fi

tenant() {
    BATON_AGENT_SOCKET="$work/agent.sock" CUDA_VISIBLE_DEVICES="$gpu" PYTHONPATH=. \
        "$PYTHON" hack/gpu-check-tenant.py --name "$1" --peer "$2" --gpu "$gpu" \
        --gib "$GIB" --turns "$TURNS" --workdir "$work"
}
tenant a b >"$work/a.json" &
a=$!
tenant b a >"$work/b.json" &
b=$!
pids+=("$a" "$b")
status=0
wait "$a" || status=1
wait "$b" || status=1
cat "$work/a.json" "$work/b.json"
grep -E "park|restore" "$work/agent.log" | tail -n 20
if [ "$status" -ne 0 ]; then
    echo "gpu-check: a tenant failed; agent log:" >&2
    tail -n 50 "$work/agent.log" >&2
    exit 1
fi
echo "gpu-check: both tenants verified their tensors after every restore"

"$BATON" bench evacuate --backend cuda --size-mib $(( GIB * 1024 )) --json
