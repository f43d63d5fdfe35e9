"""The kubelet-facing gRPC services: DRAPlugin v1 (and v1beta1, for kubelets before 1.34),
DRAResourceHealth v1alpha1, Registration v1.

Each RPC is a few lines over `Preparer`, the live inventory and a registration callback; errors
go back per claim as the kubelet expects (it shows them in the pod's events).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc

from baton._pb import (
    dra_pb2,
    dra_pb2_grpc,
    drahealth_pb2,
    drahealth_pb2_grpc,
    drav1beta1_pb2,
    drav1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from baton.contract import names
from dra.prepare import PrepareError, Preparer
from dra.record import PreparedClaim
from nodegpu.health import UNKNOWN
from nodegpu.inventory import Inventory
from nodegpu.state import LiveInventory

log = logging.getLogger(__name__)
PLUGIN_TYPE = "DRAPlugin"
VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth")
"""What GetInfo offers; a kubelet takes the newest DRAPlugin version it knows."""
HEALTH_WAIT_S = 1.0
"""How often a health stream re-checks that its client and the server are still there."""
HEALTH_TIMEOUT_S = 30
"""How long the kubelet trusts a device's report (sent with it): past it, without a newer one,
the kubelet shows the device's health as Unknown in the pod's status."""
HEALTH_RESEND_S = 10.0
"""Every device's health is sent again this often, changed or not, well within the timeout."""
BATCH_BUDGET_S = 40.0
"""The longest a NodePrepareResources call takes: the kubelet gives it 45 s (its
PluginClientTimeout) and its claims are read from the API server at once, each read bounded
by the API client's 10 s, so each claim answers with its own reason within it."""
ANSWER_MARGIN_S = 1.0
"""How long before the call's own deadline its answer is sent."""
PREPARE_WORKERS = 8
"""How many claims of one call are prepared at once."""


class DraPluginService(dra_pb2_grpc.DRAPluginServicer):
    """NodePrepareResources / NodeUnprepareResources over a Preparer."""

    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    def NodePrepareResources(
        self, request: dra_pb2.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_pb2.NodePrepareResourcesResponse:
        """The claims prepared at once (each may wait on the API server), answered within the
        call's deadline: a claim not prepared by then says so, and goes on being prepared (the
        kubelet's retry is answered from the record) if it began; one that had not begun is
        not prepared later (the kubelet, told it failed, may unprepare it meanwhile, and a
        late prepare would leave its record and CDI spec behind for good)."""
        claims = list(request.claims)
        if not claims:
            return dra_pb2.NodePrepareResourcesResponse()
        left = context.time_remaining()
        budget = BATCH_BUDGET_S if left is None else min(BATCH_BUDGET_S, left - ANSWER_MARGIN_S)
        pool = futures.ThreadPoolExecutor(
            max_workers=min(len(claims), PREPARE_WORKERS), thread_name_prefix="dra-prepare"
        )
        started = {c.uid: pool.submit(self._prepare, c) for c in claims}
        pool.shutdown(wait=False)
        futures.wait(started.values(), timeout=max(budget, 0.0))
        answers = {}
        for claim in claims:
            done = started[claim.uid]
            if done.done():
                answers[claim.uid] = done.result()
                continue
            why = f"claim {claim.namespace}/{claim.name}: not prepared within {budget:.0f} s"
            log.error("cannot prepare claim %s/%s: %s", claim.namespace, claim.name, why)
            still = "not begun; a retry prepares it" if done.cancel() else "still at it"
            answers[claim.uid] = dra_pb2.NodePrepareResourceResponse(
                error=f"{names.DRA_DRIVER}: {why} ({still}; the API server may not be answering)"
            )
        return dra_pb2.NodePrepareResourcesResponse(claims=answers)

    def _prepare(self, claim: dra_pb2.Claim) -> dra_pb2.NodePrepareResourceResponse:
        """One claim's answer: its devices, or its error."""
        try:
            prepared = self.preparer.prepare(claim.namespace, claim.uid, claim.name)
        except (PrepareError, OSError) as err:
            log.error("cannot prepare claim %s/%s: %s", claim.namespace, claim.name, err)
            return dra_pb2.NodePrepareResourceResponse(error=f"{names.DRA_DRIVER}: {err}")
        return dra_pb2.NodePrepareResourceResponse(devices=_devices(prepared))

    def NodeUnprepareResources(
        self, request: dra_pb2.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_pb2.NodeUnprepareResourcesResponse:
        answers = {}
        for claim in request.claims:
            try:
                self.preparer.unprepare(claim.namespace, claim.uid, claim.name)
                answers[claim.uid] = dra_pb2.NodeUnprepareResourceResponse()
            except PrepareError as err:
                log.error("cannot unprepare claim %s/%s: %s", claim.namespace, claim.name, err)
                answers[claim.uid] = dra_pb2.NodeUnprepareResourceResponse(
                    error=f"{names.DRA_DRIVER}: {err}"
                )
        return dra_pb2.NodeUnprepareResourcesResponse(claims=answers)


class DraPluginV1beta1Service(drav1beta1_pb2_grpc.DRAPluginServicer):
    """The same two RPCs for kubelets that speak v1beta1 (before 1.34).

    v1beta1's messages are v1's without `Device.share_id`, field for field, so each call is
    read as v1's, answered by `DraPluginService`, and written back without the share."""

    def __init__(self, v1: DraPluginService) -> None:
        self.v1 = v1

    def NodePrepareResources(
        self, request: drav1beta1_pb2.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> drav1beta1_pb2.NodePrepareResourcesResponse:
        asked = dra_pb2.NodePrepareResourcesRequest.FromString(request.SerializeToString())
        answer = self.v1.NodePrepareResources(asked, context)
        for claim in answer.claims.values():
            for device in claim.devices:
                device.ClearField("share_id")
        return drav1beta1_pb2.NodePrepareResourcesResponse.FromString(answer.SerializeToString())

    def NodeUnprepareResources(
        self, request: drav1beta1_pb2.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> drav1beta1_pb2.NodeUnprepareResourcesResponse:
        asked = dra_pb2.NodeUnprepareResourcesRequest.FromString(request.SerializeToString())
        answer = self.v1.NodeUnprepareResources(asked, context)
        return drav1beta1_pb2.NodeUnprepareResourcesResponse.FromString(answer.SerializeToString())


def _devices(prepared: PreparedClaim) -> list[dra_pb2.Device]:
    """The claim's results as the kubelet takes them: each under its main request (a
    `firstAvailable` result is `<request>/<sub-request>`), the name containers use, which the
    kubelet matches exactly when it picks a container's CDI devices."""
    return [
        dra_pb2.Device(
            request_names=[r.split("/", 1)[0] for r in d.request_names],
            pool_name=d.pool,
            device_name=d.device,
            cdi_device_ids=list(d.cdi_ids),
            share_id=d.share_id,
        )
        for d in prepared.devices
    ]


def health_report(
    pool: str, inventory: Inventory, now_s: int
) -> drahealth_pb2.NodeWatchResourcesResponse:
    """Every device's health as the kubelet's health stream carries it."""
    return drahealth_pb2.NodeWatchResourcesResponse(
        devices=[
            drahealth_pb2.DeviceHealth(
                device=drahealth_pb2.DeviceIdentifier(
                    pool_name=pool, device_name=names.dra_device_name(g.index)
                ),
                health=_health(inventory.unhealthy.get(g.uuid)),
                last_updated_time=now_s,
                health_check_timeout_seconds=HEALTH_TIMEOUT_S,
                message=inventory.unhealthy.get(g.uuid, ""),
            )
            for g in sorted(inventory.gpus, key=lambda g: g.index)
        ]
    )


def _health(unhealthy: str | None) -> drahealth_pb2.HealthStatus:
    """A GPU that is not unhealthy is HEALTHY; one whose health NVML does not report (marked
    unhealthy with `nodegpu.health.UNKNOWN`, tainted all the same) is UNKNOWN, as DRA has it."""
    if unhealthy is None:
        return drahealth_pb2.HEALTHY
    return drahealth_pb2.UNKNOWN if unhealthy.startswith(UNKNOWN) else drahealth_pb2.UNHEALTHY


class HealthService(drahealth_pb2_grpc.DRAResourceHealthServicer):
    """NodeWatchResources: the health of every GPU now, after every change, and every
    `resend_s` between (the kubelet forgets a report after HEALTH_TIMEOUT_S)."""

    def __init__(
        self,
        pool: str,
        inventory: LiveInventory,
        clock: Callable[[], float] = time.time,
        ticks: Callable[[], float] = time.monotonic,
        resend_s: float = HEALTH_RESEND_S,
    ):
        """`clock` stamps the reports (Unix seconds); `ticks` times the resends."""
        self.pool = pool
        self.inventory = inventory
        self.clock = clock
        self.ticks = ticks
        self.resend_s = resend_s
        self.stopping = threading.Event()

    def NodeWatchResources(
        self, request: drahealth_pb2.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[drahealth_pb2.NodeWatchResourcesResponse]:
        version, inventory = self.inventory.snapshot()
        sent = self.ticks()
        yield health_report(self.pool, inventory, int(self.clock()))
        done = lambda: self.stopping.is_set() or not context.is_active()  # noqa: E731
        while not done():
            newer = self.inventory.wait_newer(version, done, HEALTH_WAIT_S)
            if newer is not None:
                version, inventory = newer
            elif done() or self.ticks() - sent < self.resend_s:
                continue
            sent = self.ticks()
            yield health_report(self.pool, inventory, int(self.clock()))


class RegistrationService(pluginregistration_pb2_grpc.RegistrationServicer):
    """GetInfo names the driver and its endpoint; a successful registration calls `registered`."""

    def __init__(self, endpoint: str, registered: Callable[[], None]) -> None:
        self.endpoint = endpoint
        self.registered = registered
        self.count = 0
        self.last_error = ""

    def GetInfo(
        self, request: pluginregistration_pb2.InfoRequest, context: grpc.ServicerContext
    ) -> pluginregistration_pb2.PluginInfo:
        return pluginregistration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=names.DRA_DRIVER,
            endpoint=self.endpoint,
            supported_versions=list(VERSIONS),
        )

    def NotifyRegistrationStatus(
        self, request: pluginregistration_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> pluginregistration_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            self.count += 1
            self.last_error = ""
            log.info("registered with the kubelet (registration %d)", self.count)
            self.registered()
        else:
            self.last_error = request.error
            log.error("the kubelet refused the registration: %s", request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()
