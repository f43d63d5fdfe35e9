"""RBAC: every verb has a comment saying why, and the roles grant what the code calls, no more."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "manifests" / "base"
DRA = ROOT / "manifests" / "overlays" / "dra" / "driver"
RBAC_FILES = sorted([*BASE.glob("rbac-*.yaml"), *DRA.glob("rbac-*.yaml")])

# Kubernetes client calls our daemons make, and the (resource, verbs) each needs. A list may
# be followed by a watch, so list calls justify both.
CALLS: dict[str, tuple[str, frozenset[str]]] = {
    "read_node": ("nodes", frozenset({"get"})),
    "list_node": ("nodes", frozenset({"list", "watch"})),
    "patch_node": ("nodes", frozenset({"patch"})),
    "read_namespaced_pod": ("pods", frozenset({"get"})),
    "list_namespaced_pod": ("pods", frozenset({"list", "watch"})),
    "list_pod_for_all_namespaces": ("pods", frozenset({"list", "watch"})),
    "patch_namespaced_pod": ("pods", frozenset({"patch"})),
    "delete_namespaced_pod": ("pods", frozenset({"delete"})),
    "create_namespaced_pod_binding": ("pods/binding", frozenset({"create"})),
    "create_namespaced_binding": ("bindings", frozenset({"create"})),
    "create_namespaced_event": ("events", frozenset({"create"})),
    "patch_namespaced_event": ("events", frozenset({"patch"})),
    "read_namespaced_lease": ("leases", frozenset({"get"})),
    "create_namespaced_lease": ("leases", frozenset({"create"})),
    "replace_namespaced_lease": ("leases", frozenset({"update"})),
    # `baton.contract.draapi.DraApi`, the DRA driver's and the agent's one DRA client.
    "read_claim": ("resourceclaims", frozenset({"get"})),
    "list_slices": ("resourceslices", frozenset({"list"})),
    "create_slice": ("resourceslices", frozenset({"create"})),
    "replace_slice": ("resourceslices", frozenset({"update"})),
    "delete_slice": ("resourceslices", frozenset({"delete"})),
}
# API paths our daemons call without the client (a raw POST), and the (resource, verbs) each
# needs: the extender posts its Bindings itself (extender/apipost.py).
RAW_CALLS: dict[str, tuple[str, frozenset[str]]] = {
    r'"/api/v1/namespaces/\{[^}]+\}/pods/\{[^}]+\}/binding"': (
        "pods/binding",
        frozenset({"create"}),
    ),
    # `DraApi.node()`: the DRA driver reads its own Node (its UID, its container runtime).
    r"\bapi\.node\(\)": ("nodes", frozenset({"get"})),
}
# The contract's reflector lists and watches for the daemons: a file that builds a `KubeSource`
# lists and watches the kinds it names (baton/contract/reflector.py).
WATCHED_KINDS = {"nodes", "pods", "resourceclaims"}
# Which code runs under which ServiceAccount's roles (its ClusterRole, and the Role of the same
# name in its namespace where it has one).
ROLES = {
    "baton-agent": ("agent",),
    "baton-deviceplugin": ("deviceplugin", "nodegpu"),
    "baton-extender": ("extender",),
    "baton-coordinator": ("coordinator",),
    "baton-dra": ("dra", "nodegpu"),
}
# The DRA overlay's roles for the same code (`--dra`, the agent's DRA view), checked with the
# base role's.
DRA_ROLES = {"baton-extender": "baton-extender-dra", "baton-agent": "baton-agent-dra"}
# Commands a user runs with their own kubeconfig, never under a daemon's ServiceAccount.
USER_SIDE = {"commands/status/cluster.py"}


def _rbac_rules(path: Path) -> list[tuple[str, list[str]]]:
    """(preceding comment, verbs) for every rule, read from the text so comments survive."""
    rules, comment = [], ""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("#"):
            comment += " " + stripped
        elif stripped.startswith("- apiGroups:"):
            block = "\n".join(lines[i : i + 5])
            verbs = re.search(r"verbs: \[([^\]]*)\]", block)
            assert verbs, f"{path}: a rule without a one-line verbs list"
            rules.append((comment, [v.strip(' "') for v in verbs.group(1).split(",")]))
            comment = ""
        elif not stripped.startswith(("resources:", "resourceNames:", "verbs:")):
            comment = ""
    return rules


@pytest.mark.parametrize("path", RBAC_FILES, ids=lambda p: p.name)
def test_every_rbac_verb_says_why(path: Path) -> None:
    for comment, verbs in _rbac_rules(path):
        for verb in verbs:
            assert re.search(rf"\b{verb}\b", comment), f"{path}: no comment explains {verb!r}"
        assert "*" not in verbs


def granted(role: str, paths: list[Path] | None = None) -> set[tuple[str, str]]:
    """What the ClusterRole `role` and the Role of that name (if any) grant together."""
    grants: set[tuple[str, str]] = set()
    kinds = []
    for path in paths or RBAC_FILES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] in ("ClusterRole", "Role") and doc["metadata"]["name"] == role:
                kinds.append(doc["kind"])
                grants |= {
                    (resource, verb)
                    for rule in doc["rules"]
                    for resource in rule["resources"]
                    for verb in rule["verbs"]
                }
    if "ClusterRole" not in kinds:
        raise AssertionError(f"no ClusterRole {role}")
    return grants


def granted_with_dra(role: str) -> set[tuple[str, str]]:
    """The base role's grants and, where the DRA overlay adds one for its code, that role's."""
    extra = DRA_ROLES.get(role)
    return granted(role) | (granted(extra) if extra else set())


def calls_in(packages: tuple[str, ...]) -> dict[str, tuple[str, frozenset[str]]]:
    used = {}
    for package in packages:
        for source in sorted((ROOT / package).rglob("*.py")):
            if str(source.relative_to(ROOT)) in USER_SIDE:
                continue
            text = source.read_text()
            for name in re.findall(r"\.(\w+)\b", text):
                if name in CALLS:
                    used[name] = CALLS[name]
            for pattern, needs in RAW_CALLS.items():
                if re.search(pattern, text):
                    used[pattern] = needs
            if "KubeSource(" in text:
                for kind in WATCHED_KINDS & set(re.findall(r'"(\w+)"', text)):
                    used[f"KubeSource {kind}"] = (kind, frozenset({"list", "watch"}))
    return used


def test_the_coordinator_holds_only_its_own_lease_and_labels_pods_of_its_namespace() -> None:
    """Lease writes and pod patches come from the namespaced Role (get and update named to the
    Lease), never from the ClusterRole; the ClusterRole only reads."""
    from baton.contract import names

    (role,) = [
        doc
        for doc in yaml.safe_load_all((BASE / "rbac-coordinator.yaml").read_text())
        if doc["kind"] == "Role"
    ]
    assert role["metadata"]["namespace"] == names.NAMESPACE
    named = [rule for rule in role["rules"] if rule.get("resourceNames")]
    assert [(r["resources"], r["resourceNames"], r["verbs"]) for r in named] == [
        (["leases"], [names.COORDINATOR_LEASE], ["get", "update"])
    ]
    cluster = {
        verb
        for doc in yaml.safe_load_all((BASE / "rbac-coordinator.yaml").read_text())
        if doc["kind"] == "ClusterRole"
        for rule in doc["rules"]
        for verb in rule["verbs"]
    }
    assert cluster == {"list", "watch"}


def test_a_reflector_source_counts_as_a_list_and_watch() -> None:
    """The reflector's calls are found from the kinds a daemon hands it, so a role without the
    list the daemon's reflector makes fails the test above."""
    assert calls_in(("agent",))["KubeSource pods"] == ("pods", frozenset({"list", "watch"}))
    assert {"KubeSource nodes", "KubeSource pods"} <= set(calls_in(("extender",)))
    assert calls_in(("extender",))["KubeSource resourceclaims"] == (
        "resourceclaims",
        frozenset({"list", "watch"}),
    )


def test_the_extender_watches_claims_only_with_the_dra_role() -> None:
    """The base role (device-plugin clusters, no --dra) grants no claims; the DRA overlay's does."""
    assert not {r for r, _ in granted("baton-extender")} & {"resourceclaims"}
    assert {("resourceclaims", "list"), ("resourceclaims", "watch")} <= granted(
        "baton-extender-dra"
    )


@pytest.mark.parametrize("role", sorted(ROLES))
def test_roles_grant_exactly_what_the_code_calls(role: str) -> None:
    grants = granted_with_dra(role)
    used = calls_in(ROLES[role])
    assert used, f"no Kubernetes calls found for {role}"
    for call, (resource, verbs) in used.items():
        needed = {(resource, "list")} if "list" in verbs else {(resource, v) for v in verbs}
        assert needed <= grants, f"{role} lacks {needed - grants} for {call}"
    justified = {(resource, verb) for resource, verbs in used.values() for verb in verbs}
    assert grants <= justified, f"{role} grants {grants - justified}, which no code calls"


def test_the_dra_clients_calls_count_for_the_code_that_makes_them() -> None:
    """The DRA driver's and the agent's calls through `DraApi` are found, so a DRA role without
    a verb they use fails the test above."""
    used = calls_in(("dra", "nodegpu"))
    for call in ("read_claim", "list_slices", "create_slice", "replace_slice", "delete_slice"):
        assert call in used, call
    assert used[r"\bapi\.node\(\)"] == ("nodes", frozenset({"get"}))
    assert {"read_claim", "list_slices"} <= set(calls_in(("agent",)))
