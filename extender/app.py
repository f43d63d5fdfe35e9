"""The extender's routes: kube-scheduler's verbs plus health, metrics, inventory and the
OpenAPI document.

`/preempt` keeps only the candidate nodes where evicting kube-scheduler's proposed victims
frees what the pod needs on a GPU (slots, memory, duty, host budget), so no pod is evicted for
nothing.

Every answer that is an answer is HTTP 200 (kube-scheduler treats anything else as a transport
failure); a body that is not what kube-scheduler sends gets a 400 naming the field.

Everything is answered on the event loop: `/filter`, `/prioritize` and `/preempt` at once, binds
when the API server has answered their one call (`extender.apipost`), at most `binds_in_flight`
at a time (see `extender.bind.BINDS_IN_FLIGHT`), the others queued in arrival order. Two things
wait in a thread of their own: a filter for a pod naming a claim the cache has not seen yet
waits there for the claim watch (at most `CLAIM_WAIT_S`, only while the watches are up), and the
inventory, which takes a while for a large cluster, is described there. The cache's lock,
which `/preempt`, a bind and a filter with node objects take on the event loop, is held only
for short steps: a relist is rebuilt off it (`extender.relist`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from extender import wire
from extender.bind import BINDS_IN_FLIGHT, NOT_SYNCED, Binder
from extender.cache import ClusterCache
from extender.draverbs import uncached_claims
from extender.http import Reply, Request, Route, Routes, text
from extender.metrics import Metrics
from extender.schema import openapi_document
from extender.state import ClusterState
from extender.verbs import FilterScores, filter_nodes, preempt_nodes, prioritize_nodes

log = logging.getLogger(__name__)
CLAIM_WAIT_S = 2.0
"""How long a filter waits for the claim watch to show a claim the pod names. kube-scheduler's
informer may see a claim made from a template a moment before this extender's watch does; a pod
refused for it waits in the scheduler's queue for a retry (its backoff at least, and for a
change in the cluster that moves it back). kube-scheduler filters one pod at a time, so the wait
holds up its scheduling: it is skipped while a watch is failing (the claim would not come)."""
OK = text(200, "ok")


def create_app(
    cache: ClusterCache,
    binder: Binder | None,
    metrics: Metrics,
    binds_in_flight: int = BINDS_IN_FLIGHT,
) -> Routes:
    """The routes serving `/filter`, `/prioritize`, `/preempt`, `/bind` and the operational
    ones."""
    if binds_in_flight < 1:
        raise ValueError(f"binds in flight must be 1 or more, not {binds_in_flight}")
    binds = asyncio.Semaphore(binds_in_flight)
    describing = ThreadPoolExecutor(1, thread_name_prefix="extender-inventory")
    claim_waits = ThreadPoolExecutor(1, thread_name_prefix="extender-claim-wait")
    document = wire.encode(openapi_document())
    kept = FilterScores()

    def verb(name: str, compute: Callable[[bytes], Any]) -> Route:
        return Route(lambda request: _answer(metrics, name, lambda: compute(request.body)))

    def readyz(request: Request) -> Reply:
        return OK if cache.synced() else text(503, NOT_SYNCED)

    def metrics_route(request: Request) -> Reply:
        with cache.lock:
            metrics.nodes.set(len(cache.state.node_names()))
            metrics.assumed.set(len(cache.state.assumed()))
        return Reply(200, metrics.render(), "text/plain; version=0.0.4; charset=utf-8")

    def inventory(request: Request) -> Reply:
        with cache.lock:
            nodes = cache.state.inventory()
        return Reply(200, wire.encode({"synced": cache.synced(), "nodes": nodes}))

    return {
        ("POST", "/filter"): Route(
            lambda request: _filter_route(cache, metrics, kept, claim_waits, request.body)
        ),
        ("POST", "/prioritize"): verb("prioritize", lambda body: _prioritize(cache, kept, body)),
        ("POST", "/preempt"): verb("preempt", lambda body: _preempt(cache, body)),
        # The one verb that acts: with --tls-client-ca only kube-scheduler's certificate may.
        ("POST", "/bind"): Route(
            lambda request: _bind(binder, binds, metrics, request.body), client_cert=True
        ),
        ("GET", "/healthz"): Route(lambda request: OK),
        ("GET", "/readyz"): Route(readyz),
        ("GET", "/metrics"): Route(metrics_route),
        # Off the event loop: describing a large cluster takes a while; the verbs must not wait.
        ("GET", "/v1/inventory"): Route(inventory, describing),
        ("GET", "/openapi.json"): Route(lambda request: Reply(200, document)),
    }


async def _bind(
    binder: Binder | None, binds: asyncio.Semaphore, metrics: Metrics, body: bytes
) -> Reply:
    """Bind the pod (`binds` at a time); a failed bind is a 200 whose Error says why."""
    try:
        args = wire.binding_args(body)
    except wire.WireError as err:
        metrics.requests.labels("bind", "400").inc()
        return Reply(400, wire.encode({"Error": f"bad bind request: {err}"}))
    started = time.perf_counter()
    if binder is None:
        error = "this extender runs without an API server and cannot bind"
    else:
        async with binds:
            error = await binder.bind(args)
    metrics.binds.labels("error" if error else "bound").inc()
    if error:
        log.warning("%s", error)
    metrics.answered("bind", 200, time.perf_counter() - started)
    return Reply(200, wire.encode(wire.binding_result(error)))


async def _filter_route(
    cache: ClusterCache, metrics: Metrics, kept: FilterScores, pool: Executor, body: bytes
) -> Reply:
    """Filter, once the cache has seen the claims the pod names (or `CLAIM_WAIT_S` passed)."""
    started = time.perf_counter()
    try:
        args = wire.extender_args(body)
    except wire.WireError:  # `_answer` says what is wrong with it
        return _answer(metrics, "filter", lambda: wire.extender_args(body), started)
    missing = _claims_missing(cache, args.pod)
    if missing is not None:
        seen = await asyncio.get_running_loop().run_in_executor(
            pool, cache.wait_for, lambda state: not missing(state), CLAIM_WAIT_S
        )
        metrics.claim_waits.labels("seen" if seen else "timeout").inc()
    return _answer(metrics, "filter", lambda: _filter(cache, metrics, kept, args), started)


def _claims_missing(
    cache: ClusterCache, pod: dict[str, Any]
) -> Callable[[ClusterState], bool] | None:
    """Whether the pod names claims the cache lacks (a test of the state to wait on), or None
    when there is nothing to wait for."""
    if not (cache.state.dra and cache.synced() and cache.watching()):
        return None

    def missing(state: ClusterState) -> bool:
        return bool(uncached_claims(state, pod))

    return missing if missing(cache.state) else None


def _filter(
    cache: ClusterCache, metrics: Metrics, kept: FilterScores, args: wire.ExtenderArgs
) -> Any:
    if not cache.synced():
        return wire.filter_result(args, [], {}, {}, NOT_SYNCED)
    with _reading_sent_nodes(cache, args):
        passed, failed, unresolvable = filter_nodes(cache.state, args, kept)
    metrics.filtered.labels("passed").inc(len(passed))
    metrics.filtered.labels("failed").inc(len(failed))
    metrics.filtered.labels("unresolvable").inc(len(unresolvable))
    return wire.filter_result(args, passed, failed, unresolvable)


def _prioritize(cache: ClusterCache, kept: FilterScores, body: bytes) -> Any:
    args = wire.extender_args(body)
    with _reading_sent_nodes(cache, args):
        scores = prioritize_nodes(cache.state, args, kept)
    return wire.host_priorities(scores)


def _reading_sent_nodes(
    cache: ClusterCache, args: wire.ExtenderArgs
) -> AbstractContextManager[Any]:
    """The cache's lock when kube-scheduler sent node objects (`nodeCacheCapable: false`): a
    node the cache does not know is built from them and the pod tables the watch threads change
    under that lock (unlocked, a change mid-walk failed the request with a 500). Without them
    the verbs read only the nodes' states, which are replaced, never edited: no lock."""
    return cache.lock if args.nodes is not None else nullcontext()


def _preempt(cache: ClusterCache, body: bytes) -> Any:
    args = wire.preemption_args(body)
    # It rebuilds nodes from the pod tables the watch threads change: under their lock, as a
    # bind's choice is (unlocked, a change mid-walk failed the request with a 500).
    with cache.lock:
        kept = preempt_nodes(cache.state, args)
    return wire.preemption_result(args, kept)


def _answer(
    metrics: Metrics, verb: str, compute: Callable[[], Any], started: float | None = None
) -> Reply:
    """`compute()`'s answer (a 400 for a bad body, a 500 for a bug), counted and timed from
    `started` (now if not given)."""
    started = time.perf_counter() if started is None else started
    try:
        reply = Reply(200, wire.encode(compute()))
    except wire.WireError as err:
        reply = Reply(400, wire.encode({"Error": f"bad {verb} request: {err}"}))
    except Exception as err:
        log.exception("%s failed", verb)
        reply = Reply(500, wire.encode({"Error": f"{verb} failed inside the extender: {err}"}))
    metrics.answered(verb, reply.status, time.perf_counter() - started)
    return reply
