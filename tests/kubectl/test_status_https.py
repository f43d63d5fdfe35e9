"""`kubectl baton status` with an extender that serves HTTPS (the chart's `extender.tls`): the
API server's service proxy cannot speak plain HTTP to it, so the plugin asks over HTTPS."""

from __future__ import annotations

from commands.kubectl.agents import read_cluster
from commands.kubectl.api import NoAnswer, PluginError, Unreachable, inventory_path
from tests.kubectl.fake import GPU_A, DictApi, cluster_routes

PROXY_FAILED = PluginError(
    "the API server answered 503 to GET "
    f"{inventory_path()}: error trying to reach service: read: connection reset by peer"
)


def test_the_inventory_is_read_over_https_when_http_gets_no_answer() -> None:
    routes = cluster_routes()
    routes[inventory_path(https=True)] = routes[inventory_path()]
    routes[inventory_path()] = PROXY_FAILED
    api = DictApi(routes)
    document = read_cluster(api)
    assert GPU_A in [g["uuid"] for g in document["nodes"][0]["gpus"]]
    assert "extender_error" not in document
    paths = [p for p, _ in api.asked]
    assert paths.index(inventory_path()) < paths.index(inventory_path(https=True))


def test_when_neither_answers_the_plain_http_error_is_shown() -> None:
    routes = cluster_routes()
    routes[inventory_path()] = PROXY_FAILED
    document = read_cluster(DictApi(routes))
    assert document["extender_error"] == f"extender: {PROXY_FAILED}"


def test_a_silent_extender_is_not_asked_twice() -> None:
    routes = cluster_routes()
    routes[inventory_path()] = NoAnswer("no answer within 10 s", 10.0)
    api = DictApi(routes)
    read_cluster(api)
    assert inventory_path(https=True) not in [p for p, _ in api.asked]


def test_an_api_server_out_of_reach_is_not_asked_twice() -> None:
    routes = cluster_routes()
    routes[inventory_path()] = Unreachable("cannot reach the API server at x: refused")
    api = DictApi(routes)
    read_cluster(api)
    assert inventory_path(https=True) not in [p for p, _ in api.asked]
