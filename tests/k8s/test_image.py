"""The locally built image follows the Dockerfile, and the local overlay follows the base."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import yaml

from commands.localnode import images
from commands.localnode.binaries import CHECKOUT, ENV_CACHE_DIR
from commands.localnode.dockerfile import parse_dockerfile
from commands.localnode.procs import LocalNodeError
from tests.k8s.cluster import Cluster

DOCKERFILE = parse_dockerfile((CHECKOUT / "Dockerfile").read_text())
TENANT = parse_dockerfile((CHECKOUT / images.TENANT_DOCKERFILE).read_text())
DAEMONS_ONLY = ("baton_gpu", "kubernetes", "uvloop", "httptools", "PIL", "typer", "rich")


def test_dockerfile_is_read_as_docker_builds_it() -> None:
    assert DOCKERFILE.venv == "/opt/baton"
    assert DOCKERFILE.env["PATH"].startswith("/opt/baton/bin:")
    assert DOCKERFILE.user == "65532:65532"
    assert (DOCKERFILE.entrypoint, DOCKERFILE.cmd) == (["baton"], ["--help"])
    files = {str(p.relative_to(CHECKOUT)) for p in images.source_files(DOCKERFILE)}
    for package in ("baton", "agent", "deviceplugin", "dra", "nodegpu", "extender", "commands"):
        assert f"{package}/__init__.py" in files
    assert {"pyproject.toml", "README.md"} <= files
    assert not [f for f in files if "__pycache__" in f or f.startswith("commands/localnode/")]


def test_built_image_has_the_dockerfiles_config(cluster: Cluster) -> None:
    archive = images.archive_path("baton", images.DAEMONS_DOCKERFILE)
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        config = json.load(tar.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
    assert manifest[0]["RepoTags"] == [images.BATON_IMAGE]
    assert config["config"] == DOCKERFILE.image_config()


def test_tenant_dockerfile_is_read_as_docker_builds_it() -> None:
    assert (TENANT.venv, TENANT.project_dir) == ("/opt/baton", "clients/python")
    assert TENANT.into_packages == [("agent/examples", "agent")]
    assert TENANT.entrypoint == [] and TENANT.cmd[:3] == [
        "python",
        "-m",
        "agent.examples.grpo_loop",
    ]
    files = images.source_files(TENANT, dockerfile=images.TENANT_DOCKERFILE)
    names = {str(p.relative_to(CHECKOUT)) for p in files}
    assert {"clients/python/pyproject.toml", "agent/examples/grpo_loop.py"} <= names
    assert not [f for f in names if f.startswith(("deviceplugin/", "extender/", "dra/"))]


@pytest.mark.parametrize(
    "step",
    [
        "cp -a agent/examples /opt/baton/lib/",  # a copy it would not make
        '/opt/baton/bin/pip install --no-cache-dir ".[cuda]"',  # extras it would leave out
        '/opt/baton/bin/pip install --no-cache-dir "./clients/python"',  # a second project
        "apt-get install -y curl",
    ],
)
def test_a_run_step_the_local_build_would_not_follow_is_refused(step: str) -> None:
    text = (CHECKOUT / images.TENANT_DOCKERFILE).read_text()
    changed = text.replace("-m venv /opt/baton \\\n", f"-m venv /opt/baton \\\n    && {step} \\\n")
    assert changed != text
    with pytest.raises(LocalNodeError, match="cannot follow this RUN step"):
        parse_dockerfile(changed)


def test_an_image_rebuilt_drops_its_old_archive_and_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_CACHE_DIR, str(tmp_path))
    images.images_dir().mkdir(parents=True)
    old, tenant = (images.images_dir() / f"{n}-{'0' * 16}.tar" for n in ("baton", "baton-tenant"))
    old.touch()
    tenant.touch()
    images._drop_stale("baton")
    assert not old.exists() and tenant.exists()


def test_built_tenant_image_holds_the_slim_client_and_none_of_the_daemons(
    cluster: Cluster,
) -> None:
    archive = images.archive_path("baton-tenant", images.TENANT_DOCKERFILE)
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        config = json.load(tar.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
        (layer,) = manifest[0]["Layers"]
        with tarfile.open(fileobj=tar.extractfile(layer)) as rootfs:
            paths = rootfs.getnames()
    assert manifest[0]["RepoTags"] == [images.TENANT_IMAGE]
    assert config["config"] == TENANT.image_config()
    site = "./opt/baton/lib/python3.11/site-packages/"
    installed = {p[len(site) :].split("/")[0] for p in paths if p.startswith(site)}
    assert "baton_client-0.1.0.dist-info" in installed
    assert {"grpc", "google", "agent", "baton"} <= installed
    assert not [d for d in installed if d.startswith(DAEMONS_ONLY)], sorted(installed)
    assert f"{site}agent/examples/grpo_loop.py" in paths
    assert f"{site}agent/client/__init__.py" in paths
    assert f"{site}agent/parking/__init__.py" not in paths  # the agent's side stays out


def test_local_scheduler_profile_is_the_base_one_on_loopback() -> None:
    base = yaml.safe_load((CHECKOUT / "manifests/scheduler/scheduler-config.yaml").read_text())
    local = yaml.safe_load(
        (CHECKOUT / "manifests/overlays/local/scheduler/config.yaml").read_text()
    )
    assert local["extenders"][0].pop("urlPrefix") == "http://127.0.0.1:9462"
    base["extenders"][0].pop("urlPrefix")
    assert local == base
