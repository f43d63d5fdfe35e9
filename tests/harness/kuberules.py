"""What the fake API server serves and refuses as the real one does: its resources, the `Status`
errors it answers with, and the checks an update and a binding must pass."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

KINDS = {"pods": "Pod", "nodes": "Node", "events": "Event", "configmaps": "ConfigMap"}
NAMESPACED = frozenset({"pods", "events", "configmaps"})
RESOURCE_OF_KIND = {kind: resource for resource, kind in KINDS.items()}
REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
CONFLICT_MESSAGE = (
    "the object has been modified; please apply your changes to the latest version and try again"
)
SYSTEM_FIELDS = ("creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds")
# Pod spec fields an update may change; every other spec change is rejected like the real server.
MUTABLE_POD_SPEC = frozenset({"activeDeadlineSeconds", "tolerations", "schedulingGates"})


class ApiError(Exception):
    """An error the API server answers with a `Status` body."""

    def __init__(self, code: int, message: str, reason: str | None = None, **details: str):
        super().__init__(message)
        self.code, self.message, self.details = code, message, details
        self.reason = reason or REASONS.get(code, "Unknown")

    def status(self) -> Obj:
        """The `Status` object the real server sends for this error."""
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = dict(self.details)
        return body


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(404, f'{resource} "{name}" not found', name=name, kind=resource)


def conflict(resource: str, name: str, why: str = CONFLICT_MESSAGE) -> ApiError:
    message = f'Operation cannot be fulfilled on {resource} "{name}": {why}'
    return ApiError(409, message, name=name, kind=resource)


def check_update(resource: str, old: Obj, new: Obj) -> None:
    """Refuse an update as the real server does; give `new` the stored system fields."""
    name = old["metadata"]["name"]
    rv = new.get("metadata", {}).get("resourceVersion")
    if rv is not None and rv != old["metadata"]["resourceVersion"]:
        raise conflict(resource, name)
    meta = new.setdefault("metadata", {})
    meta["resourceVersion"] = old["metadata"]["resourceVersion"]
    # System fields keep their stored values, as the real server's update strategy does.
    for field in SYSTEM_FIELDS:
        meta.pop(field, None)
        if field in old["metadata"]:
            meta[field] = old["metadata"][field]
    for field in ("name", "namespace", "uid"):
        if new["metadata"].get(field) != old["metadata"].get(field):
            raise ApiError(
                422,
                f'{KINDS[resource]} "{name}" is invalid: metadata.{field}:'
                " Invalid value: field is immutable",
            )
    if resource == "pods":
        before = {k: v for k, v in old.get("spec", {}).items() if k not in MUTABLE_POD_SPEC}
        after = {k: v for k, v in new.get("spec", {}).items() if k not in MUTABLE_POD_SPEC}
        if before != after:
            raise ApiError(
                422,
                f'Pod "{name}" is invalid: spec: Forbidden: pod updates may'
                " not change fields other than `spec.containers[*].image`,"
                "`spec.activeDeadlineSeconds`,`spec.tolerations`",
            )


def binding_target(name: str, binding: Any) -> str:
    """The node a pods/binding body names; 400 for a body the real server refuses."""
    if not isinstance(binding, dict):
        raise ApiError(400, "the body of the request is not a Binding object")
    meta = binding.get("metadata") or {}
    if meta.get("name", name) != name:
        raise ApiError(400, "name in URL does not match name in Binding object")
    node = (binding.get("target") or {}).get("name")
    if not node:
        raise ApiError(400, "target.name: Required value: a binding needs a target node")
    return node


def check_binding(name: str, binding: Obj, current: Obj) -> None:
    """Refuse a binding whose preconditions the stored pod fails, or of a pod already bound or
    being deleted."""
    meta = binding.get("metadata") or {}
    uid = meta.get("uid")
    if uid and uid != current["metadata"]["uid"]:
        raise conflict(
            "pods/binding",
            name,
            f"Precondition failed: UID in precondition: "
            f"{uid}, UID in object meta: {current['metadata']['uid']}",
        )
    version = meta.get("resourceVersion")
    if version and version != current["metadata"]["resourceVersion"]:
        raise conflict(
            "pods/binding",
            name,
            f"Precondition failed: ResourceVersion in precondition: {version}, "
            f"ResourceVersion in object meta: {current['metadata']['resourceVersion']}",
        )
    if current["metadata"].get("deletionTimestamp"):
        raise conflict(
            "pods/binding",
            name,
            f"pod {name} is being deleted, cannot be assigned to a host",
        )
    if current.get("spec", {}).get("nodeName"):
        assigned = current["spec"]["nodeName"]
        raise conflict("pods/binding", name, f'pod {name} is already assigned to node "{assigned}"')
