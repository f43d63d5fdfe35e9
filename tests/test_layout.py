"""The folder tree is the architecture: module by module, arrows point one way, no cycles, small
files (the package graph and its layers: `test_layout_graph.py`)."""

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
SIZED = {**MODULES, **{_module_name(p): p for p in sorted((ROOT / "tests").rglob("*.py"))}}
"""Every module held to MAX_LINES: the packages' and the tests' (which the import rules skip)."""


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


@pytest.mark.parametrize("module", sorted(SIZED))
def test_files_stay_small(module: str) -> None:
    lines = len(SIZED[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{SIZED[module].relative_to(ROOT)} has {lines} lines"


PACKAGE_NAMES = sorted(m for m, p in MODULES.items() if p.name == "__init__.py")


@pytest.mark.parametrize("package", PACKAGE_NAMES)
def test_every_package_says_what_it_is(package: str) -> None:
    docstring = ast.get_docstring(ast.parse(MODULES[package].read_text()))
    assert docstring, f"{package} has no docstring"
    assert len(docstring.splitlines()[0]) > 20, f"{package}'s docstring says too little"


GROUND = "baton.contract"


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


def test_the_daemon_image_holds_every_package() -> None:
    """The Dockerfile copies each package and `.dockerignore` lets it through (the local node's
    image builder reads both as Docker does)."""
    from commands.localnode.dockerfile import parse_dockerfile
    from commands.localnode.images import source_files

    files = source_files(parse_dockerfile((ROOT / "Dockerfile").read_text()), ROOT)
    copied = {str(f.relative_to(ROOT)) for f in files}
    missing = [p for p in PACKAGES if f"{p}/__init__.py" not in copied]
    assert not missing, f"the daemon image leaves out {missing}"
