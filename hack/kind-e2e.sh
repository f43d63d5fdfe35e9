#!/usr/bin/env bash
# End to end on kind: bring Baton and the example tenants up with hack/kind-up.sh, then check
# what they did: scheduled by baton-scheduler, GPUs assigned by the extender and allocated by the
# device plugin, GPUs shared, every turn fenced by its own token, and the agents' status agreeing.
# Needs docker, kind and kubectl. CI does not run this (no container engine there).
#
#   hack/kind-e2e.sh                       # runs kind-up first
#   BATON_KIND_SKIP_UP=1 hack/kind-e2e.sh  # check a cluster kind-up already ran
set -euo pipefail
cd "$(dirname "$0")/.."

demo_namespace="baton-demo"
namespace="baton-system"
tenants=3
turns_per_tenant=40

fail() { echo "kind-e2e: FAIL: $*" >&2; exit 1; }
pass() { echo "kind-e2e: ok: $*"; }

if [ -z "${BATON_KIND_SKIP_UP-}" ]; then
    hack/kind-up.sh
fi

kubectl -n "$demo_namespace" wait --for=condition=complete job/grpo-tenant --timeout=300s \
    >/dev/null || fail "the example Job did not complete"
succeeded="$(kubectl -n "$demo_namespace" get job grpo-tenant -o jsonpath='{.status.succeeded}')"
[ "$succeeded" = "$tenants" ] || fail "$succeeded of $tenants tenants succeeded"
pass "$tenants tenants completed"

pods="$(kubectl -n "$demo_namespace" get pods -l job-name=grpo-tenant -o jsonpath='{range .items[*]}{.metadata.name}{"\t"}{.spec.schedulerName}{"\t"}{.metadata.annotations.baton\.dev/assigned-gpus}{"\t"}{.metadata.annotations.baton\.dev/allocated-at}{"\n"}{end}')"
while IFS=$'\t' read -r pod scheduler gpus allocated; do
    [ "$scheduler" = "baton-scheduler" ] || fail "$pod was scheduled by '$scheduler'"
    [ -n "$gpus" ] || fail "$pod has no baton.dev/assigned-gpus annotation"
    [ -n "$allocated" ] || fail "$pod has no baton.dev/allocated-at annotation"
done <<<"$pods"
pass "every tenant was placed by the extender and allocated by the device plugin"

distinct_gpus="$(cut -f3 <<<"$pods" | tr ',' '\n' | sort -u | wc -l)"
[ "$distinct_gpus" -lt "$tenants" ] || fail "no two tenants shared a GPU ($distinct_gpus GPUs)"
pass "$tenants tenants shared $distinct_gpus GPU(s)"

logs="$(kubectl -n "$demo_namespace" logs -l job-name=grpo-tenant --prefix --tail=-1)"
done_count="$(grep -c "done: $turns_per_tenant turns" <<<"$logs" || true)"
[ "$done_count" = "$tenants" ] || fail "$done_count of $tenants tenants reported $turns_per_tenant turns"
fenced="$(grep -o 'on [^ ]* (token [0-9,]*)' <<<"$logs" || true)"
turns="$(wc -l <<<"$fenced")"
[ "$turns" -eq $((tenants * turns_per_tenant)) ] || fail "saw $turns turns in the logs"
duplicates="$(sort <<<"$fenced" | uniq -d)"
[ -z "$duplicates" ] || fail "two turns shared a fencing token: $duplicates"
pass "$turns turns, each with its own fencing token"

for gpu in $(cut -f3 <<<"$pods" | tr ',' '\n' | sort -u); do
    found=""
    for pod in $(kubectl -n "$namespace" get pods -l app.kubernetes.io/name=baton-agent -o name); do
        if kubectl -n "$namespace" exec "$pod" -c agent -- baton status --json | grep -q "$gpu"; then
            found="$pod"
        fi
    done
    [ -n "$found" ] || fail "no agent reports GPU $gpu"
done
pass "the agents' status names every assigned GPU"
echo "kind-e2e: all checks passed"
