"""The README and docs/: short, linked, and naming what CI and the daemons rely on."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import typer.main

import commands.cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted([README, *DOCS.glob("*.md")])
DAEMON_PAGES = {
    "agent": "agent.md",
    "extender": "extender.md",
    "deviceplugin": "deviceplugin.md",
    "dra": "dra.md",
    "coordinator": "coordinator.md",
}
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_is_an_introduction() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the reference belongs in docs/"


def test_readme_names_every_system_package_ci_installs() -> None:
    """`.ci/run` installs the packages the README lists; the two lists must not drift apart."""
    script = (ROOT / ".ci" / "run").read_text()
    listed = re.search(r"^packages=\(([^)]*)\)", script, re.M)
    assert listed, ".ci/run no longer lists its packages as packages=(...)"
    packages = listed.group(1).split() + re.findall(r"packages\+=\(([^)]*)\)", script)
    readme = README.read_text()
    missing = [p for p in packages if f"`{p}`" not in readme]
    assert not missing, f"README.md does not name {missing}, which .ci/run installs"


def test_readme_and_testing_name_the_extras_ci_tests_with() -> None:
    """`.ci/run` runs `make test EXTRAS=...`; the pages that say what CI runs must agree."""
    ran = re.search(r"\bmake\b.*\btest EXTRAS=(\S+)", (ROOT / ".ci" / "run").read_text())
    assert ran, ".ci/run no longer runs make test with EXTRAS=..."
    for page in (README, DOCS / "testing.md"):
        text = " ".join(page.read_text().split())
        assert f"make test EXTRAS={ran.group(1)}`" in text, f"{page.name} names other EXTRAS"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_point_at_files(page: Path) -> None:
    targets = [t for t in _LINK.findall(page.read_text()) if "://" not in t]
    missing = [t for t in targets if not (page.parent / t).exists()]
    assert not missing, f"{page.name} links to files that do not exist: {missing}"


_REPO_PATH = re.compile(r"`([\w.-]+/[\w./-]*)`")
MADE_AT_RUN_TIME = {"hack/gpu-check/wheels"}
"""Paths the pages name that a fresh checkout lacks (fetched or built before use)."""


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_named_repository_paths_exist(page: Path) -> None:
    """A path in backticks under one of the checkout's top folders (`agent/parking/methods.py`)
    names a file or folder that is there."""
    named = {m.rstrip("/") for m in _REPO_PATH.findall(page.read_text())}
    top = {n: n.split("/")[0] for n in named}  # `../shared/k8s` lies outside the checkout
    ours = {n for n in named if top[n] not in (".", "..") and (ROOT / top[n]).exists()}
    ours -= MADE_AT_RUN_TIME
    missing = sorted(n for n in ours if not (ROOT / n).exists())
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


def test_figures_carry_no_dates() -> None:
    """docs/figures.md gives the current figures, not the history of runs."""
    text = (DOCS / "figures.md").read_text()
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", text)


@pytest.mark.parametrize("command", sorted(DAEMON_PAGES))
def test_every_daemon_flag_is_documented(command: str) -> None:
    group = typer.main.get_command(commands.cli.app)
    assert isinstance(group, typer.main.TyperGroup)
    cmd = group.commands[command]
    page = (DOCS / DAEMON_PAGES[command]).read_text()
    flags = [o for p in cmd.params for o in p.opts if o.startswith("--") and o != "--help"]
    assert flags
    missing = [f for f in flags if f"`{f}`" not in page]
    assert not missing, f"docs/{DAEMON_PAGES[command]} does not document {missing}"


_NUMBER = re.compile(r"-?\d+(\.\d+)?")


def _as_documented(cell: str) -> str | None:
    """A default cell's value as it can be compared: a number or a literal in backticks (a
    trailing note in brackets dropped); None for words (`in-cluster`, `the host name`)."""
    cell = re.sub(r"\s*\(.*\)$", "", cell.strip())
    literal = re.fullmatch(r"`([^`]*)`", cell)
    if literal:
        return "" if literal.group(1) == "''" else literal.group(1)
    return cell if _NUMBER.fullmatch(cell) else None


def _same(documented: str, actual: object) -> bool:
    if _NUMBER.fullmatch(documented) and isinstance(actual, int | float):
        return float(documented) == float(actual)
    return documented == str(actual)


@pytest.mark.parametrize("command", sorted(DAEMON_PAGES))
def test_flag_tables_give_each_flag_its_env_twin_and_default(command: str) -> None:
    """A row `| --flag | ENV | default | what |` (or `| --flag | default | what |`) says what the
    command does: the flag's env twin, and its default where that is a number or a literal."""
    group = typer.main.get_command(commands.cli.app)
    assert isinstance(group, typer.main.TyperGroup)
    params = {o: p for p in group.commands[command].params for o in p.opts}
    wrong = []
    for row in (DOCS / DAEMON_PAGES[command]).read_text().splitlines():
        if not row.startswith("| `--"):
            continue
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        flags = [f for f in re.findall(r"`(--[a-z-]+)`", cells[0]) if f in params]
        envs, defaults = (cells[1], cells[2]) if len(cells) >= 4 else ("", cells[1])
        for flag in flags:
            env = params[flag].envvar
            if envs and f"`{env}`" not in envs:
                wrong.append(f"{flag}: env {envs}, but the command reads {env}")
        values = defaults.split(", ")
        for flag, value in zip(flags, values if len(values) == len(flags) else [], strict=False):
            documented, actual = _as_documented(value), params[flag].default
            if documented is not None and actual is not None and not _same(documented, actual):
                wrong.append(f"{flag}: default {value}, but the command's is {actual!r}")
    assert not wrong, f"docs/{DAEMON_PAGES[command]}: {wrong}"


_SET_IMAGE = re.compile(r"(?:cd \S+ && )?kustomize edit set image[^.;]*")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_set_the_image_where_it_reaches_every_daemon(page: Path) -> None:
    """An image set in `manifests/base` misses the DRA driver, which `overlays/dra` adds beside
    the base; set in the kustomization applied, it reaches every daemon
    (`tests/test_manifests_overlays.py`)."""
    text = " ".join(page.read_text().split())
    wrong = [m for m in _SET_IMAGE.findall(text) if "manifests/base" in m]
    assert not wrong, f"{page.name} sets the image in manifests/base: {wrong}"


_NAME = re.compile(r"(?<![\w.])baton\.dev/[\w.-]*\w")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_baton_dev_name_is_one_the_code_uses(page: Path) -> None:
    """A `baton.dev/...` resource, annotation or label a page names is one of
    `baton/contract/names.py`'s (the code spells them only there)."""
    from baton.contract import names

    known = {v for v in vars(names).values() if isinstance(v, str) and v.startswith("baton.dev/")}
    unknown = sorted(set(_NAME.findall(page.read_text())) - known)
    assert not unknown, f"{page.name} names {unknown}, which baton/contract/names.py lacks"


def _served_metrics() -> set[str]:
    """Every series name the daemons' registries serve (counters with and without `_total`)."""
    import time

    from agent.core.leases import LeaseTable
    from agent.parking.metrics import ParkingMetrics
    from agent.server.accounting import AccountingCollector
    from agent.server.metrics import AgentMetrics
    from coordinator.status import CoordinatorMetrics
    from extender.metrics import Metrics as ExtenderMetrics
    from nodegpu.metrics import Metrics as NodeMetrics

    agent = AgentMetrics()
    agent.watch(LeaseTable(clock=time.time), lambda: 0, time.time)
    agent.registry.register(AccountingCollector(agent.accounting, lambda: None))
    registries = [agent.registry, ParkingMetrics("fake").registry, ExtenderMetrics().registry]
    registries += [NodeMetrics().registry, CoordinatorMetrics().registry]
    served = set()
    for registry in registries:
        for family in registry.collect():
            served |= {family.name, f"{family.name}_total"} | {s.name for s in family.samples}
    return served


_METRIC = re.compile(r"`(baton_[a-z_]+)")


def test_every_metric_the_pages_name_is_served() -> None:
    served = _served_metrics()
    named = {(page.name, m) for page in PAGES for m in _METRIC.findall(page.read_text())}
    unknown = sorted((page, m) for page, m in named if m not in served)
    assert not unknown, f"metrics no daemon serves: {unknown}"


@pytest.mark.parametrize("command", sorted(DAEMON_PAGES))
def test_each_daemon_page_lists_the_metrics_it_serves(command: str) -> None:
    """deploy.md sends the operator to each component's page for its metrics."""
    assert _METRIC.findall((DOCS / DAEMON_PAGES[command]).read_text()), (
        f"docs/{DAEMON_PAGES[command]} lists none of the metrics `baton {command}` serves"
    )


_DOC_METRIC = re.compile(r"`(baton_\w+)(?:\{([\w,]*)\})?`")
_SHARED_LABELS = re.compile(r"`\{([\w,]+)\}`")
_SAMPLE = re.compile(r"^(baton_\w+)(?:\{([^}]*)\})? ", re.M)
_TYPE = re.compile(r"^# TYPE (baton_\w+) ", re.M)
_SUFFIXES = ("_bucket", "_count", "_sum")


def _documented_agent_metrics() -> dict[str, frozenset[str]]:
    """Each metric the table in docs/agent.md names, with the labels it gives it (a `{labels}`
    cell after several names gives them all those labels)."""
    documented: dict[str, frozenset[str]] = {}
    for row in (DOCS / "agent.md").read_text().splitlines():
        if not row.startswith("| `baton_"):
            continue
        cell = row.strip("|").split("|")[0]
        shared = _SHARED_LABELS.search(cell)
        for name, labels in _DOC_METRIC.findall(cell):
            given = labels if labels else (shared.group(1) if shared else "")
            documented[name] = frozenset(filter(None, given.split(",")))
    assert documented, "docs/agent.md has no metrics table"
    return documented


def _exported(text: str) -> dict[str, frozenset[str] | None]:
    """Each metric in a /metrics page (a histogram under its own name), with the labels of its
    series (None while it has none, e.g. a tenant's parked byte-seconds before any park)."""
    found: dict[str, frozenset[str] | None] = {
        name: None for name in _TYPE.findall(text) if not name.endswith("_created")
    }
    for name, labels in _SAMPLE.findall(text):
        for suffix in _SUFFIXES:
            name = name.removesuffix(suffix)
        if name in found:
            keys = {pair.split("=", 1)[0] for pair in labels.split(",") if pair} - {"le"}
            found[name] = frozenset(keys | (found[name] or set()))
    return found


def test_the_agents_metrics_table_gives_each_metric_its_labels_and_lists_them_all() -> None:
    """Every metric docs/agent.md's table lists is on a fake-GPU agent's /metrics with the
    labels the table gives it, and every metric there is in the table (that a page's metric
    exists at all: `test_every_metric_the_pages_name_is_served`)."""
    from agent.client import Baton
    from agent.parking.setup import ParkingOptions
    from baton.contract.names import fake_gpu_uuid
    from tests.harness.agent import AgentRunner, short_tmpdir

    workdir = short_tmpdir()
    parking = ParkingOptions(backend="fake", fake_gpus="1x100", fake_dir=f"{workdir}/gpus")
    try:
        with AgentRunner(workdir, parking=parking) as agent:
            with Baton(agent.socket, [fake_gpu_uuid(0)], name="trainer") as baton:
                baton.acquire(timeout=10)
                held = agent.http("/metrics")[1]  # the holder's series
                baton.yield_()
            ended = agent.http("/metrics")[1]  # the turn's accounting
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    exported = _exported(held)
    for name, labels in _exported(ended).items():
        exported[name] = labels if exported.get(name) is None else exported[name]
    documented = _documented_agent_metrics()
    wrong = [
        f"{name}: documented with labels {sorted(labels)}, exported with "
        f"{sorted(exported.get(name) or ()) if name in exported else 'none (not exported)'}"
        for name, labels in documented.items()
        if name not in exported or exported[name] not in (None, labels)
    ]
    wrong += [f"{name}: exported, not documented" for name in exported.keys() - documented.keys()]
    assert not wrong, f"docs/agent.md's metrics table: {wrong}"


_FLAG_SPAN = re.compile(r"`(--[a-z][a-z0-9-]*)\b[^`]*`")
TRAIN_TENANT = ROOT / "agent" / "examples" / "train" / "tenant.py"
FLAGS_OF = {"agent.md": ("agent",), "client.md": ("agent", TRAIN_TENANT)}
"""Whose flags a page names: `baton` commands, or a script's (its `add_argument`s)."""
OTHER_PROGRAMS_FLAGS = {"--build-arg"}
"""Flags of other programs a page names in a span of their own (`docker build`'s)."""


def _options_of(owner: str | Path) -> set[str]:
    if isinstance(owner, Path):  # read, not imported: the tenant imports torch
        return set(re.findall(r"add_argument\(\s*\"(--[a-z0-9-]+)\"", owner.read_text()))
    group = typer.main.get_command(commands.cli.app)
    assert isinstance(group, typer.main.TyperGroup)
    return {o for p in group.commands[owner].params for o in (*p.opts, *p.secondary_opts)}


@pytest.mark.parametrize("page", sorted(FLAGS_OF))
def test_every_flag_a_page_names_exists(page: str) -> None:
    """A span in backticks that starts with a flag (`--max-hold`, `--device cuda`) names a flag
    of the command the page is about (hidden ones, such as deprecated aliases, included)."""
    known = set().union(OTHER_PROGRAMS_FLAGS, *(_options_of(owner) for owner in FLAGS_OF[page]))
    named = set(_FLAG_SPAN.findall((DOCS / page).read_text()))
    assert named
    missing = sorted(named - known)
    assert not missing, f"docs/{page} names flags that do not exist: {missing}"


_CODE = re.compile(r"```[a-z]*\n(.*?)```|`([^`\n]+(?:\n[^`\n]+)?)`", re.S)
_COMMAND_LINE = re.compile(
    r"(?<![\w/.-])(?<!kubectl )baton ([a-z][a-z-]*)(?![\w/-])((?: [a-z][a-z-]*(?![\w/-]))?)"
    r"([^\n|;&#)]*)"
)
_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def _unknown_in_command_lines(text: str) -> list[str]:
    """Each `baton COMMAND [SUBCOMMAND] --option ...` in code (a span or a block, lines joined
    where they end in `\\`) whose command, subcommand or option the CLI lacks."""
    group = typer.main.get_command(commands.cli.app)
    assert isinstance(group, typer.main.TyperGroup)
    wrong = []
    for block, span in _CODE.findall(text.replace("\\\n", " ")):
        for name, sub, rest in _COMMAND_LINE.findall(block or span.replace("\n", " ")):
            line = f"baton {name}{sub}{rest}".strip()
            cmd = group.commands.get(name)
            if cmd is None:
                wrong.append(f"{line!r}: no command {name!r}")
                continue
            if isinstance(cmd, typer.main.TyperGroup):
                sub, rest = sub.strip(), "" if not sub.strip() else rest
                if not sub:
                    continue  # `baton bench NAME --json`: no one command
                if sub not in cmd.commands:
                    wrong.append(f"{line!r}: no command 'baton {name} {sub}'")
                    continue
                cmd = cmd.commands[sub]
            else:
                rest = sub + rest
            options = {"--help"} | {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
            wrong += [f"{line!r}: no {o}" for o in _OPTION.findall(rest) if o not in options]
    return wrong


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_baton_command_line_a_page_shows_runs(page: Path) -> None:
    """A command line a page shows (`baton status --by namespace`, `baton bench train
    --framework trl --mix short`) names a command, subcommand and options the CLI has."""
    wrong = _unknown_in_command_lines(page.read_text())
    assert not wrong, f"{page.name} shows command lines the CLI refuses: {wrong}"


def test_the_command_line_check_catches_a_wrong_name() -> None:
    text = (
        "`baton status --by namespace`, `baton status --window 5`, `baton bench trian --json`,\n"
        "```\nbaton agent --backend fake \\\n    --fake-gpu 1x100\nhelm install baton charts/x\n```"
    )
    assert _unknown_in_command_lines(text) == [
        "'baton status --window 5': no --window",
        "'baton bench trian --json': no command 'baton bench trian'",
        "'baton agent --backend fake      --fake-gpu 1x100': no --fake-gpu",
    ]
