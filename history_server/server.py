"""The process: connect to the bus as a read-only identity, keep the index current, serve until a signal.

The index is caught up before the server calls itself ready, then again every ``--refresh-seconds``; a
failed catch-up (NATS away for a moment) is logged and tried again on the next tick, with what the index
already holds still served. The server's own Kubernetes credentials are used for nothing but TokenReviews
and SubjectAccessReviews, which is all its RBAC allows.

At a fleet's hub (``--fleet-clusters FILE``) it connects to the hub's NATS as ``fleet-reader`` and reads
the fleet streams; each member cluster in the file has its own API server and reviewer credential, and the
server's own Kubernetes flags are not used (``history_server.fleet``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import ssl
from typing import TYPE_CHECKING, Any

from history_server.settings import HistoryServerSettings, listen_address
from tjpipe.exits import UsageError

if TYPE_CHECKING:
    from history_server.fleet import MemberCluster

log = logging.getLogger("history_server")


def _tls(settings: HistoryServerSettings) -> ssl.SSLContext | None:
    if not settings.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"--tls-cert/--tls-key: {exc}") from None
    return context


def run(settings: HistoryServerSettings) -> int:
    """Serve until SIGINT or SIGTERM, with ``settings`` as ``tjpipe.settings.history_server`` checked them."""
    from history_server.fleet import load_fleet_clusters
    from plumbing.runner import configure_logging

    tls = _tls(settings)
    fleet = load_fleet_clusters(settings.fleet_clusters) if settings.fleet_clusters else ()
    configure_logging(settings.log_level, json_logs=settings.json_logs)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # our own request log names no token
    try:
        asyncio.run(serve(settings, fleet, tls))
    except KeyboardInterrupt:
        return 130
    return 0


async def serve(
    settings: HistoryServerSettings, members: tuple[MemberCluster, ...], tls: ssl.SSLContext | None
) -> None:
    import aiohttp
    from aiohttp import web

    from history_server.access import ClusterAuthorizer, KubePoster
    from history_server.app import Backend, make_app
    from history_server.index import HistoryIndex
    from history_server.rerun import Creator
    from history_server.retention import BadPolicy, load_retention
    from plumbing.kube import KubeClient, KubeConfig
    from tjpipe.nats_connection import connect_nats

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    creator = None
    if members:
        from tjpipe.fleet_nats import HUB_READER

        nc = await connect_nats(settings, "history-server", identity=HUB_READER)
        kubes = {m.name: KubeClient(m.credentials().load()) for m in members}
    else:
        nc = await connect_nats(settings, "history-server", identity="reader")
        config = KubeConfig.load(settings.kubeconfig, context=settings.kube_context)
        kubes = {"": KubeClient(config)}
        creator = Creator.of(config)
    session = aiohttp.ClientSession()
    backend = Backend(
        js=nc.jetstream(),
        index=HistoryIndex(),
        authorizer=ClusterAuthorizer(KubePoster(kubes[next(iter(kubes))]), ttl=settings.auth_cache_seconds),
        session=session,
        scrape=settings.scrape,
        stalled_after=settings.stalled_after,
        creator=creator,
    )
    keeper = None
    if settings.retention_policy:
        keeper = await connect_nats(
            dataclasses.replace(settings, nats_creds=settings.retention_creds),
            "history-keeper",
            identity="history-keeper",
        )
        try:
            backend.retention = load_retention(settings.retention_policy, keeper, backend.js)
        except (OSError, BadPolicy) as exc:
            await keeper.close()
            await nc.close()
            raise UsageError(f"--retention-policy {settings.retention_policy}: {exc}") from None
    if members:
        fleet_scopes(backend, kubes, ttl=settings.auth_cache_seconds)
    writer = None
    if not members:
        from history_server.capture import LogKeeper

        if settings.logs_creds:
            from tjpipe.credentials import LOG_KEEPER

            as_keeper = dataclasses.replace(settings, nats_creds=settings.logs_creds)
            writer = await connect_nats(as_keeper, "history-server-logs", identity=LOG_KEEPER)
        backend.logs = LogKeeper(
            kube=kubes[""] if writer is not None else None,
            reader=backend.js,
            writer=writer.jetstream() if writer is not None else None,
        )
    runner = web.AppRunner(make_app(backend), access_log=None, handle_signals=False)
    await runner.setup()
    listen = listen_address(settings.listen)
    site = web.TCPSite(runner, *listen, ssl_context=tls)
    await site.start()
    scheme = "https" if tls else "http"
    log.info("history server on %s://%s:%d", scheme, *listen)
    refresher = asyncio.create_task(keep_current(backend, stop, every=settings.refresh_seconds))
    try:
        await stop.wait()
    finally:
        refresher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await refresher
        await runner.cleanup()
        await session.close()
        for kube in kubes.values():
            await kube.close()
        if keeper is not None:
            await keeper.close()
        if writer is not None:
            await writer.close()
        await nc.close()


def fleet_scopes(backend: Any, kubes: dict[str, Any], *, ttl: float) -> None:
    """Each member cluster's scope: its own authorizer (its API server, its reviewer, its own cache) and its
    part of one ``FleetIndex``; the backend then answers under ``/api/v1/clusters/{cluster}``."""
    from history_server.access import ClusterAuthorizer, KubePoster
    from history_server.app import Scope
    from history_server.fleet import FleetIndex
    from tjpipe.history_tools import Records

    index = FleetIndex(tuple(kubes))
    backend.index = index
    backend.clusters = {
        name: Scope(
            cluster=name,
            authorizer=ClusterAuthorizer(KubePoster(kube), ttl=ttl),
            index=index.clusters[name],
            records=Records(cluster=name),
        )
        for name, kube in kubes.items()
    }


async def keep_current(backend: Any, stop: asyncio.Event, *, every: float) -> None:
    """Catch the index up now and every ``every`` seconds; ready after the first complete pass. With a
    retention policy, each pass then removes what expired: the stores' ends are taken before the index reads
    on, so nothing that arrives meanwhile is removed (``history_server.retention``)."""
    import time

    while not stop.is_set():
        try:
            bounds = await backend.retention.bounds() if backend.retention is not None else None
            read = await backend.index.catch_up(backend.js)
            if bounds is not None:
                await backend.retention.sweep(backend.index, bounds, time.time())
        except Exception as exc:  # the bus away for a moment: serve what is known, try again next tick
            log.warning("could not read the streams: %s: %s", type(exc).__name__, exc)
        else:
            if backend.logs is not None:
                backend.logs.notice(backend.index.summaries())
            if not backend.ready:
                log.info("history index ready: %d TrainJob(s)", len(backend.index))
            elif read:
                log.debug("history index: %d new message(s), %d TrainJob(s)", read, len(backend.index))
            backend.ready = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every)
