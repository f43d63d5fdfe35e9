"""`socketserver` servers (the node layer's status server, the tests' harness): a failed request
is said in the log, never printed on stderr.

`socketserver`'s own `handle_error` prints the traceback on stderr from the request's thread.
In a daemon, a scrape or probe that times out would leave a traceback a user must decode; in the
test process, pytest's capture switching while that thread prints lets the first line reach the
terminal alone (the rest captured and dropped). A client gone mid-request is one debug line;
anything else is an error with its traceback, in the log.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

log = logging.getLogger(__name__)


class QuietErrors:
    """Mix into a `socketserver` server, before it: `handle_error` logs instead of printing.
    `failed_what` names the server's requests in the log."""

    failed_what = "request"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Say in the log why a request failed (the exception being handled)."""
        err = sys.exc_info()[1]
        who = ":".join(str(part) for part in tuple(client_address)[:2])
        if isinstance(err, ConnectionError | TimeoutError):
            log.debug("%s client %s went away mid-request (%s)", self.failed_what, who,
                      type(err).__name__)  # fmt: skip
        else:
            log.error("%s from %s failed: %s", self.failed_what, who, err, exc_info=err)
