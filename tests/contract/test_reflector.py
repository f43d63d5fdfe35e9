"""The reflector's loop on a scripted source: paging, resuming, 410, backoff, the outage said."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from baton.contract.kube import Outage
from baton.contract.reflector import Backoff, Reflector, WatchEvent

Step = Callable[[], Any]


class Raw:
    """A raw response: a body for a list, or chunks of watch lines."""

    def __init__(self, body: Any = None, events: list[dict[str, Any]] | None = None) -> None:
        self.data = orjson.dumps(body) if body is not None else b""
        lines = b"".join(orjson.dumps(e) + b"\n" for e in events or [])
        self._chunks = [lines[:9], lines[9:]]  # a line split across chunks, as they come
        self.released = False

    def stream(self, amt: Any = None, decode_content: bool = True) -> Iterator[bytes]:
        return iter(self._chunks)

    def release_conn(self) -> None:
        self.released = True


class Status(Exception):
    """What the Kubernetes client raises for an HTTP error status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"({status})\nReason: {reason}")
        self.status, self.reason = status, reason


class Script:
    """A source answering each list and watch with the next step; when none is left it stops
    the reflector (as `stop()` would) and fails the call."""

    def __init__(self, *steps: tuple[str, Any]) -> None:
        self.steps = list(steps)
        self.calls: list[tuple[str, Any]] = []
        self.reflector: Reflector | None = None
        self.closed = False
        self.mismatch = ""

    def _next(self, verb: str, arg: Any) -> Any:
        self.calls.append((verb, arg))
        if not self.steps:
            assert self.reflector is not None
            self.reflector.stop()
            raise ConnectionError("stopped")
        expected, answer = self.steps.pop(0)
        if expected != verb:  # the loop would take an AssertionError for a failing server
            self.mismatch = f"{verb} {arg!r} came where the script has a {expected}"
            self.steps.clear()
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def list(self, limit: int, continue_token: str, timeout_s: float) -> Any:
        return self._next("list", continue_token)

    def watch(self, resource_version: str, timeout_s: int, request_timeout_s: float) -> Any:
        return self._next("watch", resource_version)

    def abort(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class Recorder:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def replace(self, objects: list[dict[str, Any]], resource_version: str) -> None:
        self.seen.append(("replace", [o["metadata"]["name"] for o in objects], resource_version))

    def apply(self, event: WatchEvent) -> None:
        self.seen.append((event.type, event.object["metadata"]["name"]))


def obj(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}}


def page(version: str, *names: str, more: str = "") -> Raw:
    meta = {"resourceVersion": version, **({"continue": more} if more else {})}
    return Raw({"items": [obj(n, version) for n in names], "metadata": meta})


def error(code: int, message: str = "no") -> dict[str, Any]:
    return {"type": "ERROR", "object": {"kind": "Status", "code": code, "message": message}}


def run(script: Script, store: Recorder | None = None, **kwargs: Any) -> tuple[Recorder, list]:
    """Run the loop in this thread until the script is spent; the store and the backoffs."""
    store = store or Recorder()
    slept: list[float] = []
    outage = Outage(logging.getLogger("test.reflector"), "watch of things", "nothing changes")
    reflector = Reflector(script, store, outage, sleep=slept.append, **kwargs)
    script.reflector = reflector
    reflector.run()
    assert not script.mismatch, script.mismatch
    assert script.closed, "stop() closes the source"
    return store, slept


def test_a_paged_list_is_handed_whole_and_the_watch_starts_at_its_version() -> None:
    script = Script(
        ("list", page("5", "a", "b", more="t1")),
        ("list", page("6", "c", more="t2")),
        ("list", page("7", "d")),
        ("watch", Raw(events=[{"type": "ADDED", "object": obj("e", "8")}])),
    )
    store, slept = run(script, page=2)
    assert script.calls[:4] == [("list", ""), ("list", "t1"), ("list", "t2"), ("watch", "7")]
    assert store.seen == [("replace", ["a", "b", "c", "d"], "7"), ("ADDED", "e")]
    assert script.calls[4] == ("watch", "8"), "the next watch resumes where this one ended"
    assert slept == []


def test_changes_are_applied_in_order_and_bookmarks_only_move_the_version() -> None:
    events = [
        {"type": "ADDED", "object": obj("a", "2")},
        {"type": "MODIFIED", "object": obj("a", "3")},
        {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "9"}}},
        {"type": "DELETED", "object": obj("a", "10")},
        {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "12"}}},
    ]
    script = Script(("list", page("1")), ("watch", Raw(events=events)))
    store, _ = run(script)
    assert store.seen == [("replace", [], "1"), ("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    assert script.calls[-1] == ("watch", "12")


def test_a_410_relists_at_once_and_a_second_in_a_row_backs_off() -> None:
    restarts: list[str] = []
    script = Script(
        ("list", page("1", "a")),
        ("watch", Raw(events=[error(410, "too old resource version")])),
        ("list", page("20", "b")),
        ("watch", Status(410, "Gone")),
        ("list", page("30", "c")),
    )
    store, slept = run(script, on_restart=restarts.append)
    assert [s for s in store.seen if s[0] == "replace"] == [
        ("replace", ["a"], "1"),
        ("replace", ["b"], "20"),
        ("replace", ["c"], "30"),
    ]
    assert slept == [0.2], "the first 410 relists at once, the second after a backoff"
    assert restarts[0] == "API server answered 410: too old resource version"
    assert restarts[1] == "API server answered 410 Gone"


def test_an_expired_continue_token_starts_the_list_again() -> None:
    script = Script(
        ("list", page("5", "a", more="t1")),
        ("list", Status(410, "Expired")),
        ("list", page("9", "a", "b")),
    )
    store, slept = run(script)
    assert script.calls[:3] == [("list", ""), ("list", "t1"), ("list", "")]
    assert store.seen == [("replace", ["a", "b"], "9")] and slept == []


@pytest.mark.parametrize("code", [429, 500, 503])
def test_an_error_event_other_than_410_is_backed_off_and_the_watch_resumed(
    code: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Relisting at once on a failing API server would hammer it in a loop."""
    caplog.set_level(logging.DEBUG, "test.reflector")
    script = Script(
        ("list", page("1")),
        ("watch", Raw(events=[{"type": "ADDED", "object": obj("a", "4")}, error(code)])),
        ("watch", Raw(events=[error(code)])),
        ("watch", Raw(events=[{"type": "ADDED", "object": obj("b", "6")}])),
    )
    store, slept = run(script)
    assert script.calls[1:4] == [("watch", "1"), ("watch", "4"), ("watch", "4")]
    assert slept == [0.2, 0.4]
    assert [s for s in store.seen if s[0] == "replace"] == [("replace", [], "1")]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, "said once per outage"
    assert f"watch of things: API server answered {code}: no; retrying" in warnings[0]
    assert "nothing changes" in warnings[0]
    back = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert back == ["watch of things: the API server answers again after 2 failed attempts"]


def test_failures_back_off_doubling_up_to_the_cap_and_reset_after_a_success() -> None:
    down = [("list", ConnectionRefusedError(111, "Connection refused"))] * 7
    script = Script(*down, ("list", page("1")), ("watch", Raw()), ("watch", OSError("reset")))
    _, slept = run(script, backoff=Backoff(0.5, 4.0))
    assert slept == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 0.5]


def test_a_store_that_fails_is_said_and_everything_is_listed_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Picky(Recorder):
        def apply(self, event: WatchEvent) -> None:
            if event.object["metadata"]["name"] == "bad":
                raise KeyError("spec")
            super().apply(event)

    script = Script(
        ("list", page("1")),
        ("watch", Raw(events=[{"type": "ADDED", "object": obj("bad", "2")}])),
        ("list", page("3", "bad")),
    )
    store, slept = run(script, store=Picky())
    assert store.seen == [("replace", [], "1"), ("replace", ["bad"], "3")] and slept == [0.2]
    (said,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "the store failed on an event: KeyError('spec')" in said.getMessage()
    assert said.exc_info is not None, "with the traceback"


def test_bodies_and_watch_lines_go_through_the_given_decoder() -> None:
    read: list[bytes] = []

    def decode(data: bytes) -> Any:
        read.append(data)
        return orjson.loads(data)

    script = Script(
        ("list", page("1", "a")),
        ("watch", Raw(events=[{"type": "ADDED", "object": obj("b", "2")}])),
    )
    store, _ = run(script, decode=decode)
    assert store.seen == [("replace", ["a"], "1"), ("ADDED", "b")]
    assert len(read) == 2 and read[1].startswith(b'{"type":"ADDED"')


def test_list_now_hands_a_fresh_list_to_the_store_and_raises_to_the_caller() -> None:
    script = Script(("list", page("4", "a")), ("list", Status(503, "Unavailable")))
    store = Recorder()
    outage = Outage(logging.getLogger("test.reflector"), "watch", "nothing")
    reflector = Reflector(script, store, outage)
    assert [o["metadata"]["name"] for o in reflector.list_now()] == ["a"]
    assert store.seen == [("replace", ["a"], "4")]
    with pytest.raises(Status):
        reflector.list_now()
    assert reflector.resource_version == "", "the loop's own watch is left alone"


def test_an_error_the_caller_takes_as_refused_waits_its_delay_then_lists_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A role without the verb: retrying soon cannot mend it, so the caller takes over (the node
    annotator polls instead) and names the wait before the next try (the role may be granted
    later); the loop neither backs off nor says an outage, and lists afresh."""
    caplog.set_level(logging.DEBUG, "test.reflector")
    refusals: list[int] = []

    def refused(err: Exception) -> float | None:
        status = getattr(err, "status", None)
        if status != 403:
            return None
        refusals.append(status)
        return 60.0

    script = Script(
        ("list", Status(500, "Internal Server Error")),
        ("list", Status(403, "Forbidden")),
        ("list", page("1")),
        ("watch", Status(403, "Forbidden")),
        ("list", page("2", "a")),
        ("watch", Raw(events=[{"type": "ADDED", "object": obj("b", "3")}])),
    )
    store, slept = run(script, refused=refused)
    assert script.calls[:6] == [
        ("list", ""),
        ("list", ""),
        ("list", ""),
        ("watch", "1"),
        ("list", ""),
        ("watch", "2"),
    ]
    assert refusals == [403, 403]
    assert slept == [0.2, 60.0, 60.0], "only the 500 was backed off"
    assert store.seen == [("replace", [], "1"), ("replace", ["a"], "2"), ("ADDED", "b")]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "500" in warnings[0]
