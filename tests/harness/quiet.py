"""The harness's HTTP servers (`socketserver`): errors in the log, never printed on stderr.

Tests stop servers and drop connections mid-request, so a client gone is expected. What
`socketserver` does by default, printing the traceback on stderr from the request's thread, is
worse than noise: when pytest's capture is switched while a thread prints, the first line of the
traceback reaches the terminal alone and the rest is swallowed (a stray `Traceback (most recent
call last):` with no story). A failure that is not a client gone is logged, so pytest shows it
with the test that failed.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

log = logging.getLogger(__name__)


class QuietErrors:
    """Mix into a `socketserver` server before it: `handle_error` logs instead of printing."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        err = sys.exc_info()[1]
        if isinstance(err, ConnectionError | TimeoutError):
            log.debug("client %s went away mid-request (%s)", client_address, type(err).__name__)
        else:
            log.error("request from %s failed: %s", client_address, err, exc_info=err)
