"""The package graph: packages import each other one way, without cycles, in the layers
docs/architecture.md draws (the module-level rules are in `test_layout.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_layout import (
    DAEMONS,
    GROUND,
    MODULES,
    ROOT,
    TOOLS,
    _ours,
    _within,
    imports_of,
)


def _package_of(module: str) -> str:
    """The package a module belongs to: itself for a package's `__init__`, else its parent."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def package_graph() -> dict[str, set[str]]:
    """Package → the other packages its modules import, type annotations' imports included.

    A package's own sub-packages are separate nodes: `agent.server` importing `agent.core` is an
    arrow between two packages, and so is `baton` importing `commands.cli`.
    """
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        source = _package_of(module)
        targets = graph.setdefault(source, set())
        for name in imports_of(module, type_checking=True):
            if name in MODULES and _package_of(name) != source:
                targets.add(_package_of(name))
    return graph


def package_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of packages that import each other, directly or through others."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            node = todo.pop()
            if node not in seen:
                seen.add(node)
                todo.extend(graph.get(node, ()))
        reach[start] = seen
    cycles = {tuple(sorted({a} | {b for b in reach[a] if a in reach.get(b, ())})) for a in graph}
    return sorted(list(c) for c in cycles if len(c) > 1)


def test_no_import_cycles_between_packages() -> None:
    assert package_cycles(package_graph()) == []


def test_the_package_cycle_check_sees_a_cycle_through_a_third_package() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert package_cycles(graph) == [["a", "b", "c"]]


NODE_LAYER = "nodegpu"
"""Below the kubelet-facing daemons (`deviceplugin`, `dra`): the node's GPUs, health, metrics."""


POLICY_CORE = "agent.core"
"""The turn policy (pure: no I/O): the coordinator arbitrates jobs with the agent's own."""


def daemon_to_daemon_imports() -> list[tuple[str, str]]:
    """(module, what it imports) for every import of one daemon package's module by another's."""
    found = []
    for module in sorted(m for m in MODULES if _within(m, DAEMONS)):
        own = module.split(".")[0]
        for name in sorted(imports_of(module, type_checking=True)):
            other = name.split(".")[0]
            shared = own == "coordinator" and _within(name, (POLICY_CORE,))
            if other in DAEMONS and other != own and not shared:
                found.append((module, name))
    return found


def test_no_daemon_package_imports_another() -> None:
    assert daemon_to_daemon_imports() == []


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _within(m, (NODE_LAYER,))))
def test_the_node_layer_imports_no_daemon_and_no_tool(module: str) -> None:
    for name in imports_of(module, type_checking=True):
        assert not _within(name, DAEMONS + TOOLS), f"{module} imports {name}"
        assert not _ours(name) or _within(name, (NODE_LAYER, GROUND)), f"{module} imports {name}"


def test_the_daemon_check_sees_one_daemon_importing_another(tmp_path: Path) -> None:
    """The rule above is no formality: `dra` importing `deviceplugin` is counted."""
    MODULES["dra._layout_probe"] = tmp_path / "probe.py"
    (tmp_path / "probe.py").write_text("from deviceplugin.devices import PodView\n")
    try:
        assert daemon_to_daemon_imports() == [("dra._layout_probe", "deviceplugin.devices")]
    finally:
        del MODULES["dra._layout_probe"]


ARCHITECTURE = ROOT / "docs" / "architecture.md"
GRAPH_START, GRAPH_END = "<!-- package graph: start -->", "<!-- package graph: end -->"


def _unit(package: str) -> str:
    """The part a package belongs to in the drawn graph: a top-level package, or `baton.<x>` and
    `commands.<x>` (the ground's and the roof's parts)."""
    parts = package.split(".")
    split = parts[0] in ("baton", *TOOLS) and len(parts) > 1
    return ".".join(parts[:2]) if split else parts[0]


def drawn_graph() -> str:
    """The package graph as docs/architecture.md draws it: each part and what it imports."""
    arrows: dict[str, set[str]] = {}
    for source, targets in package_graph().items():
        mine = arrows.setdefault(_unit(source), set())
        mine.update(_unit(t) for t in targets if _unit(t) != _unit(source))
    lines = [
        f"{part} -> {', '.join(sorted(arrows[part])) or '(nothing)'}" for part in sorted(arrows)
    ]
    return "\n".join(["```text", *lines, "```"])


def test_the_architecture_page_draws_the_package_graph_of_the_code() -> None:
    text = ARCHITECTURE.read_text()
    drawn = text.split(GRAPH_START, 1)[1].split(GRAPH_END, 1)[0].strip()
    assert drawn == drawn_graph(), (
        f"docs/architecture.md's graph is stale; it is now:\n{drawn_graph()}"
    )


LAYERS = ((GROUND, "baton._pb"), (NODE_LAYER,), DAEMONS, TOOLS)
"""From the ground up. `baton` itself (the package's root) is the entry point."""
ENTRY_POINT = "baton"


def _layer(part: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if _within(part, layer))


def upward_arrows() -> list[tuple[str, str]]:
    """(part, what it imports) for every arrow of the drawn graph from a lower layer to a higher."""
    found = set()
    for source, targets in package_graph().items():
        for target in targets:
            if source == ENTRY_POINT or _layer(_unit(target)) > _layer(_unit(source)):
                found.add((_unit(source), _unit(target)))
    return sorted(found)


def test_the_only_arrow_up_is_the_entry_point() -> None:
    """The ground imports nothing above it, the node layer no daemon, the daemons no command;
    `python -m baton` entering the commands is the one arrow that points up."""
    assert upward_arrows() == [(ENTRY_POINT, "commands.cli")]


def test_the_arrow_check_sees_the_ground_reaching_up(tmp_path: Path) -> None:
    """The rule above is no formality: the contract importing the agent is counted."""
    MODULES["baton.contract._layout_probe"] = tmp_path / "probe.py"
    (tmp_path / "probe.py").write_text("from agent.core.leases import Lease\n")
    try:
        assert ("baton.contract", "agent") in upward_arrows()
    finally:
        del MODULES["baton.contract._layout_probe"]
