"""Every `socketserver` server of the project and its harness says a failed request in the log.

`socketserver`'s default `handle_error` prints the traceback on stderr from the request's
thread: in a daemon, a scrape or probe that times out leaves a traceback a user must decode; in
the test process, pytest's capture switching while that thread prints lets the first line reach
the terminal alone (the rest captured and dropped): a stray `Traceback (most recent call last):`
with no story.
"""

from __future__ import annotations

import ast

from tests.test_layout import PACKAGES, ROOT

SCANNED = (*PACKAGES, "tests")
SERVERS = {
    "TCPServer", "ThreadingTCPServer", "UnixStreamServer", "ThreadingUnixStreamServer",
    "HTTPServer", "ThreadingHTTPServer", "UDPServer", "ThreadingUDPServer",
}  # fmt: skip
QUIET = {"QuietErrors"}
"""Mixins that supply `handle_error` (`baton.contract.quiet`)."""


def _base_names(node: ast.ClassDef) -> set[str]:
    names = set()
    for base in node.bases:
        if isinstance(base, ast.Name):
            names.add(base.id)
        elif isinstance(base, ast.Attribute):
            names.add(base.attr)
    return names


def printing_servers(source: str, where: str) -> list[str]:
    """Classes in `source` built directly on a `socketserver` server that keep its printing
    `handle_error`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = _base_names(node)
        if not bases & SERVERS or bases & QUIET:
            continue
        own = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        if "handle_error" not in own:
            found.append(f"{where}: {node.name}")
    return found


def test_no_server_prints_a_failed_request_on_stderr() -> None:
    found = []
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += printing_servers(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, f"socketserver servers that print tracebacks on stderr: {found}"


def test_the_check_sees_a_server_left_printing() -> None:
    source = "from http.server import ThreadingHTTPServer\nclass S(ThreadingHTTPServer):\n  pass\n"
    assert printing_servers(source, "x.py") == ["x.py: S"]
    quiet = "class S(QuietErrors, ThreadingHTTPServer):\n  pass\n"
    assert printing_servers(quiet, "x.py") == []
