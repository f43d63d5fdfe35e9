"""The verbs' request bodies as JSON Schema, and the OpenAPI document that carries them.

The verbs read their raw bodies (`extender.wire` parses them, accepting any key case as Go
does); these schemas describe what kube-scheduler sends, with its exact PascalCase keys and
nulls, so that the schema documents the bodies and tools that generate requests from it
(schemathesis) send real-shaped ones. Nothing here validates a request.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


QUANTITY: Schema = {
    "anyOf": [
        {"type": "string", "pattern": "^[0-9]{1,7}(\\.[0-9]{1,3})?(Ki|Mi|Gi|Ti|k|M|G|m)?$"},
        {"type": "string", "maxLength": 12},
    ]
}
"""A resource quantity (`"1"`, `"20480"`, `"64Gi"`), or any short string, as a user may write."""

RESOURCES: Schema = {
    "type": "object",
    "properties": {
        "limits": {"type": "object", "additionalProperties": QUANTITY},
        "requests": {"type": "object", "additionalProperties": QUANTITY},
    },
}

OBJECT_META: Schema = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "namespace": {"type": "string", "minLength": 1, "maxLength": 40},
        "uid": {"type": "string", "minLength": 1, "maxLength": 40},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}

POD: Schema = {
    "type": "object",
    "description": "a core/v1 Pod (camelCase, as the API server serves it); fields Baton reads",
    "required": ["metadata", "spec"],
    "properties": {
        "metadata": OBJECT_META,
        "spec": {
            "type": "object",
            "required": ["containers"],
            "properties": {
                "nodeName": {"type": "string"},
                "containers": {
                    "type": "array",
                    "maxItems": 3,
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "resources": RESOURCES,
                        },
                    },
                },
            },
        },
    },
}

NODE_LIST: Schema = {
    "type": "object",
    "description": "a core/v1 NodeList, sent when the extender is not node-cache-capable",
    "properties": {
        "items": {
            "type": "array",
            "maxItems": 4,
            "items": {"type": "object", "properties": {"metadata": OBJECT_META}},
        }
    },
}

NODE_NAMES: Schema = {"type": "array", "maxItems": 6, "items": {"type": "string", "maxLength": 20}}

EXTENDER_ARGS: Schema = {
    "title": "ExtenderArgs",
    "type": "object",
    "required": ["Pod", "Nodes", "NodeNames"],
    "properties": {
        "Pod": POD,
        "Nodes": _nullable(NODE_LIST),
        "NodeNames": _nullable(NODE_NAMES),
    },
}

EXTENDER_BINDING_ARGS: Schema = {
    "title": "ExtenderBindingArgs",
    "type": "object",
    "required": ["PodName", "PodNamespace", "PodUID", "Node"],
    "properties": {
        "PodName": {"type": "string"},
        "PodNamespace": {"type": "string"},
        "PodUID": {"type": "string"},
        "Node": {"type": "string"},
    },
}

META_VICTIMS: Schema = {
    "type": "object",
    "properties": {
        "Pods": _nullable(
            {
                "type": "array",
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "required": ["UID"],
                    "properties": {"UID": {"type": "string"}},
                },
            }
        ),
        "NumPDBViolations": {"type": "integer", "format": "int64"},
    },
}

VICTIMS: Schema = {
    "type": "object",
    "properties": {
        "Pods": _nullable({"type": "array", "maxItems": 3, "items": POD}),
        "NumPDBViolations": {"type": "integer", "format": "int64"},
    },
}

EXTENDER_PREEMPTION_ARGS: Schema = {
    "title": "ExtenderPreemptionArgs",
    "type": "object",
    "required": ["Pod", "NodeNameToVictims", "NodeNameToMetaVictims"],
    "properties": {
        "Pod": POD,
        "NodeNameToVictims": _nullable(
            {"type": "object", "maxProperties": 3, "additionalProperties": VICTIMS}
        ),
        "NodeNameToMetaVictims": _nullable(
            {"type": "object", "maxProperties": 3, "additionalProperties": META_VICTIMS}
        ),
    },
}


def _post(summary: str, schema: Schema) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": {
                "200": {"description": "the verb's answer (its Error field says when it failed)"},
                "400": {"description": "the body is not what kube-scheduler sends"},
            },
        }
    }


def _get(summary: str, content_type: str) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "responses": {"200": {"description": summary, "content": {content_type: {}}}},
        }
    }


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the extender's routes, served at `/openapi.json`."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "Baton scheduler extender", "version": "1"},
        "paths": {
            "/filter": _post("the nodes where the pod fits", EXTENDER_ARGS),
            "/prioritize": _post("a 0-10 score per node", EXTENDER_ARGS),
            "/preempt": _post(
                "the candidate nodes where eviction frees a GPU", EXTENDER_PREEMPTION_ARGS
            ),
            "/bind": _post("bind the pod with its GPUs", EXTENDER_BINDING_ARGS),
            "/healthz": _get("the process serves", "text/plain"),
            "/readyz": _get("the cluster cache has synced", "text/plain"),
            "/metrics": _get("Prometheus metrics", "text/plain"),
            "/v1/inventory": _get("every node's GPUs and tenants", "application/json"),
        },
    }
