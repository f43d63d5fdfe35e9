"""The extender's HTTP face: kube-scheduler's verbs plus health, metrics and inventory.

`/preempt` keeps only the candidate nodes where evicting kube-scheduler's proposed victims
frees what the pod needs on a GPU (slots, memory, duty, host budget), so no pod is evicted for
nothing.

Every answer that is an answer is HTTP 200 (kube-scheduler treats anything else as a transport
failure); a body that is not what kube-scheduler sends gets a 400 naming the field.

`/filter` and `/prioritize` are answered on the event loop; binds wait on the API server in
worker threads, at most `binds_in_flight` at a time (see `extender.bind.BINDS_IN_FLIGHT`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
from fastapi import FastAPI, Request, Response
from starlette.concurrency import run_in_threadpool

from extender import wire
from extender.bind import BINDS_IN_FLIGHT, Binder
from extender.cache import ClusterCache
from extender.metrics import Metrics
from extender.schema import (
    EXTENDER_ARGS,
    EXTENDER_BINDING_ARGS,
    EXTENDER_PREEMPTION_ARGS,
    request_body,
)
from extender.verbs import filter_nodes, preempt_nodes, prioritize_nodes

log = logging.getLogger(__name__)
JSON = "application/json"
NOT_SYNCED = "the extender's cluster cache has not synced with the API server yet; retry shortly"


def create_app(
    cache: ClusterCache,
    binder: Binder | None,
    metrics: Metrics,
    binds_in_flight: int = BINDS_IN_FLIGHT,
) -> FastAPI:
    """The FastAPI app serving `/filter`, `/prioritize`, `/bind` and the operational routes."""
    if binds_in_flight < 1:
        raise ValueError(f"binds in flight must be 1 or more, not {binds_in_flight}")
    app = FastAPI(title="Baton scheduler extender", docs_url=None, redoc_url=None)
    binds = anyio.CapacityLimiter(binds_in_flight)

    @app.post("/filter", openapi_extra=request_body(EXTENDER_ARGS))
    async def filter_verb(request: Request) -> Response:
        body = await request.body()
        return _answer(metrics, "filter", lambda: _filter(cache, metrics, body))

    @app.post("/prioritize", openapi_extra=request_body(EXTENDER_ARGS))
    async def prioritize_verb(request: Request) -> Response:
        body = await request.body()
        return _answer(metrics, "prioritize", lambda: _prioritize(cache, body))

    @app.post("/preempt", openapi_extra=request_body(EXTENDER_PREEMPTION_ARGS))
    async def preempt_verb(request: Request) -> Response:
        body = await request.body()
        return _answer(metrics, "preempt", lambda: _preempt(cache, body))

    @app.post("/bind", openapi_extra=request_body(EXTENDER_BINDING_ARGS))
    async def bind_verb(request: Request) -> Response:
        return await _bind(binder, binds, metrics, await request.body())

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response("ok\n", media_type="text/plain")

    @app.get("/readyz")
    async def readyz() -> Response:
        if cache.synced():
            return Response("ok\n", media_type="text/plain")
        return Response(NOT_SYNCED + "\n", status_code=503, media_type="text/plain")

    @app.get("/metrics")
    async def metrics_route() -> Response:
        with cache.lock:
            metrics.nodes.set(len(cache.state.node_names()))
            metrics.assumed.set(len(cache.state.assumed()))
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/inventory")
    async def inventory() -> Response:
        def describe() -> Response:
            with cache.lock:
                nodes = cache.state.inventory()
            return _json(200, {"synced": cache.synced(), "nodes": nodes})

        # Off the event loop: describing a large cluster takes a while; the verbs must not wait.
        return await run_in_threadpool(describe)

    return app


async def _bind(
    binder: Binder | None, binds: anyio.CapacityLimiter, metrics: Metrics, body: bytes
) -> Response:
    """Bind the pod (off the event loop, `binds` at a time); a failed bind is a 200 whose Error
    says why."""
    args_or_error = _parse_or_400(metrics, "bind", body)
    if isinstance(args_or_error, Response):
        return args_or_error
    started = time.perf_counter()
    if binder is None:
        error = "this extender runs without an API server and cannot bind"
    else:
        error = await anyio.to_thread.run_sync(binder.bind, args_or_error, limiter=binds)
    metrics.binds.labels("error" if error else "bound").inc()
    if error:
        log.warning("%s", error)
    metrics.latency.labels("bind").observe(time.perf_counter() - started)
    metrics.requests.labels("bind", "200").inc()
    return _json(200, wire.binding_result(error))


def _filter(cache: ClusterCache, metrics: Metrics, body: bytes) -> Any:
    args = wire.extender_args(body)
    if not cache.synced():
        return wire.filter_result(args, [], {}, {}, NOT_SYNCED)
    passed, failed, unresolvable = filter_nodes(cache.state, args)
    metrics.filtered.labels("passed").inc(len(passed))
    metrics.filtered.labels("failed").inc(len(failed))
    metrics.filtered.labels("unresolvable").inc(len(unresolvable))
    return wire.filter_result(args, passed, failed, unresolvable)


def _prioritize(cache: ClusterCache, body: bytes) -> Any:
    args = wire.extender_args(body)
    return wire.host_priorities(prioritize_nodes(cache.state, args))


def _preempt(cache: ClusterCache, body: bytes) -> Any:
    args = wire.preemption_args(body)
    return wire.preemption_result(args, preempt_nodes(cache.state, args))


def _answer(metrics: Metrics, verb: str, compute: Callable[[], Any]) -> Response:
    started = time.perf_counter()
    try:
        response = _json(200, compute())
    except wire.WireError as err:
        response = _json(400, {"Error": f"bad {verb} request: {err}"})
    except Exception as err:
        log.exception("%s failed", verb)
        response = _json(500, {"Error": f"{verb} failed inside the extender: {err}"})
    metrics.latency.labels(verb).observe(time.perf_counter() - started)
    metrics.requests.labels(verb, str(response.status_code)).inc()
    return response


def _parse_or_400(metrics: Metrics, verb: str, body: bytes) -> wire.BindingArgs | Response:
    try:
        return wire.binding_args(body)
    except wire.WireError as err:
        metrics.requests.labels(verb, "400").inc()
        return _json(400, {"Error": f"bad {verb} request: {err}"})


def _json(status: int, value: Any) -> Response:
    return Response(wire.encode(value), status_code=status, media_type=JSON)
