"""The webhook's serving certificate is reloaded in place: after the files change (cert-manager renews them),
the next TLS handshake presents the new certificate without a restart."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
from pathlib import Path

from aiohttp import web

from plumbing.tls_serving import CertReloader, server_ssl_context
from tjpipe.keys.pki import write_serving_pki


async def _served_certificate(port: int, ca: Path) -> bytes:
    client = ssl.create_default_context(cafile=str(ca))
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="127.0.0.1")
    transport_ssl = writer.get_extra_info("ssl_object")
    der = transport_ssl.getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    assert der is not None
    return bytes(der)


async def test_a_renewed_certificate_is_served_without_restart(tmp_path: Path) -> None:
    live, first, second = tmp_path / "live", tmp_path / "first", tmp_path / "second"
    write_serving_pki(first, ca_name="ca-1", common_name="webhook")
    write_serving_pki(second, ca_name="ca-2", common_name="webhook")
    live.mkdir()
    for name in ("tls.crt", "tls.key"):
        shutil.copy(first / name, live / name)
    context = server_ssl_context(str(live / "tls.crt"), str(live / "tls.key"))
    reloader = CertReloader(context, str(live / "tls.crt"), str(live / "tls.key"))
    runner = web.AppRunner(web.Application())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        before = await _served_certificate(port, first / "ca.crt")
        assert reloader.check() is False  # nothing changed yet
        for name in ("tls.crt", "tls.key"):
            shutil.copy(second / name, live / name)
        # Whatever the file system's timestamp resolution: the renewal is visibly newer.
        later = (live / "tls.crt").stat().st_mtime + 10
        os.utime(live / "tls.crt", (later, later))
        assert reloader.check() is True
        after = await _served_certificate(port, second / "ca.crt")
        assert after != before
    finally:
        await runner.cleanup()
