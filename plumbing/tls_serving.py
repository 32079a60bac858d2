"""Serving HTTPS with a certificate that is renewed in place: what the admission webhook and the status server share.

Both are an aiohttp app behind a serving certificate that cert-manager (or an operator) renews on disk. One
``TlsServing`` loads the pair before anything else starts, so a missing or broken certificate stops the
process at once, then serves the app and loads each renewed pair into the live context: new handshakes use it,
open connections keep theirs, and nothing restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl

from aiohttp import web

from plumbing.observability import Health

log = logging.getLogger(__name__)


def server_ssl_context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


class CertReloader:
    """Loads a renewed serving certificate into the live TLS context (new handshakes use it, open connections
    keep theirs), so that cert-manager's renewal needs no restart. A pair caught half-written fails to load
    and is simply tried again at the next check."""

    def __init__(self, context: ssl.SSLContext, cert: str, key: str) -> None:
        self.context, self.cert, self.key = context, cert, key
        self._seen = self._stamp()

    def _stamp(self) -> tuple[float, float]:
        try:
            return (os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime)
        except OSError:
            return (0.0, 0.0)

    def check(self) -> bool:
        """Reload if either file changed since the last load; whether it reloaded."""
        stamp = self._stamp()
        if stamp == self._seen:
            return False
        try:
            self.context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            log.warning("serving certificate changed but does not load yet: %s", exc)
            return False
        self._seen = stamp
        log.info("serving certificate reloaded from %s", self.cert)
        return True

    async def run(self, stop: asyncio.Event, interval: float) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)
            self.check()


class TlsServing:
    """One serving certificate pair, loaded now, and the app served with it until ``stop``."""

    def __init__(self, cert: str, key: str) -> None:
        self.context = server_ssl_context(cert, key)
        self.reloader = CertReloader(self.context, cert, key)

    async def serve(
        self,
        app: web.Application,
        *,
        host: str,
        port: int,
        health: Health,
        stop: asyncio.Event,
        cert_check_seconds: float,
        serving: str,
    ) -> None:
        """Serve ``app`` on ``host:port``, start the health endpoint, log ``serving``, then check the
        certificate every ``cert_check_seconds`` until ``stop``; the app is shut down however it ends."""
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port, ssl_context=self.context).start()
            await health.start()
            log.info("%s over TLS on %s:%d", serving, host, port)
            await self.reloader.run(stop, cert_check_seconds)
        finally:
            await runner.cleanup()
