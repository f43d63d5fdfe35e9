#!/usr/bin/env bash
# Baton's GPU paths on one real NVIDIA GPU, on the lent machine's image as it is: its python3,
# no network, as root. Prepare here: hack/gpu-check/fetch-wheels.sh (the wheels the image lacks,
# into the ignored hack/gpu-check/wheels, named in the device call's carry); there, run
# `hack/gpu-check.sh`. With --dry-run it runs every step that needs no GPU against stand-ins of
# libcuda and libnvidia-ml (hack/gpu-check/standins, built with gcc), as CI does
# (tests/hack/test_gpu_check_dry_run.py).
#
# Steps, each logging to $OUT/gpu-check as it goes (figures as JSON there, one file per step):
# 1. versions.json: installs the carried wheels into a private site directory first on
#    PYTHONPATH, prints every version it depends on, fails at once on a missing package or
#    call or a version the cuda backend refuses.
# 2. cuda.json, evidence.json: `baton agent --backend cuda` with two PyTorch tenants in cgroups
#    named as the kubelet names pod cgroups (cgroup v2 where it is mounted, else a private
#    mount), served to the agent's pod watch by a fake API server. Each opens its session, then
#    makes its CUDA context, holds GIB GiB and takes TURNS turns of HOLD s; the GPU is declared
#    to hold one of them, so every switch parks the other. After each restore a tenant checks
#    its memory bit for bit and that NVML no longer lists its parked peer. Once one is parked,
#    the agent is killed and started again on its state: its next turn must restore it. Passes
#    only on evidence: a park for every switch, each tenant saw its peer parked, the restarted
#    agent restored the parked one. cuda.json: park/restore GB/s against a pinned copy.
# 3. train-exactness.json: SFT and GRPO tenants on the GPU, alone and taking turns (parked by
#    their TorchParker, app backend, with memory_reserved before and after), bit for bit.
# 4. bench.json: `baton bench train --device cuda`: duty efficiency with real kernels, and
#    each tenant's GPU phase (turn_s) while sharing against alone.
# 5. handoff-2.json, handoff-40.json: `baton bench handoff --backend cuda` (three tenants that
#    fit, each holding real GPU memory, so nothing moves) with 2 ms and 40 ms turns, the agent
#    with no backend and the bare relay measured in the same run.
#
# The logs and figures end as one archive, $OUT/gpu-check.tar.gz, written also when a step fails
# or the time bound cuts it off: the lent machine hands back at most 8 files from $OUT, and the
# check writes about 17. PACK=0 leaves them as the folder $OUT/gpu-check.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-$repo/hack/gpu-check/wheels}
# The whole check, its cleanup after the bound included, fits 450 s: half the 15 minutes of device
# time a session has there, so a rerun fits too (a device call's timeout_s of 450 holds it).
BUDGET_S=${BUDGET_S:-420}
KILL_AFTER_S=10 # after the bound's TERM, then KILL
CLEANUP_S=10    # the most kill_cgroups waits for the check's processes to go
GIB=${GIB:-4}
TURNS=${TURNS:-4}
HOLD=${HOLD:-1}
PORT=${PORT:-19460}
NODE="gpu-check-node"

[ "$(id -u)" -eq 0 ] || {
    echo "gpu-check: run as root: it creates cgroups and the agent reads every /proc" >&2
    exit 1
}
# On cgroup v2: where it is mounted, else in a private mount namespace with a mount of its own.
if [ ! -f /sys/fs/cgroup/cgroup.controllers ] && [ -z "${GPU_CHECK_OWN_CGROUP:-}" ]; then
    export GPU_CHECK_OWN_CGROUP=1
    exec unshare -m --propagation private "$0" "$@"
fi
if [ -n "${GPU_CHECK_OWN_CGROUP:-}" ] && [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
    mount -t cgroup2 none /sys/fs/cgroup
fi

kill_cgroups() { # every process left in the check's cgroups, then the cgroups, deepest first
    [ -d "$1" ] || return 0
    local end=$((SECONDS + CLEANUP_S)) left
    left=$(find "$1" -name cgroup.procs -exec cat {} +)
    while [ -n "$left" ] && [ "$SECONDS" -lt "$end" ]; do
        for pid in $left; do kill -KILL "$pid" 2>/dev/null || true; done
        sleep 0.2
        left=$(find "$1" -name cgroup.procs -exec cat {} +)
    done
    find "$1" -depth -type d -exec rmdir {} + 2>/dev/null || true
}

# Bounded as a whole, well under the device call's 10 minutes; what the bound cuts off is
# cleaned up here, outside it (a shell runs no trap while it waits for a command).
if [ -z "${GPU_CHECK_WORK:-}" ]; then
    GPU_CHECK_WORK=$(mktemp -d /tmp/baton-gpu-check.XXXXXX) # short: the agent's socket is here
    export GPU_CHECK_WORK GPU_CHECK_CGROUPS=/sys/fs/cgroup/baton-gpu-check-$$
    OUT=${OUT:-$(mktemp -d /tmp/baton-gpu-check-out.XXXXXX)}
    export OUT
    mkdir -p "$OUT/gpu-check"
    status=0
    timeout --kill-after="$KILL_AFTER_S" "$BUDGET_S" "$0" "$@" || status=$?
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
        echo "gpu-check: FAILED: stopped after $BUDGET_S s" | tee -a "$OUT/gpu-check/check.log" >&2
    fi
    kill_cgroups "$GPU_CHECK_CGROUPS"
    if [ -f "$GPU_CHECK_WORK/persistence-set" ]; then # the GPU's setting as the check found it
        nvidia-smi -pm 0 -i 0 >>"$OUT/gpu-check/persistence.log" 2>&1 || true
    fi
    rm -rf "$GPU_CHECK_WORK"
    if [ "${PACK:-1}" != 0 ]; then # one archive in place of the folder's many files
        tar -czf "$OUT/gpu-check.tar.gz" -C "$OUT" gpu-check && rm -rf "$OUT/gpu-check"
    fi
    exit "$status"
fi

logs="$OUT/gpu-check"
exec > >(tee -a "$logs/check.log") 2>&1

fail() {
    echo "gpu-check: FAILED: $*" >&2
    exit 1
}
work=$GPU_CHECK_WORK
cgroot=$GPU_CHECK_CGROUPS
children=()
agent_pid=""
cleanup() {
    for pid in "${children[@]}" ${agent_pid:+"$agent_pid"}; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${children[@]}" ${agent_pid:+"$agent_pid"}; do # not `wait`: tee is a child too
        wait "$pid" 2>/dev/null || true
    done
    kill_cgroups "$cgroot"
}
trap cleanup EXIT

echo "== 1. versions (python: $PYTHON; wheels: $WHEELS)"
site="$work/site"
ls "$WHEELS"/*.whl >/dev/null 2>&1 || fail "no wheels in $WHEELS: run hack/gpu-check/fetch-wheels.sh"
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    "$WHEELS"/*.whl >"$logs/pip.log" 2>&1 || fail "installing the wheels failed: $(tail -n 5 "$logs/pip.log")"
export PYTHONPATH="$site:$repo" # the carried wheels before the image's, then the checkout
env_dry=()
if [ "$DRY" -eq 1 ]; then
    standins="$work/standins"
    mkdir -p "$standins" "$work/gpustate"
    gcc -shared -fPIC -O1 -Wall -Werror -o "$standins/libcuda.so.1" hack/gpu-check/standins/fakecuda.c
    gcc -shared -fPIC -O1 -Wall -Werror -o "$standins/libnvidia-ml.so.1" hack/gpu-check/standins/fakenvml.c
    export LD_LIBRARY_PATH="$standins${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export FAKE_GPU_STATE="$work/gpustate" FAKE_CUDA_LOG="$logs/standin-cuda.log"
    env_dry=(--stand-in)
fi
"$PYTHON" hack/gpu-check/versions.py "${env_dry[@]}" | tee "$logs/versions.json" ||
    fail "versions: see above"

echo "== 2. cuda backend: two tenants in pod cgroups, parked and restored across an agent restart"
if [ "$DRY" -eq 1 ]; then
    gpu=$("$PYTHON" -c 'import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0)))')
else
    # A restore needs persistence mode or a prior cuInit (the agent calls cuInit); an "operation
    # not permitted" restore was reported fixed by persistence mode (NVIDIA/cuda-checkpoint#25).
    # It is turned on only where it is off, said here, and turned off again at the end, by the
    # bound's wrapper (which runs also when the bound cuts the check off).
    persistence=$(nvidia-smi --query-gpu=persistence_mode --format=csv,noheader -i 0 2>&1 || true)
    echo "gpu-check: persistence mode: $persistence" | tee "$logs/persistence.log"
    if [ "$persistence" = "Disabled" ] && nvidia-smi -pm 1 -i 0 >>"$logs/persistence.log" 2>&1; then
        touch "$work/persistence-set"
        echo "gpu-check: persistence mode enabled for the check; disabled again at its end"
    fi
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0
    gpu=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
fi
# The pods declare GIB+1 GiB; the agent's inventory is the real GPU minus a headroom that
# leaves room for one and a half of them, so each switch must park the other.
tenant_mib=$(((GIB + 1) * 1024))
total_mib=$("$PYTHON" -c "import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByUUID('$gpu'); print(pynvml.nvmlDeviceGetMemoryInfo(h).total >> 20)")
headroom_mib=$((total_mib - tenant_mib * 3 / 2))
budget_mib=$((tenant_mib * 4)) # host memory for parked tenants: set here, not half of MemTotal
declare -A uid cgroup
for name in a b; do
    uid[$name]=$(cat /proc/sys/kernel/random/uuid)
    cgroup[$name]=$cgroot/kubepods/besteffort/pod${uid[$name]}/trainer
    mkdir -p "${cgroup[$name]}"
done

wait_for_line() { # FILE PATTERN SECONDS
    local end=$((SECONDS + $3))
    until grep -q "$2" "$1" 2>/dev/null; do
        [ "$SECONDS" -lt "$end" ] || return 1
        sleep 0.2
    done
}

"$PYTHON" hack/gpu-check-helper.py pods "$work/kubeconfig" "$NODE" "$gpu" "$tenant_mib" \
    "a=${uid[a]}" "b=${uid[b]}" >"$logs/api.log" 2>&1 &
children+=("$!")
wait_for_line "$logs/api.log" "fake API server on" 30 || fail "the fake API server did not start: $(tail -n 5 "$logs/api.log")"

start_agent() { # LOG
    "$PYTHON" -m baton agent --backend cuda --socket "$work/agent.sock" --state-dir "$work/state" \
        --node-name "$NODE" --kubeconfig "$work/kubeconfig" --http-host 127.0.0.1 \
        --http-port "$PORT" --headroom "$headroom_mib" --host-memory-budget "$budget_mib" \
        --max-hold 120 --driver-call-timeout 20 >"$1" 2>&1 &
    agent_pid=$!
    wait_for_line "$1" "agent ready" 60 || fail "the agent did not start: $(tail -n 20 "$1")"
}
start_agent "$logs/agent1.log"

tenant() { # NAME PEER: runs in its pod's cgroup (the subshell moves itself there, then execs)
    (
        echo "$BASHPID" >"${cgroup[$1]}/cgroup.procs"
        exec env BATON_AGENT_SOCKET="$work/agent.sock" CUDA_VISIBLE_DEVICES="$gpu" \
            "$PYTHON" hack/gpu-check-tenant.py --name "$1" --peer "$2" --gpu "$gpu" \
            --gib "$GIB" --turns "$TURNS" --hold "$HOLD" --workdir "$work" "${env_dry[@]}"
    ) >"$logs/tenant-$1.json" 2>"$logs/tenant-$1.err"
}
tenant a b &
a=$!
tenant b a &
b=$!
children+=("$a" "$b")

parked=$("$PYTHON" hack/gpu-check-helper.py wait-parked "http://127.0.0.1:$PORT" 100) ||
    fail "no tenant was parked; agent log: $(tail -n 30 "$logs/agent1.log")"
echo "gpu-check: $parked is parked; killing the agent and starting it again"
kill -KILL "$agent_pid"
wait "$agent_pid" 2>/dev/null || true
start_agent "$logs/agent2.log"

status=0
wait "$a" || status=1
wait "$b" || status=1
[ "$status" -eq 0 ] || fail "a tenant failed: $(tail -n 5 "$logs/tenant-a.err" "$logs/tenant-b.err")"
"$PYTHON" hack/gpu-check-helper.py evidence "$parked" "$logs/tenant-a.json" "$logs/tenant-b.json" \
    "$logs/agent1.log" "$logs/agent2.log" | tee "$logs/evidence.json" ||
    fail "the turns did not park and restore as they had to"
if [ "$DRY" -eq 1 ]; then
    echo '{"h2d_gbps": null, "d2h_gbps": null, "dry_run": true}' >"$work/copy.json"
else
    timeout --foreground 60 "$PYTHON" hack/gpu-check-helper.py copy-rate "$GIB" >"$work/copy.json" ||
        fail "the pinned copy rate could not be measured"
fi
"$PYTHON" hack/gpu-check-helper.py figures "$work/copy.json" "$logs/agent1.log" "$logs/agent2.log" |
    tee "$logs/cuda.json"

if [ "$DRY" -eq 1 ]; then # what needs CUDA torch: only checked to compile here
    "$PYTHON" -m py_compile hack/train-exactness.py commands/bench/train.py agent/client/torch.py \
        commands/bench/handoff_tenant.py
    echo "gpu-check: dry run passed (steps 3 to 5 need a GPU and CUDA torch: compiled only)"
    exit 0
fi

echo "== 3. TorchParker (app backend): real training tenants alone against taking turns"
timeout --foreground 120 "$PYTHON" hack/train-exactness.py --device cuda |
    tee "$logs/train-exactness.json" || fail "train-exactness: see above"

echo "== 4. duty efficiency with real kernels; GPU phases sharing against alone"
timeout --foreground 120 "$PYTHON" -m baton bench train --device cuda --tenants 3 --steps 12 --json |
    tee "$logs/bench.json" || fail "bench train: see above"

echo "== 5. handoff on the cuda backend, nothing to move, against no backend and the bare relay"
for hold in 2 40; do # about 20 s and 70 s: three rows, each three tenants' turns
    timeout --foreground $((hold == 2 ? 60 : 120)) "$PYTHON" -m baton bench handoff \
        --backend cuda --tenants 3 --hold-ms "$hold" --iterations $((hold == 2 ? 600 : 150)) --json |
        tee "$logs/handoff-$hold.json" || fail "bench handoff --backend cuda --hold-ms $hold: see above"
done
echo "gpu-check: passed"
