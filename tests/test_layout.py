"""The folder tree is the architecture: arrows point one way, no cycles, small files."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "agent",
    "baton",
    "extender",
    "deviceplugin",
    "dra",
    "nodegpu",
    "coordinator",
    "commands",
)
GENERATED = "baton._pb"
MAX_LINES = 400
TOOLS = ("commands",)
"""The roof: the commands, benches, demo, local node and status, above every daemon."""
DAEMONS = ("agent", "extender", "deviceplugin", "dra", "coordinator")
CORE_MAY_IMPORT = ("agent.core", "baton.contract.names")
CLIENT_MUST_NOT_IMPORT = ("agent.server", "agent.node", "agent.parking", "agent.core")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _our_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = _module_name(path)
            if not name.startswith(GENERATED):
                modules[name] = path
    return modules


MODULES = _our_modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(
    tree: ast.AST, type_checking: bool = False
) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import, at any depth (lazy ones too), except those only for type checkers unless
    `type_checking` asks for them too."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imports_of(module: str, type_checking: bool = False) -> set[str]:
    """The modules `module` imports, resolved to the most specific module name."""
    tree = ast.parse(MODULES[module].read_text())
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_nodes(tree, type_checking):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            candidate = f"{base}.{alias.name}"
            found.add(candidate if candidate in MODULES else base)
    return found


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _ours(name: str) -> bool:
    return _within(name, PACKAGES)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _within(m, ("agent.core",))))
def test_the_core_imports_only_the_core_names_and_the_standard_library(module: str) -> None:
    for name in imports_of(module):
        top = name.split(".")[0]
        allowed = _within(name, CORE_MAY_IMPORT) or (top in sys.stdlib_module_names)
        assert allowed, f"{module} imports {name}: the core may import only itself and names"


def test_the_core_check_catches_a_server_import(tmp_path: Path) -> None:
    """The rule above is no formality: a core module importing gRPC or a server fails it."""
    bad = "import grpc\nfrom agent.server import service\n"
    tree = ast.parse(bad)
    names = {a.name for n in _import_nodes(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in _import_nodes(tree) if isinstance(n, ast.ImportFrom)}
    rejected = {n for n in names if not _within(n, CORE_MAY_IMPORT)}
    assert rejected == {"grpc", "agent.server"}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _within(m, DAEMONS)))
def test_daemons_never_import_the_command_line_tools(module: str) -> None:
    for name in imports_of(module):
        assert not _within(name, TOOLS), f"{module} imports the tool {name}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _within(m, ("agent.client",))))
def test_the_client_carries_nothing_of_the_agent_daemon(module: str) -> None:
    for name in imports_of(module):
        assert not _within(name, CLIENT_MUST_NOT_IMPORT), f"{module} imports {name}"


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {m: sorted(n for n in imports_of(m) if n in MODULES and n != m) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles() -> None:
    assert _cycles() == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_files_stay_small(module: str) -> None:
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[module].relative_to(ROOT)} has {lines} lines"


PACKAGE_NAMES = sorted(m for m, p in MODULES.items() if p.name == "__init__.py")


@pytest.mark.parametrize("package", PACKAGE_NAMES)
def test_every_package_says_what_it_is(package: str) -> None:
    docstring = ast.get_docstring(ast.parse(MODULES[package].read_text()))
    assert docstring, f"{package} has no docstring"
    assert len(docstring.splitlines()[0]) > 20, f"{package}'s docstring says too little"


GROUND = "baton.contract"


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


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _within(m, (GROUND,))))
def test_the_ground_package_imports_nothing_else_of_baton(module: str) -> None:
    for name in imports_of(module):
        assert not _ours(name) or _within(name, (GROUND,)), f"{module} imports {name}"


def _annotation_literals(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """String constants that spell a `baton.dev/` key, wherever they stand."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            continue
        if node.value.startswith("baton.dev/"):
            yield node.lineno, node.value


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not _within(m, (GROUND,))))
def test_only_the_ground_package_spells_a_baton_dev_key(module: str) -> None:
    found = list(_annotation_literals(ast.parse(MODULES[module].read_text())))
    assert not found, f"{module} spells {found}: use baton.contract.names"


def test_the_key_check_catches_a_literal() -> None:
    tree = ast.parse('KEY = "baton.dev/gpus"\nx = pod["baton.dev/assigned-gpus"]\n')
    assert [v for _, v in _annotation_literals(tree)] == [
        "baton.dev/gpus",
        "baton.dev/assigned-gpus",
    ]


_NAMED_FILE = re.compile(r"`([\w./]+\.py)`")


def files_named_by(package: str) -> list[str]:
    """The `file.py` paths a package's docstring names (relative to its folder or the root)."""
    docstring = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
    return _NAMED_FILE.findall(docstring)


@pytest.mark.parametrize("package", PACKAGE_NAMES)
def test_every_file_a_package_docstring_names_exists(package: str) -> None:
    folder = MODULES[package].parent
    named = files_named_by(package)
    missing = [f for f in named if not (folder / f).is_file() and not (ROOT / f).is_file()]
    assert not missing, f"{package}'s docstring names files that do not exist: {missing}"


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


def test_the_daemon_image_holds_every_package() -> None:
    """The Dockerfile copies each package and `.dockerignore` lets it through (the local node's
    image builder reads both as Docker does)."""
    from commands.localnode.dockerfile import parse_dockerfile
    from commands.localnode.images import source_files

    files = source_files(parse_dockerfile((ROOT / "Dockerfile").read_text()), ROOT)
    copied = {str(f.relative_to(ROOT)) for f in files}
    missing = [p for p in PACKAGES if f"{p}/__init__.py" not in copied]
    assert not missing, f"the daemon image leaves out {missing}"
