"""What a prepare meets besides a good claim: an API server that fails, a node not read yet,
directories the driver cannot write."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError, NewConnectionError

from dra.cdi import spec_path
from tests.dra.test_driver import Claims, _start
from tests.dra.test_slices import Slices
from tests.harness.drakubelet import DraKubeletStub


class FailingClaims(Claims):
    """Claims whose read fails, for the names in `failures`, with the error given."""

    def __init__(self) -> None:
        super().__init__()
        self.failures: dict[str, Exception] = {}

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        if name in self.failures:
            raise self.failures[name]
        return super().read_claim(namespace, name)


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[DraKubeletStub]:
    stub = DraKubeletStub(tmp_path / "plugins_registry")
    yield stub
    stub.close()


def test_a_claim_the_api_server_fails_to_read_is_one_claims_error_in_one_line(
    tmp_path: Path, kubelet: DraKubeletStub
) -> None:
    """The kubelet shows each claim's error in the pod's events; an API failure reading one
    claim must not fail the other claims of the call, nor reach the kubelet as a traceback."""
    claims = FailingClaims()
    claims.add("ns", "ok", "uid-ok", "gpu-0")
    claims.failures["denied"] = ApiException(status=403, reason="Forbidden")
    refused = "Failed to establish a new connection: refused"
    cut = MaxRetryError(None, "/apis", NewConnectionError(None, refused))  # type: ignore[arg-type]
    claims.failures["cut"] = cut
    driver = _start(tmp_path, claims, Slices())
    try:
        kubelet.register()
        answer = kubelet.prepare(
            ("ns", "uid-ok", "ok"), ("ns", "uid-d", "denied"), ("ns", "uid-c", "cut")
        ).claims
        assert answer["uid-ok"].error == ""
        denied, cut = answer["uid-d"].error, answer["uid-c"].error
        assert "claim ns/denied: cannot read it" in denied and "403 Forbidden" in denied, denied
        assert "claim ns/cut: cannot read it" in cut and "unreachable" in cut, cut
        assert "\n" not in denied + cut
        assert not spec_path(tmp_path / "cdi", "uid-d").exists()
    finally:
        driver.stop()
