"""The bench's pod watch reads raw watch lines: split across chunks, relisting on 410."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from baton.bench.fleet import BindWatch
from extender.kubeapi import Watch


class Raw:
    def __init__(self, body: Any = None, chunks: list[bytes] | None = None) -> None:
        self.data = orjson.dumps(body) if body is not None else b""
        self._chunks = chunks or []

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        return iter(self._chunks)

    def release_conn(self) -> None:
        pass


def pod(name: str, version: str, node: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}, "spec": {"nodeName": node}}


class Api:
    def __init__(self) -> None:
        self.lists = 0

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Raw:
        self.lists += 1
        items = [pod("listed", "7", node="n1")] if self.lists > 1 else []
        return Raw({"items": items, "metadata": {"resourceVersion": str(self.lists)}})


def line(kind: str, obj: dict[str, Any]) -> bytes:
    return orjson.dumps({"type": kind, "object": obj}) + b"\n"


def test_events_split_across_chunks_are_read_and_bound_pods_recorded() -> None:
    watch = BindWatch(Api(), "ns")
    watch._relist()
    events = line("ADDED", pod("a", "10")) + line("MODIFIED", pod("a", "11", node="n2"))
    watch._follow(Watch(Raw(chunks=[events[:25], events[25:70], events[70:]]), "pods"))
    assert set(watch.bound) == {"a"}
    assert watch._version == "11"


def test_a_410_relists_and_another_error_ends_the_watch() -> None:
    api = Api()
    watch = BindWatch(api, "ns")
    watch._relist()
    watch._follow(Watch(Raw(chunks=[line("ERROR", {"code": 410, "message": "too old"})]), "pods"))
    assert api.lists == 2 and "listed" in watch.bound and watch._version == "2"
    with pytest.raises(RuntimeError, match="forbidden"):
        watch._follow(
            Watch(Raw(chunks=[line("ERROR", {"code": 403, "message": "forbidden"})]), "pods")
        )
