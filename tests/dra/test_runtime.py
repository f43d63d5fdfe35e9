"""Whether a node's runtime applies CDI: refused where a tenant would start without its env."""

from __future__ import annotations

import pytest

from dra.runtime import cdi_refusal


@pytest.mark.parametrize(
    ("version", "declared", "ok"),
    [
        ("containerd://2.3.4", "auto", True),
        ("containerd://2.0.0", "auto", True),
        ("containerd://1.7.24", "auto", False),
        ("containerd://1.7.24", "on", True),
        ("containerd://1.6.20", "auto", False),
        ("cri-o://1.30.1", "auto", True),
        ("docker://24.0.0", "auto", False),
        ("containerd://2.3.4", "off", False),
        ("", "auto", False),
    ],
)
def test_cdi_refusal(version: str, declared: str, ok: bool) -> None:
    assert (cdi_refusal(version, declared) is None) == ok


def test_old_containerd_refusal_says_what_to_do() -> None:
    why = cdi_refusal("containerd://1.6.20")
    assert why is not None and "1.7 with enable_cdi, or 2.0+" in why and "device-plugin" in why
