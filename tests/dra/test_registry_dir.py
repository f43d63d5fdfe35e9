"""`baton dra --registry-dir` naming a directory no kubelet made: made, and said in the log."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dra.daemon import Driver
from tests.dra.test_driver import GPUS, Claims, _settings, tmp
from tests.dra.test_slices import Slices

__all__ = ["tmp"]  # the fixture, used by name


def test_a_registry_directory_no_kubelet_made_is_named_in_the_log(
    tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A --registry-dir that does not exist (a typo, or a kubelet rooted elsewhere) is made,
    but the kubelet never looks there: the driver would wait for a registration that never
    comes, saying why only on /readyz. The log names the directory and the flag."""
    wrong = tmp / "nk" / "reg"
    settings = dataclasses.replace(_settings(tmp), registry_dir=wrong)
    driver = Driver(settings, GPUS, True, slices=Slices(), claims=Claims())
    with caplog.at_level("WARNING", logger="dra.daemon"):
        driver.start()
    driver.stop()
    said = [r.getMessage() for r in caplog.records if "--registry-dir" in r.getMessage()]
    assert len(said) == 1 and str(wrong) in said[0]
    caplog.clear()
    driver = Driver(settings, GPUS, True, slices=Slices(), claims=Claims())
    with caplog.at_level("WARNING", logger="dra.daemon"):
        driver.start()  # the directory is there now (as a kubelet's would be): nothing said
    driver.stop()
    assert not [r for r in caplog.records if "--registry-dir" in r.getMessage()]
