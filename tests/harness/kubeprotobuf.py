"""Reading a Binding sent in the Kubernetes protobuf wire form, as kube-apiserver does.

Independent of the extender's encoder (`extender.kubeproto`): it walks the fields by number as
the generated Go code would, so a mistake in the encoder shows as a refused or misread body.
Only what a Binding carries is read; anything else is a 415, which the real server would accept
but the stand-in does not model.
"""

from __future__ import annotations

from typing import Any

from tests.harness.kuberules import ApiError

PROTOBUF = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"
_META = {1: "name", 3: "namespace", 5: "uid", 6: "resourceVersion"}
_TARGET = {1: "kind", 2: "namespace", 3: "name", 4: "uid", 5: "apiVersion"}


def read_binding(raw: bytes) -> dict[str, Any]:
    """The Binding as the JSON form would have it."""
    if not raw.startswith(_MAGIC):
        raise ApiError(400, "protobuf body without the k8s\\0 prefix")
    try:
        unknown = _fields(raw[len(_MAGIC) :])
        type_meta = _fields(unknown[1][0])
        kind = (type_meta.get(2) or [b""])[0].decode()
        if kind != "Binding":
            raise ApiError(415, f"the stand-in reads only Bindings in protobuf, not {kind!r}")
        binding = _fields(unknown[2][0])
        meta = _fields((binding.get(1) or [b""])[0])
        target = _fields((binding.get(2) or [b""])[0])
    except (KeyError, IndexError, ValueError, UnicodeDecodeError) as err:
        raise ApiError(400, f"unreadable protobuf Binding: {err}") from None
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Binding", "metadata": {}, "target": {}}
    for number, key in _META.items():
        if number in meta:
            out["metadata"][key] = meta[number][-1].decode()
    notes = {}
    for entry in meta.get(12, []):
        pair = _fields(entry)
        notes[pair[1][0].decode()] = (pair.get(2) or [b""])[0].decode()
    if notes:
        out["metadata"]["annotations"] = notes
    for number, key in _TARGET.items():
        if number in target:
            out["target"][key] = target[number][-1].decode()
    return out


def _fields(data: bytes) -> dict[int, list[bytes]]:
    """Length-delimited fields by number (a Binding has no others)."""
    fields: dict[int, list[bytes]] = {}
    at = 0
    while at < len(data):
        tag, at = _varint(data, at)
        if tag & 7 != 2:
            raise ValueError(f"field {tag >> 3} has wire type {tag & 7}, not length-delimited")
        size, at = _varint(data, at)
        if at + size > len(data):
            raise ValueError(f"field {tag >> 3} runs past the end")
        fields.setdefault(tag >> 3, []).append(data[at : at + size])
        at += size
    return fields


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
