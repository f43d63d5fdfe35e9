"""`make test` draws the same examples every run: the Hypothesis profile tests/conftest.py loads."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import HYPOTHESIS_PROFILE


def drawn() -> list[list[int]]:
    """The examples one run of a property test draws."""
    seen: list[list[int]] = []

    @given(st.lists(st.integers()))
    @settings(max_examples=30)
    def prop(values: list[int]) -> None:
        seen.append(values)

    prop()
    return seen


@pytest.mark.skipif(
    os.environ.get(HYPOTHESIS_PROFILE) == "random", reason="make soak draws new examples"
)
def test_property_tests_draw_the_same_examples_every_run() -> None:
    profile = settings.default
    assert profile is not None and profile.derandomize and profile.database is None
    first, second = drawn(), drawn()
    assert len(first) == 30 and first == second
