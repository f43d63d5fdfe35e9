"""`baton dra`'s own flags: a value it cannot use is refused before anything starts."""

from __future__ import annotations

import pytest

from dra.cdi import kind_problem
from tests.test_cli_flags import _refusal

ENV = {"NODE_NAME": "n", "BATON_FAKE_GPUS": "1x1024"}


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("nvidia.com", "is not a CDI kind vendor/class"),
        ("nvidia.com/gpu=all", "class 'gpu=all' must start with a letter"),
        ("/gpu", "vendor '' must start with a letter"),
        ("nvidia.com/", "class '' must start with a letter"),
        ("nvidia com/gpu", "vendor 'nvidia com'"),
        ("nvidia.com/gpu.x", "class 'gpu.x'"),
    ],
)
def test_a_vendor_cdi_kind_the_runtime_would_refuse_is_refused_naming_the_flag(
    kind: str, problem: str
) -> None:
    """Accepted, its IDs would fail every claim's container at creation."""
    said = _refusal(["dra", "--vendor-cdi", kind], ENV)
    assert "--vendor-cdi (BATON_VENDOR_CDI)" in said and problem in said, said


@pytest.mark.parametrize("kind", ["nvidia.com/gpu", "k8s.gpu.nvidia.com/claim", "a/b", "x_y/z-1"])
def test_a_cdi_kind_is_vendor_slash_class(kind: str) -> None:
    assert kind_problem(kind) is None


@pytest.mark.parametrize(
    "flag",
    [
        "--plugins-dir (BATON_DRA_PLUGINS_DIR)",
        "--registry-dir (BATON_DRA_REGISTRY_DIR)",
        "--cdi-dir (BATON_CDI_DIR)",
        "--state-dir (BATON_DRA_STATE_DIR)",
    ],
)
def test_an_empty_directory_is_refused_naming_the_flag(flag: str) -> None:
    """'' was the current directory: the driver served its sockets, wrote its CDI specs and
    its record of prepared claims wherever it was started, the kubelet finding none of them."""
    said = _refusal(["dra", flag.split()[0], ""], ENV)
    assert f"Invalid value for {flag}: '' names no directory: pass its path" in said, said
