"""The record of prepared claims on disk: written whole, read back exactly, refused when its
shape is not the one the driver writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra.record import RECORD_FILE, ClaimRecord, PreparedClaim, PreparedDevice

CLAIM = PreparedClaim(
    "uid-1",
    "ns",
    "c1",
    (PreparedDevice(("gpu",), "n1", "gpu-0", "GPU-a", ("baton.dev/claim=uid-1",), "s1"),),
)


def _device(**changed: object) -> dict[str, object]:
    device: dict[str, object] = {
        "request_names": ["gpu"],
        "pool": "n1",
        "device": "gpu-0",
        "gpu": "GPU-a",
        "cdi_ids": ["baton.dev/claim=uid-1"],
        "share_id": None,
    }
    device.update(changed)
    return device


def _claim(**changed: object) -> dict[str, object]:
    claim: dict[str, object] = {"uid": "uid-1", "namespace": "ns", "name": "c1"}
    claim["devices"] = [_device()]
    claim.update(changed)
    return claim


def test_a_recorded_claim_reads_back_the_same(tmp_path: Path) -> None:
    ClaimRecord(tmp_path).put(CLAIM)
    assert ClaimRecord(tmp_path).get("uid-1") == CLAIM
    written = json.loads((tmp_path / RECORD_FILE).read_text())
    assert written["format"] == 1 and written["claims"]["uid-1"]["uid"] == "uid-1"


def test_a_record_without_a_format_number_reads_as_the_first(tmp_path: Path) -> None:
    """The claims by UID alone, as drivers wrote the record before it had a number."""
    (tmp_path / RECORD_FILE).write_text(
        json.dumps({"uid-1": _claim(devices=[_device(share_id="s1")])})
    )
    record = ClaimRecord(tmp_path)
    assert record.get("uid-1") == CLAIM
    record.drop("uid-1")
    assert json.loads((tmp_path / RECORD_FILE).read_text()) == {"format": 1, "claims": {}}


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        ("", "Expecting value"),
        ([], "a JSON list, not an object of claims by UID"),
        ({"uid-1": None}, "claim uid-1 is not an object"),
        ({"uid-1": _claim(devices={})}, "claim uid-1: devices is not a list"),
        ({"uid-1": _claim(devices=None)}, "claim uid-1: devices is not a list"),
        ({"uid-1": _claim(uid="uid-2")}, "claim uid-1 is recorded under UID 'uid-2'"),
        ({"uid-1": {"uid": "uid-1"}}, "claim uid-1 has no namespace, name, devices"),
        ({"uid-1": _claim(name=7)}, "claim uid-1: name is not a string"),
        (
            {"uid-1": _claim(devices=[_device(request_names="gpu")])},
            "claim uid-1 device 0: request_names is not a list of strings",
        ),
        (
            {"uid-1": _claim(devices=[_device(pool=1)])},
            "claim uid-1 device 0: pool is not a string",
        ),
        (
            {"uid-1": _claim(devices=[_device(share_id=3)])},
            "claim uid-1 device 0: share_id is not a string",
        ),
        ({"uid-1": _claim(devices=["gpu-0"])}, "claim uid-1 device 0 is not an object"),
        (
            {"format": 2, "claims": {}},
            "format 2 was written by a newer driver; this one reads format 1",
        ),
        ({"format": "1", "claims": {}}, "format '1' is not a format number"),
        ({"format": 1, "claims": []}, "claims is not an object of claims by UID"),
        ({"format": 1, "claims": {"uid-1": _claim(name=7)}}, "claim uid-1: name is not a string"),
    ],
)
def test_a_record_of_another_shape_is_refused_in_one_line_naming_the_file(
    tmp_path: Path, record: object, problem: str
) -> None:
    """A record some other version wrote, or a hand edit, is refused at start, not half read:
    a misread device would be answered to the kubelet on its next prepare."""
    path = tmp_path / RECORD_FILE
    path.write_text(record if isinstance(record, str) else json.dumps(record))
    with pytest.raises(ValueError) as refused:
        ClaimRecord(tmp_path)
    message = str(refused.value)
    assert problem in message and str(path) in message and "\n" not in message, message
