"""A claim whose prepare had not begun when NodePrepareResources answered (its batch's workers
all busy with claims whose reads hang) is not prepared later: the kubelet, told it failed,
unprepares it as its pod goes, and a prepare run after that would leave its record and CDI spec
on the node for good, one more with each such pod."""

from __future__ import annotations

import threading
from pathlib import Path

from dra import cdi
from dra.service import PREPARE_WORKERS
from tests.dra.test_driver import WAIT_S, _start
from tests.dra.test_prepare_batch import HungClaims
from tests.dra.test_slices import Slices
from tests.harness.drakubelet import DraKubeletStub


def test_a_claim_unprepared_before_its_late_prepare_began_stays_unprepared(
    tmp_path: Path, kubelet: DraKubeletStub
) -> None:
    claims = HungClaims(timeout_s=WAIT_S)
    uids = [("ns", f"uid-{i}", f"c{i}") for i in range(PREPARE_WORKERS + 12)]
    for _, uid, name in uids:
        claims.add("ns", name, uid, "gpu-0")
        claims.hung.add(name)
    driver = _start(tmp_path, claims, Slices())
    try:
        kubelet.register()
        answer = kubelet.prepare(*uids, timeout=2.0).claims
        assert all("not prepared within" in answer[u].error for _, u, _ in uids)
        started, queued = uids[:PREPARE_WORKERS], uids[PREPARE_WORKERS:]
        # Their pods are deleted: the kubelet unprepares every claim it was told failed.
        assert all(a.error == "" for a in kubelet.unprepare(*queued).claims.values())
        claims.answering.set()  # the API server answers again
        assert all(a.error == "" for a in kubelet.unprepare(*started).claims.values())
        for thread in threading.enumerate():  # the batch's workers finish (bounded)
            if thread.name.startswith("dra-prepare"):
                thread.join(WAIT_S)
                assert not thread.is_alive()
        assert driver.record.uids() == []
        assert cdi.orphan_specs(tmp_path / "cdi", []) == []
    finally:
        claims.answering.set()
        driver.stop()
