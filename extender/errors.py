"""Errors from the API server, as the extender's modules raise and report them."""

from __future__ import annotations


class ApiFailure(Exception):
    """The API server refused or could not be reached; the message says which and why."""


class ApiConflict(ApiFailure):
    """The object changed since we read it (HTTP 409)."""


class ApiUnsure(ApiFailure):
    """The request was sent and no answer came: the API server may have carried it out."""
