"""Domain errors of the device plugin; `server.py` maps each to one gRPC status."""

from __future__ import annotations


class DevicePluginError(Exception):
    """Base class; the message is a sentence a user can act on."""


class ApiUnavailableError(DevicePluginError):
    """The Kubernetes API server could not be reached or did not answer in time."""


class ConflictError(DevicePluginError):
    """The pod changed since it was read (resourceVersion precondition failed)."""


class NoWaitingPodError(DevicePluginError):
    """No pod on this node waits for the devices being allocated."""
