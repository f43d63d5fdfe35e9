"""The one DRA client: a missing claim is None, other failures raise, slices are this node's."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from baton.contract import names
from baton.contract.draapi import DraApi


class _Resource:
    def __init__(self, status: int | None = None) -> None:
        self.status = status
        self.selectors: list[str] = []

    def read_namespaced_resource_claim(self, name: str, namespace: str, **_: Any) -> Any:
        if self.status is not None:
            raise ApiException(status=self.status, reason="stub")
        return SimpleNamespace(data=json.dumps({"metadata": {"name": name}}).encode())

    def list_resource_slice(self, field_selector: str, **_: Any) -> Any:
        self.selectors.append(field_selector)
        return SimpleNamespace(data=json.dumps({"items": [{"metadata": {"name": "s"}}]}).encode())


def _api(resource: _Resource) -> DraApi:
    api = DraApi(ApiClient(), "n1")
    api._resource = resource
    return api


def test_a_claim_that_is_gone_is_none() -> None:
    assert _api(_Resource(404)).read_claim("ns", "c") is None


def test_a_claim_read_that_fails_otherwise_raises() -> None:
    with pytest.raises(ApiException):
        _api(_Resource(500)).read_claim("ns", "c")


def test_a_claim_is_its_json() -> None:
    assert _api(_Resource()).read_claim("ns", "c") == {"metadata": {"name": "c"}}


def test_slices_are_this_nodes_of_batons_driver() -> None:
    resource = _Resource()
    assert _api(resource).list_slices() == [{"metadata": {"name": "s"}}]
    assert resource.selectors == [f"spec.nodeName=n1,spec.driver={names.DRA_DRIVER}"]
