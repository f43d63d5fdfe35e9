"""The watch-fed pod cache against the fake API server: only this node, deletes, outages, 410."""

from __future__ import annotations

import pytest

from deviceplugin.podcache import PodCache
from tests.deviceplugin.conftest import NODE, tenant_pod


@pytest.fixture
def cache(api_client):
    pods = PodCache(api_client, NODE)
    pods.start()
    assert pods.wait_synced(10)
    yield pods
    pods.stop()


def names_of(pods):
    return sorted(p.name for p in pods)


def test_sees_only_this_nodes_pods_and_follows_deletes(fake_api, cache):
    fake_api.put_object(tenant_pod("mine", ("GPU-x",), assigned_at_ns=7))
    fake_api.put_object(tenant_pod("elsewhere", node="node-b"))
    assert cache.wait_for(lambda pods: names_of(pods) == ["mine"], 5)
    (mine,) = cache.pods()
    assert (mine.assigned_gpus, mine.assigned_at_ns, mine.gpu_request) == (("GPU-x",), 7, 1)
    fake_api.remove_object("Pod", "mine")
    assert cache.wait_for(lambda pods: pods == [], 5)
    assert [r.verb for r in fake_api.requests(resource="pods")].count("list") == 1


def test_catches_up_after_an_outage_with_history_gone(fake_api, cache):
    fake_api.put_object(tenant_pod("before"))
    assert cache.wait_for(lambda pods: names_of(pods) == ["before"], 5)
    fake_api.stop()
    fake_api.remove_object("Pod", "before")
    fake_api.put_object(tenant_pod("during"))
    fake_api.compact_history()
    fake_api.start()
    assert cache.wait_for(lambda pods: names_of(pods) == ["during"], 10)


def test_a_list_taken_before_the_watchs_changes_does_not_undo_them(fake_api, cache):
    # A relist (Allocate's or the reconciler's cache miss, on their own threads) lists the
    # pods, and the watch applies newer changes before the list replaces the cache: the list
    # must not bring a deleted pod back, drop a new one, or revert an assignment.
    fake_api.put_object(tenant_pod("deleted"))
    fake_api.put_object(tenant_pod("assigned"))
    assert cache.wait_for(lambda pods: names_of(pods) == ["assigned", "deleted"], 5)
    objects, version = cache._reflector._list()  # the relist's list, before the changes
    fake_api.remove_object("Pod", "deleted")
    fake_api.put_object(tenant_pod("assigned", ("GPU-x",), assigned_at_ns=7))
    fake_api.put_object(tenant_pod("added"))

    def changed(pods):
        by_name = {p.name: p for p in pods}
        return set(by_name) == {"added", "assigned"} and by_name["assigned"].assigned_gpus

    assert cache.wait_for(changed, 5)
    cache.replace(objects, version)  # the relist's list lands now
    assert changed(cache.pods()), [(p.name, p.assigned_gpus) for p in cache.pods()]
