"""Domain errors of the device plugin (the API server's answers, the kubelet's sockets)."""

from __future__ import annotations


class DevicePluginError(Exception):
    """Base class; the message is a sentence a user can act on."""


class ApiUnavailableError(DevicePluginError):
    """The Kubernetes API server could not be reached or did not answer in time."""


class ConflictError(DevicePluginError):
    """The pod changed since it was read (resourceVersion precondition failed)."""


class DevicePluginStartError(DevicePluginError):
    """Something the plugin needs at start (a port, its socket's directory) is unusable."""
