"""Who calls the coordinator, asked of an API server that accepts but does not answer: the
caller hears "try again" after the lookup's one timeout, not after four."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from coordinator.callers import CallerUnknown, PodCallers
from tests.harness.fakeapi import FakeApiServer


def test_a_lookup_the_api_server_does_not_answer_is_asked_once(
    fake_api: FakeApiServer, api_client: Any
) -> None:
    """The client's default retried the timed-out list three times: the llm-d call waited
    20 s (four of the lookup's 5 s timeouts) to be told to try again."""
    fake_api.hang_next("list", "pods", times=4)
    callers = PodCallers(api_client)
    try:
        with pytest.raises(CallerUnknown) as unknown:
            asyncio.run(callers.namespace("ipv4:10.0.0.7:4431"))
    finally:
        fake_api.release_hangs()
    assert "cannot tell who calls from 10.0.0.7" in str(unknown.value)
    assert len(fake_api.requests("list", "pods")) == 1, "the lookup was retried"
