"""The extender's TLS files, loaded again when they change on disk.

Certificates are rotated where they are mounted (cert-manager renews a Secret, the kubelet swaps
the mounted files in place): an extender that read them once at start would serve an expired
certificate, and kube-scheduler would refuse every call. `TlsFiles.check` builds a new context
from changed files, and from then on each new connection's handshake switches to it (the served
context's SNI callback, which every handshake runs); connections made before keep theirs. Files
that do not load (caught half-written) are tried again at the next check, the context built
before served meanwhile. A server checks every `CHECK_EVERY_S` seconds.
"""

from __future__ import annotations

import logging
import os
import ssl

log = logging.getLogger(__name__)

CHECK_EVERY_S = 30.0
"""How often the files are looked at: well within the kubelet's secret refresh (about a minute)
and a renewed certificate's remaining life (cert-manager renews at two thirds of it)."""


def tls_context(certfile: str, keyfile: str, client_ca: str | None = None) -> ssl.SSLContext:
    """A server-side TLS context serving the certificate. With `client_ca`, it asks each
    client for a certificate: one that `client_ca` did not sign ends the handshake, and a
    client that presents none is served the routes that do not need one."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, keyfile)
    if client_ca:
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_verify_locations(cafile=client_ca)
    return context


class TlsFiles:
    """The certificate, key and client CA a server serves, as they are on disk now."""

    def __init__(self, certfile: str, keyfile: str, client_ca: str | None = None):
        self.certfile, self.keyfile, self.client_ca = certfile, keyfile, client_ca
        self._stamps = self._stat()
        self.context = tls_context(certfile, keyfile, client_ca)
        """The context the server listens with: its handshakes switch to `current`."""
        self.current = self.context
        """The context built from the files last loaded."""
        self.context.sni_callback = self._switch
        self._failing = False

    def _switch(self, connection: ssl.SSLObject, _name: str | None, _: ssl.SSLContext) -> None:
        if self.current is not self.context:
            connection.context = self.current

    def _paths(self) -> list[str]:
        return [p for p in (self.certfile, self.keyfile, self.client_ca) if p]

    def _stat(self) -> tuple[tuple[int, int, int] | None, ...]:
        stamps: list[tuple[int, int, int] | None] = []
        for path in self._paths():
            try:
                st = os.stat(path)  # (through the kubelet's ..data link: the files now mounted)
                stamps.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                stamps.append(None)
        return tuple(stamps)

    def check(self) -> bool:
        """Serve the files from the next handshake on if they changed since they were loaded;
        whether they were."""
        stamps = self._stat()
        if stamps == self._stamps:
            return False
        try:
            current = tls_context(self.certfile, self.keyfile, self.client_ca)
        except (OSError, ssl.SSLError) as err:
            if not self._failing:
                log.warning(
                    "the TLS files changed but do not load (%s); serving the ones loaded before "
                    "and trying again every %g s",
                    err,
                    CHECK_EVERY_S,
                )
            self._failing = True
            return False
        self.current, self._stamps, self._failing = current, stamps, False
        log.info("loaded the changed TLS files: %s", ", ".join(self._paths()))
        return True
