"""A NodePrepareResources of several claims while the API server hangs: every claim answers
with its own reason within the kubelet's deadline (45 s), not the whole call with the
kubelet's deadline error."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from urllib3.exceptions import MaxRetryError, ReadTimeoutError

from tests.dra.test_driver import WAIT_S, Claims, _start
from tests.dra.test_slices import Slices
from tests.harness.drakubelet import DraKubeletStub


class HungClaims(Claims):
    """Claims on an API server that does not answer for those named in `hung`: their read ends
    as the API client's own timeout ends it, after `timeout_s`, unless `answering` is set."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__()
        self.timeout_s = timeout_s
        self.hung: set[str] = set()
        self.answering = threading.Event()

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        if name in self.hung and not self.answering.wait(self.timeout_s):
            timed_out = ReadTimeoutError(None, "/apis", f"Read timed out. ({self.timeout_s})")  # type: ignore[arg-type]
            raise MaxRetryError(None, "/apis", timed_out)  # type: ignore[arg-type]
        return super().read_claim(namespace, name)


def test_claims_read_from_a_hung_api_server_each_answer_their_own_timeout(
    tmp_path: Path, kubelet: DraKubeletStub
) -> None:
    """Four claims whose reads each time out after 1 s, under a 2.5 s deadline (the API
    client's 10 s and the kubelet's 45 s, scaled): read one after another they would pass it."""
    claims = HungClaims(timeout_s=1.0)
    uids = [(f"uid-{i}", f"c{i}") for i in range(4)]
    for uid, name in uids:
        claims.add("ns", name, uid, "gpu-0")
        claims.hung.add(name)
    driver = _start(tmp_path, claims, Slices())
    try:
        kubelet.register()
        answer = kubelet.prepare(*[("ns", u, n) for u, n in uids], timeout=2.5).claims
        for uid, name in uids:
            error = answer[uid].error
            assert f"claim ns/{name}: cannot read it" in error and "timed out" in error, error
    finally:
        claims.answering.set()
        driver.stop()


def test_a_claim_not_prepared_by_the_deadline_says_so_and_the_others_answer(
    tmp_path: Path, kubelet: DraKubeletStub
) -> None:
    """A claim whose read outlasts the call's deadline gets its own error in time; the claims
    prepared meanwhile are answered prepared, and the late one is prepared at the retry."""
    claims = HungClaims(timeout_s=WAIT_S)
    claims.add("ns", "ok", "uid-ok", "gpu-0")
    claims.add("ns", "slow", "uid-slow", "gpu-1")
    claims.hung.add("slow")
    driver = _start(tmp_path, claims, Slices())
    try:
        kubelet.register()
        both = (("ns", "uid-ok", "ok"), ("ns", "uid-slow", "slow"))
        answer = kubelet.prepare(*both, timeout=3.0).claims
        assert answer["uid-ok"].error == ""
        late = answer["uid-slow"].error
        assert "claim ns/slow: not prepared within" in late and "\n" not in late, late
        claims.answering.set()
        answer = kubelet.prepare(*both).claims
        assert answer["uid-ok"].error == answer["uid-slow"].error == ""
    finally:
        claims.answering.set()
        driver.stop()
