"""A Binding in the Kubernetes protobuf wire form, the form kube-scheduler binds pods in.

kube-apiserver decodes a JSON Binding with its strict JSON decoder, a visible share of its CPU
per bind, which the protobuf form skips. The extender writes only this one object, so it
encodes it here rather than carrying Kubernetes' generated protobuf code. Answers are still
asked for in JSON (`Accept`), so a refusal's Status reads as usual.

The wire form (k8s.io/apimachinery runtime/serializer/protobuf): the 4 bytes `k8s\\0`, then a
`runtime.Unknown` {1: typeMeta {1: apiVersion, 2: kind}, 2: raw} whose raw is the
`v1.Binding` {1: metadata (ObjectMeta {1: name, 3: namespace, 5: uid, 6: resourceVersion,
12: annotations as map entries {1: key, 2: value}}), 2: target (ObjectReference {1: kind,
3: name, 5: apiVersion})}.
"""

from __future__ import annotations

from collections.abc import Mapping

CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"


def binding(
    namespace: str,
    name: str,
    node: str,
    uid: str = "",
    resource_version: str = "",
    annotations: Mapping[str, str] | None = None,
) -> bytes:
    """The Binding of pod `namespace/name` to `node`, with the preconditions and annotations
    kube-apiserver applies to the pod in the same write."""
    meta = _text(1, name) + _text(3, namespace)
    if uid:
        meta += _text(5, uid)
    if resource_version:
        meta += _text(6, resource_version)
    for key, value in sorted((annotations or {}).items()):
        meta += _field(12, _text(1, key) + _text(2, value))
    target = _text(1, "Node") + _text(3, node) + _text(5, "v1")
    raw = _field(1, meta) + _field(2, target)
    type_meta = _text(1, "v1") + _text(2, "Binding")
    return MAGIC + _field(1, type_meta) + _field(2, raw)


def _text(number: int, value: str) -> bytes:
    return _field(number, value.encode())


def _field(number: int, data: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
