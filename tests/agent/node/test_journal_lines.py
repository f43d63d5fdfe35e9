"""The journal's lines for a grant and an end, written without `json.dumps` (the grant waits
for them), are byte for byte what `json.dumps` writes, for any lease the agent can make."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.leases import Lease
from agent.node.state_json import journal_line, lease_from_json, lease_to_json

texts = st.text(max_size=40)  # quotes, backslashes, control and non-ASCII characters too
times = st.floats(allow_nan=True, allow_infinity=True)
leases = st.builds(
    Lease,
    lease_id=texts,
    tenant_id=texts,
    gpus=st.lists(texts, max_size=4).map(tuple),
    tokens=st.dictionaries(texts, st.integers(min_value=0, max_value=2**63), max_size=4),
    granted_at=times,
    hold_until=times,
)
seqs = st.integers(min_value=1, max_value=2**53)


def dumped(entry: dict, seq: int) -> bytes:
    return json.dumps({**entry, "seq": seq}).encode() + b"\n"


@settings(max_examples=400, deadline=None)
@given(leases, seqs)
def test_a_grant_line_is_what_json_dumps_writes(lease: Lease, seq: int) -> None:
    line = journal_line({"grant": lease}, seq)
    assert line == dumped({"grant": lease_to_json(lease)}, seq)
    if math.isfinite(lease.granted_at) and math.isfinite(lease.hold_until):
        assert lease_from_json(json.loads(line)["grant"]) == lease


@settings(max_examples=200, deadline=None)
@given(texts, seqs)
def test_an_end_line_is_what_json_dumps_writes(lease_id: str, seq: int) -> None:
    assert journal_line({"end": lease_id}, seq) == dumped({"end": lease_id}, seq)


def test_other_entries_go_through_json_dumps() -> None:
    entry = {"parked": {"local/a": {"GPU-0": 5}}}
    assert journal_line(entry, 7) == dumped(entry, 7)
    assert entry == {"parked": {"local/a": {"GPU-0": 5}}}  # the caller's entry is left as it was
