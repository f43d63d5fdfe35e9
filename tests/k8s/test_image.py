"""The locally built image follows the Dockerfile, and the local overlay follows the base."""

from __future__ import annotations

import json
import tarfile

import yaml

from baton.localnode import images
from baton.localnode.binaries import CHECKOUT
from baton.localnode.dockerfile import parse_dockerfile
from tests.k8s.cluster import Cluster

DOCKERFILE = parse_dockerfile((CHECKOUT / "Dockerfile").read_text())


def test_dockerfile_is_read_as_docker_builds_it() -> None:
    assert DOCKERFILE.venv == "/opt/baton"
    assert DOCKERFILE.env["PATH"].startswith("/opt/baton/bin:")
    assert DOCKERFILE.user == "65532:65532"
    assert (DOCKERFILE.entrypoint, DOCKERFILE.cmd) == (["baton"], ["--help"])
    files = {str(p.relative_to(CHECKOUT)) for p in images.source_files(DOCKERFILE)}
    for package in ("baton", "agent", "deviceplugin", "extender"):
        assert f"{package}/__init__.py" in files
    assert {"pyproject.toml", "README.md"} <= files
    assert not [f for f in files if "__pycache__" in f or f.startswith("baton/localnode/")]


def test_built_image_has_the_dockerfiles_config(cluster: Cluster) -> None:
    archive = images.images_dir() / f"baton-{images.baton_key(DOCKERFILE)[:16]}.tar"
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        config = json.load(tar.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
    assert manifest[0]["RepoTags"] == [images.BATON_IMAGE]
    assert config["config"] == DOCKERFILE.image_config()


def test_local_scheduler_profile_is_the_base_one_on_loopback() -> None:
    base = yaml.safe_load((CHECKOUT / "manifests/scheduler/scheduler-config.yaml").read_text())
    local = yaml.safe_load(
        (CHECKOUT / "manifests/overlays/local/scheduler/config.yaml").read_text()
    )
    assert local["extenders"][0].pop("urlPrefix") == "http://127.0.0.1:9462"
    base["extenders"][0].pop("urlPrefix")
    assert local == base
