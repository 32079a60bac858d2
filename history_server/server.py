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

import argparse
import asyncio
import contextlib
import logging
import signal
import ssl
from pathlib import Path
from typing import Any

from tjpipe.exits import UsageError

log = logging.getLogger("history_server")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The server's own flags; the logging, NATS and Kubernetes ones are the other commands' (``cli``)."""
    from tjpipe.settings import env_flag, env_list_flag

    env_flag(
        parser,
        "--listen",
        env="TJPIPE_HISTORY_LISTEN",
        default="127.0.0.1:8080",
        help="HOST:PORT to serve the UI and the API on (default 127.0.0.1:8080)",
    )
    env_flag(parser, "--tls-cert", env="TJPIPE_HISTORY_TLS_CERT", help="serve HTTPS with this certificate, PEM")
    env_flag(parser, "--tls-key", env="TJPIPE_HISTORY_TLS_KEY", help="its private key, PEM")
    env_flag(
        parser,
        "--auth-cache-seconds",
        env="TJPIPE_HISTORY_AUTH_CACHE_SECONDS",
        default=10.0,
        type=float,
        help="how long a TokenReview or SubjectAccessReview answer is reused (default 10)",
    )
    env_flag(
        parser,
        "--refresh-seconds",
        env="TJPIPE_HISTORY_REFRESH_SECONDS",
        default=2.0,
        type=float,
        help="how often the TrainJob index reads what arrived on the streams (default 2)",
    )
    env_flag(
        parser,
        "--stalled-after",
        env="TJPIPE_HISTORY_STALLED_AFTER_SECONDS",
        default=600.0,
        type=float,
        help="seconds without a training progress update after which a Running TrainJob is listed as stalled "
        "(default 600; 0: never)",
    )
    env_flag(
        parser,
        "--fleet-clusters",
        env="TJPIPE_HISTORY_FLEET_CLUSTERS",
        default="",
        help="serve a fleet's history at its hub: a YAML file naming each member cluster (name, its API "
        "server and CA, and a credential there that may create TokenReviews and SubjectAccessReviews); "
        "unset: this cluster's history",
    )
    env_flag(
        parser,
        "--retention-policy",
        env="TJPIPE_HISTORY_RETENTION_POLICY",
        default="",
        help="a YAML file (mounted from a ConfigMap): how long each namespace's history is kept after a TrainJob "
        "ended, and how many ended TrainJobs; read again when it changes; unset: the streams' own limits only",
    )
    env_flag(
        parser,
        "--retention-creds",
        env="TJPIPE_HISTORY_RETENTION_CREDS",
        default="",
        help="the history-keeper NATS identity's seed, which may purge the record streams: what removes the "
        "history the retention policy expires (needed with --retention-policy)",
    )
    env_flag(
        parser,
        "--logs-creds",
        env="TJPIPE_HISTORY_LOGS_CREDS",
        default="",
        help="the log-keeper NATS identity's seed: with it the server keeps TrainJobs' pod logs in the logs "
        "bucket when they finish or when a page asks (its ServiceAccount then needs pods list, pods/log get and "
        "jobsets get); unset: it serves the logs kept, and keeps none",
    )
    env_list_flag(
        parser,
        "--scrape",
        env="TJPIPE_HISTORY_SCRAPE",
        help="a service's /metrics URL to count refused publishes from (repeatable)",
    )


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    return host.strip("[]") or "0.0.0.0", int(port)


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    if not args.tls_cert and not args.tls_key:
        return None
    if not (args.tls_cert and args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"--tls-cert/--tls-key: {exc}") from None
    return context


def run(args: argparse.Namespace) -> int:
    from history_server.fleet import load_fleet_clusters
    from plumbing.runner import configure_logging

    listen = parse_listen(args.listen)
    tls = _tls(args)
    for flag in ("retention_policy", "retention_creds"):
        value = getattr(args, flag)
        if value and not Path(value).expanduser().is_file():
            raise UsageError(f"--{flag.replace('_', '-')} {value}: no such file")
    args.fleet = load_fleet_clusters(args.fleet_clusters) if args.fleet_clusters else ()
    json_logs = {"json": True, "text": False}.get(args.log_format)
    configure_logging(args.log_level, json_logs=json_logs)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # our own request log names no token
    try:
        asyncio.run(serve(args, listen, tls))
    except KeyboardInterrupt:
        return 130
    return 0


async def serve(args: argparse.Namespace, listen: tuple[str, int], tls: ssl.SSLContext | None) -> None:
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
    members = getattr(args, "fleet", ())
    if args.retention_policy and (members or not args.retention_creds):
        raise UsageError(
            "--retention-policy needs --retention-creds (the history-keeper identity), on one cluster's server"
        )
    creator = None
    if members:
        from tjpipe.fleet_nats import HUB_READER

        nc = await connect_nats(args, "history-server", identity=HUB_READER)
        kubes = {m.name: KubeClient(m.credentials().load()) for m in members}
    else:
        nc = await connect_nats(args, "history-server", identity="reader")
        config = KubeConfig.load(args.kubeconfig, context=args.context)
        kubes = {"": KubeClient(config)}
        creator = Creator.of(config)
    session = aiohttp.ClientSession()
    backend = Backend(
        js=nc.jetstream(),
        index=HistoryIndex(),
        authorizer=ClusterAuthorizer(KubePoster(kubes[next(iter(kubes))]), ttl=args.auth_cache_seconds),
        session=session,
        scrape=tuple(args.scrape or ()),
        stalled_after=max(0.0, args.stalled_after),
        creator=creator,
    )
    keeper = None
    if args.retention_policy:
        keeper = await connect_nats(
            argparse.Namespace(**{**vars(args), "nats_creds": args.retention_creds}),
            "history-keeper",
            identity="history-keeper",
        )
        try:
            backend.retention = load_retention(args.retention_policy, keeper, backend.js)
        except (OSError, BadPolicy) as exc:
            await keeper.close()
            await nc.close()
            raise UsageError(f"--retention-policy {args.retention_policy}: {exc}") from None
    if members:
        fleet_scopes(backend, kubes, ttl=args.auth_cache_seconds)
    writer = None
    if not members:
        from history_server.capture import LogKeeper

        if args.logs_creds:
            from tjpipe.credentials import LOG_KEEPER

            keeper_args = argparse.Namespace(**{**vars(args), "nats_creds": args.logs_creds})
            writer = await connect_nats(keeper_args, "history-server-logs", identity=LOG_KEEPER)
        backend.logs = LogKeeper(
            kube=kubes[""] if writer is not None else None,
            reader=backend.js,
            writer=writer.jetstream() if writer is not None else None,
        )
    runner = web.AppRunner(make_app(backend), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, listen[0], listen[1], ssl_context=tls)
    await site.start()
    scheme = "https" if tls else "http"
    log.info("history server on %s://%s:%d", scheme, *listen)
    refresher = asyncio.create_task(keep_current(backend, stop, every=args.refresh_seconds))
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
