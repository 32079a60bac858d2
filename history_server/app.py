"""The HTTP side: the JSON API, the UI's files, and the rules every answer goes through.

Every ``/api`` answer is made in the same order: who is asking (401 without a token the API server accepts),
is the request well formed (400), may the caller read what it names (403), and only then the data. So a
caller who may not read a namespace learns nothing about it, not even whether a TrainJob of some name was
ever there, and an answer about namespace N holds only N's records: the streams are read with N and the
name in the subject filter, never a wildcard, since both are checked against Kubernetes' naming rules first.

A token is accepted in the ``Authorization`` header only, never in a query string, where proxies and access
logs would keep it; the request log names the user, never the token. The UI's files go out with a Content
Security Policy that lets the page load and call nothing but this server.

At a fleet's hub (``--fleet-clusters``) the same handlers answer under ``/api/v1/clusters/{cluster}``: the
cluster is the first thing a path names, its own API server authorizes the request
(``history_server.fleet``), its own index lists, and its records are read from the hub's fleet
streams under its name only. A single cluster's server keeps the paths without a cluster.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web

from contracts.messages import ObjectKey, component_of
from history_server import story
from history_server.access import Authorizer, Caller, Unauthenticated, Unavailable
from history_server.find import BadQuery, Query, find, query_of
from history_server.index import HistoryIndex
from tjpipe.history_tools import LOCAL, Records

if TYPE_CHECKING:
    import aiohttp
    from nats.js import JetStreamContext

    from history_server.capture import LogKeeper
    from history_server.fleet import FleetIndex
    from history_server.rerun import Creator
    from history_server.retention import Retention
    from tjpipe.history_tools import TimelineEntry

log = logging.getLogger("history_server")

API = "/api/v1"
LIST_LIMIT = 1000
TIMELINE_LIMIT = 5000
PROGRESS_LIMIT = 20000
"""Progress updates one answer holds at most, the newest: a week of one pod reporting every 30 s."""
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_STATIC = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "app.css": "text/css",
    "favicon.svg": "image/svg+xml",
    "guide.html": "text/html",
    "logs.js": "text/javascript",
}


@dataclass(frozen=True)
class Scope:
    """One cluster as a request sees it: who decides (its API server), its index, where its records are."""

    cluster: str
    """``""`` on a single cluster's server."""
    authorizer: Authorizer
    index: HistoryIndex
    records: Records = LOCAL


@dataclass
class Backend:
    """What the handlers read: the bus, the index, the authorizer, and where to find refusal counts.

    At a fleet's hub, ``clusters`` holds each member's scope (its authorizer and its part of ``index``, a
    ``FleetIndex``); ``authorizer`` is then not used."""

    js: JetStreamContext
    index: HistoryIndex | FleetIndex
    authorizer: Authorizer
    session: aiohttp.ClientSession
    scrape: tuple[str, ...] = ()
    ready: bool = False
    stalled_after: float = 600.0
    """Seconds without a progress update after which a Running TrainJob is called stalled (0: never)."""
    clusters: dict[str, Scope] = field(default_factory=dict)
    retention: Retention | None = None
    """The per-namespace retention policy and what it purges (``--retention-policy``); ``None``: the streams'
    limits only."""
    creator: Creator | None = None
    """Where Run again creates TrainJobs, with the caller's token (``None``: not offered)."""
    logs: LogKeeper | None = None
    """Reads the kept pod logs, and captures them when the server has the log-keeper identity."""

    @property
    def fleet(self) -> bool:
        return bool(self.clusters)


BACKEND = web.AppKey("backend", Backend)


def _error(status: int, message: str, **headers: str) -> web.HTTPException:
    body = json.dumps({"status": status, "error": message})
    cls: type[web.HTTPException] = {
        400: web.HTTPBadRequest,
        401: web.HTTPUnauthorized,
        403: web.HTTPForbidden,
        404: web.HTTPNotFound,
        409: web.HTTPConflict,
        415: web.HTTPUnsupportedMediaType,
        422: web.HTTPUnprocessableEntity,
        503: web.HTTPServiceUnavailable,
    }[status]
    return cls(text=body, content_type="application/json", headers=headers)


def _json(value: Any) -> web.Response:
    return web.Response(text=json.dumps(value, ensure_ascii=False, default=str), content_type="application/json")


# ----------------------------------------------------------------------------------------- middleware


@web.middleware
async def _guard(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    started = time.monotonic()
    status = 500
    try:
        if any(k.lower() in ("token", "access_token", "bearer") for k in request.query):
            raise _error(400, "send the token in the Authorization header, never in the URL")
        response = await handler(request)
        status = response.status
    except web.HTTPException as exc:
        status = exc.status
        _secure(exc, request.path)
        raise
    except Exception as exc:  # the bus did not answer in time, or a bug: said as such, logged with its traceback
        log.exception("%s %s failed", request.method, request.path)
        failed = _error(503, f"could not read the history: {type(exc).__name__}")
        status = failed.status
        _secure(failed, request.path)
        raise failed from None
    finally:
        caller = request.get("caller")
        log.info(
            "%s %s %d %.1f ms%s",
            request.method,
            request.path,
            status,
            (time.monotonic() - started) * 1000,
            f" user={caller.username}" if caller is not None else "",
        )
    _secure(response, request.path)
    return response


def _secure(response: web.StreamResponse, path: str) -> None:
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Frame-Options"] = "DENY"
    if path.startswith("/api/"):
        response.headers["Cache-Control"] = "no-store"


def _scope(request: web.Request) -> Scope:
    """The cluster the request is about: the one its path names at a fleet's hub, else the server's own."""
    backend = request.app[BACKEND]
    if not backend.fleet:
        assert isinstance(backend.index, HistoryIndex)
        return Scope(cluster="", authorizer=backend.authorizer, index=backend.index)
    cluster = request.match_info.get("cluster", "")
    found = backend.clusters.get(cluster)
    if found is None:
        raise _error(404, f"no cluster {cluster!r} in this fleet")
    return found


def _bearer(request: web.Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _error(401, "a bearer token is required (Authorization: Bearer TOKEN)", **{"WWW-Authenticate": "Bearer"})
    return token.strip()


async def _caller(request: web.Request, scope: Scope | None = None) -> Caller:
    token = _bearer(request)
    scope = scope or _scope(request)
    try:
        caller = await scope.authorizer.authenticate(token)
    except Unauthenticated:
        whose = f"cluster {scope.cluster}'s API server" if scope.cluster else "the API server"
        raise _error(401, f"{whose} does not accept this token", **{"WWW-Authenticate": "Bearer"}) from None
    except Unavailable as exc:
        raise _error(503, str(exc)) from None
    request["caller"] = caller
    return caller


async def _allowed(
    request: web.Request, caller: Caller, verb: str, namespace: str, name: str = "", scope: Scope | None = None
) -> bool:
    try:
        return await (scope or _scope(request)).authorizer.allowed(caller, verb, namespace, name)
    except Unavailable as exc:
        raise _error(503, str(exc)) from None


async def _require(
    request: web.Request, verb: str, namespace: str, name: str = "", *, well_formed: Callable[[], None] | None = None
) -> Caller:
    """Who asks (401), whether the request is well formed (400; ``well_formed`` checks the rest of it), and
    whether the caller may ``verb`` what it names (403), in that order."""
    caller = await _caller(request)
    if not _valid_namespace(namespace):
        raise _error(400, f"invalid namespace {namespace!r}")
    if name and not _valid_name(name):
        raise _error(400, f"invalid TrainJob name {name!r}")
    if well_formed is not None:
        well_formed()
    if not await _allowed(request, caller, verb, namespace, name):
        where = f"TrainJob {name!r} in namespace {namespace!r}" if name else f"TrainJobs in namespace {namespace!r}"
        raise _error(403, f"{caller.username} may not {verb} {where} (trainjobs.trainer.kubeflow.org)")
    return caller


def _valid_namespace(text: str) -> bool:
    from tjpipe.operator_commands import valid_namespace

    return valid_namespace(text)


def _valid_name(text: str) -> bool:
    from tjpipe.exits import UsageError
    from tjpipe.operator_commands import trainjob_key

    try:
        trainjob_key(f"default/{text}", None)
    except UsageError:
        return False
    return True


def _limit(request: web.Request, default: int) -> int:
    try:
        limit = int(request.query.get("limit", default))
    except ValueError:
        raise _error(400, "limit must be a whole number") from None
    if limit < 1:
        raise _error(400, "limit must be at least 1")
    return min(limit, default)


def _item(summary: Any, now: float, after: float, cluster: str) -> dict[str, Any]:
    """A TrainJob as the list and its page show it; at a fleet's hub, with its cluster first."""
    shown: dict[str, Any] = summary.to_json(now, after)
    return {"cluster": cluster, **shown} if cluster else shown


def list_answer(
    rows: Iterable[Any],
    query: Query,
    *,
    now: float,
    stalled_after: float,
    cluster_of: Callable[[Any], str] = lambda _: "",
) -> dict[str, Any]:
    """The list's answer to a query (``history_server.find``: label selector, runtime, state, time range,
    a newest-metric condition, name, sort and page) over summaries the caller may read, each of the cluster
    ``cluster_of`` names (at a fleet's hub): what the handlers run after authorization, and what
    ``bench.history_find`` times."""
    page, total = find(query, rows, cluster_of)
    return {
        "items": [_item(s, now, stalled_after, cluster_of(s)) for s in page],
        "total": total,
        "offset": query.offset,
        "limit": query.limit,
        "truncated": total > query.offset + len(page),
    }


def _query(request: web.Request) -> Query:
    """The list's query; a 400 that says which part does not parse."""
    try:
        return query_of(request.query, now=time.time(), most=LIST_LIMIT, default_limit=LIST_LIMIT)
    except BadQuery as exc:
        raise _error(400, str(exc)) from None


def _listing(
    rows: Iterable[Any], query: Query, request: web.Request, cluster_of: Callable[[Any], str]
) -> dict[str, Any]:
    stalled_after = request.app[BACKEND].stalled_after
    return list_answer(rows, query, now=time.time(), stalled_after=stalled_after, cluster_of=cluster_of)


# ------------------------------------------------------------------------------------------- handlers


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    if not backend.ready:
        return web.Response(status=503, text="the history index has not read the streams yet\n")
    if not backend.js._nc.is_connected:
        return web.Response(status=503, text="not connected to NATS\n")
    return web.Response(text="ok\n")


async def whoami(request: web.Request) -> web.Response:
    from tjpipe import about

    caller = await _caller(request)
    cluster_wide = await _allowed(request, caller, "list", "")
    return _json(
        {
            "username": caller.username,
            "groups": list(caller.groups),
            "clusterWide": cluster_wide,
            "version": about.version(),
        }
    )


async def docs(request: web.Request) -> web.Response:
    """Where the documentation for the people who read TrainJobs' history is (no token: the log-in page links
    it). The version is told only to a caller the API server accepts (``whoami``)."""
    from tjpipe import about

    return _json({"dataScientists": about.DATA_SCIENTISTS_GUIDE})


async def namespaces(request: web.Request) -> web.Response:
    """The namespaces the history knows of that the caller may list TrainJobs in."""
    caller = await _caller(request)
    known = _scope(request).index.namespaces()
    if await _allowed(request, caller, "list", ""):
        return _json({"items": known, "clusterWide": True})
    decisions = await asyncio.gather(*(_allowed(request, caller, "list", ns) for ns in known))
    return _json({"items": [ns for ns, ok in zip(known, decisions, strict=True) if ok], "clusterWide": False})


async def all_trainjobs(request: web.Request) -> web.Response:
    caller = await _caller(request)
    query = _query(request)
    if not await _allowed(request, caller, "list", ""):
        raise _error(
            403, f"{caller.username} may not list TrainJobs in all namespaces (trainjobs.trainer.kubeflow.org)"
        )
    scope = _scope(request)
    return _json(_listing(scope.index.summaries(), query, request, lambda _: scope.cluster))


async def trainjobs(request: web.Request) -> web.Response:
    namespace = request.match_info["namespace"]
    query: list[Query] = []
    await _require(request, "list", namespace, well_formed=lambda: query.append(_query(request)))
    scope = _scope(request)
    return _json(_listing(scope.index.namespace_summaries(namespace), query[0], request, lambda _: scope.cluster))


def _entry(e: TimelineEntry, text: str) -> dict[str, Any]:
    return {
        "time": e.time,
        "at": dt.datetime.fromtimestamp(e.time, tz=dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "stream": e.stream,
        "seq": e.seq,
        "kind": e.kind,
        "text": text,
        "tone": story.tone(e),
        "summary": e.summary,
        "detail": e.detail,
    }


async def history(request: web.Request) -> web.Response:
    from tjpipe import history_tools

    namespace, name = request.match_info["namespace"], request.match_info["name"]
    await _require(request, "get", namespace, name)
    backend, scope = request.app[BACKEND], _scope(request)
    summary = scope.index.get(namespace, name)
    since = _since(summary, scope)
    key = ObjectKey(namespace=namespace, name=name)
    entries = await history_tools.history(backend.js, key, since=since, progress=False, where=scope.records)
    if not entries and summary is None:
        raise _error(404, f"no history for TrainJob {namespace}/{name} (wrong name, or older than the streams keep)")
    limit = _limit(request, TIMELINE_LIMIT)
    texts = story.texts(entries)  # of every entry: a state change before the newest ``limit`` still counts
    return _json(
        {
            "trainjob": _about(summary, namespace, name, backend, scope.cluster),
            "states": [p.to_json() for p in story.phases(entries)],
            "counts": story.counts(entries),
            "entries": [_entry(e, t) for e, t in zip(entries[-limit:], texts[-limit:], strict=True)],
            "total": len(entries),
            "truncated": len(entries) > limit,
        }
    )


def _about(summary: Any, namespace: str, name: str, backend: Backend, cluster: str = "") -> dict[str, Any]:
    if summary is None:
        return (
            {"cluster": cluster, "namespace": namespace, "name": name}
            if cluster
            else {"namespace": namespace, "name": name}
        )
    return _item(summary, time.time(), backend.stalled_after, cluster)


def _since(summary: Any, scope: Scope) -> float | None:
    """Where a TrainJob's records start, to skip reading older ones: the time the index saw its first.

    Not at a fleet's hub: there a record is stored when it arrives, and after a member was cut off its
    streams catch up side by side, so a plan may arrive before the event it was made from."""
    if scope.cluster or summary is None or not summary.first_seen:
        return None
    return float(summary.first_seen) - 1.0


async def progress(request: web.Request) -> web.Response:
    """The TrainJob's training progress over time: every update its pods reported, oldest first, as JSON or
    (``?output=csv``) as a spreadsheet's CSV file, one row per update and one column per metric."""
    from tjpipe import history_tools

    namespace, name = request.match_info["namespace"], request.match_info["name"]
    await _require(request, "get", namespace, name)
    output = request.query.get("output", "json")
    if output not in ("json", "csv"):
        raise _error(400, f"unknown output {output!r}; one of json, csv")
    limit = _limit(request, PROGRESS_LIMIT)
    backend, scope = request.app[BACKEND], _scope(request)
    summary = scope.index.get(namespace, name)
    key = ObjectKey(namespace=namespace, name=name)
    points = await history_tools.progress_series(backend.js, key, since=_since(summary, scope), where=scope.records)
    if not points and summary is None:
        raise _error(404, f"no history for TrainJob {namespace}/{name} (wrong name, or older than the streams keep)")
    shown = points[-limit:]
    if output == "csv":
        filename = (
            f"{scope.cluster}_{namespace}_{name}_progress.csv" if scope.cluster else f"{namespace}_{name}_progress.csv"
        )
        return web.Response(
            text=history_tools.progress_csv(shown),
            content_type="text/csv",
            charset="utf-8",
            headers={"Content-Disposition": f'attachment; filename="{filename}"'},
        )
    return _json(
        {
            "trainjob": _about(summary, namespace, name, backend, scope.cluster),
            "metrics": sorted({m for p in points for m in p.metrics}),
            "pods": sorted({p.pod for p in points}),
            "points": [p.to_json() for p in shown],
            "total": len(points),
            "truncated": len(points) > limit,
        }
    )


def _seq(text: str | None, what: str) -> int:
    try:
        value = int(text or "")
    except ValueError:
        raise _error(400, f"{what} must be an event sequence number") from None
    if value < 1:
        raise _error(400, f"{what} must be an event sequence number")
    return value


async def _plans(request: web.Request, seqs: list[int]) -> dict[int, list[Any]]:
    from tjpipe import history_tools

    namespace, name = request.match_info["namespace"], request.match_info["name"]
    await _require(request, "get", namespace, name)
    backend, scope = request.app[BACKEND], _scope(request)
    since = _since(scope.index.get(namespace, name), scope)
    found = await history_tools.plans_of(
        backend.js, ObjectKey(namespace=namespace, name=name), seqs, since=since, where=scope.records
    )
    for seq in seqs:
        if not found[seq]:
            raise _error(404, f"no plan of TrainJob {namespace}/{name} was made from event {seq}")
    return found


def _shown(message: Any) -> dict[str, Any]:
    body: dict[str, Any] = msgspec.to_builtins(message)
    body.pop("trace_id", None)
    body["component"] = component_of(message)  # the message's kind tag, with the object's name where it repeats
    return body


async def plan(request: web.Request) -> web.Response:
    """Every component planned from one event, as YAML documents (``?output=json`` for JSON)."""
    from tjpipe.operator_commands import to_yaml_all

    seq = _seq(request.match_info["seq"], "the plan's event")
    messages = (await _plans(request, [seq]))[seq]
    shown = [_shown(m) for m in sorted(messages, key=component_of)]
    if request.query.get("output") == "json":
        return _json(shown)
    return web.Response(text=to_yaml_all(shown), content_type="application/yaml", charset="utf-8")


_WHEN_PLANNED = frozenset({"observed_at", "source_version"})
"""Fields of an apply message that say when it was planned, not what: left out of a plan diff."""


async def plan_diff(request: web.Request) -> web.Response:
    """What changed between the plans made from two events of one TrainJob, field by field per component."""
    from tjpipe import history_tools

    old, new = _seq(request.query.get("from"), "from"), _seq(request.query.get("to"), "to")
    found = await _plans(request, [old, new])
    changed = {
        component: kept
        for component, diffs in history_tools.compare_plans(found[old], found[new]).items()
        if (kept := [d for d in diffs if d[0] not in _WHEN_PLANNED])
    }
    return _json(
        {
            "from": old,
            "to": new,
            "components": {c: [{"field": p, "from": a, "to": b} for p, a, b in diffs] for c, diffs in changed.items()},
        }
    )


async def health(request: web.Request) -> web.Response:
    """Pipeline-wide figures (no namespace's records): any user the API server knows may read them."""
    from history_server.health import pipeline_health

    await _caller(request)
    backend = request.app[BACKEND]
    figures = await pipeline_health(backend.js, backend.session, backend.scrape)
    figures["index"] = {"trainjobs": len(backend.index), "states": backend.index.counts(), "ready": backend.ready}
    return _json(figures)


# ------------------------------------------------------------------------------------------ comparing


async def compare(request: web.Request) -> web.Response:
    """2 to 10 TrainJobs compared (``history_server.compare``): named one by one
    (``?trainjob=NS/NAME&trainjob=NS/NAME``), or those of one namespace a label selector finds
    (``?namespace=NS&labelSelector=...``, the newest 10); as JSON, or ``?output=csv``. Every TrainJob is
    authorized as its own page is (``get``; a selector's namespace also ``list``): one refused, all refused."""
    from history_server.compare import LEAST, MOST, Run, comparison, comparison_csv
    from tjpipe import history_tools

    caller = await _caller(request)
    scope = _scope(request)
    backend = request.app[BACKEND]
    output = request.query.get("output", "json")
    if output not in ("json", "csv"):
        raise _error(400, f"unknown output {output!r}; one of json, csv")
    named = request.query.getall("trainjob", [])
    selector = request.query.get("labelSelector", "")
    if named and selector:
        raise _error(400, "name the TrainJobs (trainjob=NS/NAME) or give a label selector, not both")
    keys: list[tuple[str, str]] = []
    for text in dict.fromkeys(named):
        namespace, _, name = text.partition("/")
        if not _valid_namespace(namespace) or not _valid_name(name):
            raise _error(400, f"{text!r} is not NAMESPACE/NAME of a TrainJob")
        keys.append((namespace, name))
    if selector:
        namespace = request.query.get("namespace", "")
        if not _valid_namespace(namespace):
            raise _error(400, "a label selector compares the TrainJobs of one namespace: give namespace=NS")
        try:
            query = query_of({"labelSelector": selector}, now=time.time(), most=MOST, default_limit=MOST)
        except BadQuery as exc:
            raise _error(400, str(exc)) from None
        if not await _allowed(request, caller, "list", namespace):
            raise _error(403, f"{caller.username} may not list TrainJobs in namespace {namespace!r}")
        found, _ = find(query, scope.index.namespace_summaries(namespace))
        keys = [(s.namespace, s.name) for s in found]
    if not LEAST <= len(keys) <= MOST:
        raise _error(400, f"compare {LEAST} to {MOST} TrainJobs ({len(keys)} named or found)")
    decisions = await asyncio.gather(*(_allowed(request, caller, "get", ns, name) for ns, name in keys))
    refused = [f"{ns}/{name}" for (ns, name), ok in zip(keys, decisions, strict=True) if not ok]
    if refused:
        raise _error(403, f"{caller.username} may not get TrainJob {refused[0]} (trainjobs.trainer.kubeflow.org)")

    async def read(namespace: str, name: str) -> Run:
        summary = scope.index.get(namespace, name)
        key = ObjectKey(namespace=namespace, name=name)
        since = _since(summary, scope)
        entries, points = await asyncio.gather(
            history_tools.history(backend.js, key, since=since, progress=False, where=scope.records),
            history_tools.progress_series(backend.js, key, since=since, where=scope.records),
        )
        if not entries and not points and summary is None:
            raise _error(404, f"no history for TrainJob {namespace}/{name}")
        return Run(
            namespace=namespace,
            name=name,
            runtime=summary.runtime if summary is not None else "",
            nodes=summary.nodes if summary is not None else None,
            labels=summary.labels if summary is not None else {},
            entries=entries,
            points=points,
        )

    runs = await asyncio.gather(*(read(ns, name) for ns, name in keys))
    compared = comparison(runs, time.time())
    if output == "csv":
        return web.Response(
            text=comparison_csv(compared),
            content_type="text/csv",
            charset="utf-8",
            headers={"Content-Disposition": 'attachment; filename="trainjobs_compared.csv"'},
        )
    return _json(compared)


# ------------------------------------------------------------------------------- retention, run again


async def retention(request: web.Request) -> web.Response:
    """How long this TrainJob's history is kept (``history_server.retention``), as its page says it."""
    from contracts import streams
    from history_server.retention import retention_of

    namespace, name = request.match_info["namespace"], request.match_info["name"]
    await _require(request, "get", namespace, name)
    backend, scope = request.app[BACKEND], _scope(request)
    summary = scope.index.get(namespace, name)
    if summary is None:
        raise _error(404, f"no history for TrainJob {namespace}/{name} (wrong name, or no longer kept)")
    policy = backend.retention.policy if backend.retention is not None else None
    answer = retention_of(summary, policy, time.time())
    try:
        info = await backend.js.stream_info(streams.EVENTS_HISTORY.name)
        answer["streamsKeepSeconds"] = float(info.config.max_age or 0) or None
    except Exception:  # only a figure for the page: without it the page says less, nothing fails
        answer["streamsKeepSeconds"] = None
    return _json(answer)


def _same_site(request: web.Request) -> None:
    """A write comes from this server's own page: JSON (no HTML form can send it), from no other origin."""
    from urllib.parse import urlsplit

    if request.content_type != "application/json":
        raise _error(415, "send the request as Content-Type: application/json")
    origin = request.headers.get("Origin")
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none") or (
        origin is not None and urlsplit(origin).netloc != request.host
    ):
        raise _error(403, "a write is accepted from this server's own page only")


async def _run_again_allowed(request: web.Request, caller: Caller, namespace: str) -> bool:
    return request.app[BACKEND].creator is not None and await _allowed(request, caller, "create", namespace)


async def run_again_offer(request: web.Request) -> web.Response:
    """Whether the caller may run this TrainJob again (a SubjectAccessReview: ``create`` TrainJobs in its
    namespace), and a name for the new one."""
    import secrets

    from history_server.rerun import FINISHED

    namespace, name = request.match_info["namespace"], request.match_info["name"]
    caller = await _require(request, "get", namespace, name)
    summary = _scope(request).index.get(namespace, name)
    return _json(
        {
            "allowed": await _run_again_allowed(request, caller, namespace),
            "finished": summary is not None and summary.state in FINISHED,
            "name": f"{name[:56]}-{secrets.token_hex(3)}",
        }
    )


async def run_again(request: web.Request) -> web.Response:
    """A new TrainJob from this one's recorded spec (``history_server.rerun``), created with the
    caller's own token: 401, then the write's own rules (415, 403), 400, 403 unless the caller may ``get``
    this TrainJob and ``create`` TrainJobs in its namespace, 409 unless it finished, then the API server's
    answer."""
    from contracts import streams, subjects
    from history_server.rerun import FINISHED, RunAgainError, again, recorded_trainjob
    from plumbing.bus_history import read_stream

    namespace, name = request.match_info["namespace"], request.match_info["name"]
    await _caller(request)
    _same_site(request)
    raw = await request.read()
    body: dict[str, Any] = {}

    def well_formed() -> None:
        try:
            decoded = msgspec.json.decode(raw or b"{}")
        except msgspec.DecodeError:
            decoded = None
        if not isinstance(decoded, dict):
            raise _error(400, 'send {"name": "NEW-NAME"}')
        body.update(decoded)
        if not isinstance(body.get("name"), str) or not _valid_name(body["name"]):
            raise _error(400, f"{body.get('name')!r} is not a TrainJob name (a DNS label of at most 63 characters)")

    caller = await _require(request, "get", namespace, name, well_formed=well_formed)
    backend, scope = request.app[BACKEND], _scope(request)
    if not await _run_again_allowed(request, caller, namespace):
        raise _error(403, f"{caller.username} may not create TrainJobs in namespace {namespace!r}")
    summary = scope.index.get(namespace, name)
    if summary is None or summary.state not in FINISHED:
        raise _error(409, f"TrainJob {namespace}/{name} has not finished: run again what finished")
    stored = await read_stream(
        backend.js,
        streams.EVENTS_HISTORY.name,
        subjects.trainjob_events_filter(namespace, name),
        start_time=_since(summary, scope),
    )
    recorded = recorded_trainjob([m.data for m in stored])
    if recorded is None:
        raise _error(404, f"no recorded spec of TrainJob {namespace}/{name}")
    assert backend.creator is not None
    try:
        created = await backend.creator.create(
            backend.session, _bearer(request), again(recorded, namespace, body["name"])
        )
    except RunAgainError as exc:
        status = exc.status if exc.status in (400, 403, 409, 422) else 503
        raise _error(status, f"the API server refused: {exc}") from None
    meta = created.get("metadata") or {}
    answer = {"namespace": meta.get("namespace", namespace), "name": meta.get("name"), "uid": meta.get("uid")}
    return web.Response(status=201, text=json.dumps(answer), content_type="application/json")


# ------------------------------------------------------------------------------------ logs and export

LOG_TAIL_LINES = 200
LOG_TAIL_MOST = 5000


async def _kept(request: web.Request) -> tuple[str, str, Any, LogKeeper]:
    """The TrainJob a logs request names, authorized as its page is (``get``), with its summary."""
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    await _require(request, "get", namespace, name)
    keeper = request.app[BACKEND].logs
    summary = _scope(request).index.get(namespace, name)
    if keeper is None:
        raise _error(404, "this history server keeps no logs")
    if summary is None or not summary.uid:
        raise _error(404, f"no history for TrainJob {namespace}/{name} (wrong name, or older than the streams keep)")
    return namespace, name, summary, keeper


async def trainjob_logs(request: web.Request) -> web.Response:
    """What is kept of the TrainJob's pod logs (the newest capture's manifest: each container's log, and what
    is missing and why), and whether this server captures logs at all."""
    from history_server import logs
    from history_server.capture import FINISHED

    namespace, name, summary, keeper = await _kept(request)
    manifest = await keeper.manifest(namespace, summary.uid)
    return _json(
        {
            "trainjob": _about(summary, namespace, name, request.app[BACKEND]),
            "captures": keeper.captures_logs,
            "finished": summary.state in FINISHED,
            "kept": logs.manifest_json(manifest),
        }
    )


async def trainjob_log(request: web.Request) -> web.Response:
    """One container's kept log: its last ``?tail=N`` lines as JSON, or (``?output=download``) the whole of it."""
    from history_server import logs

    namespace, name, summary, keeper = await _kept(request)
    pod, container = request.match_info["pod"], request.match_info["container"]
    output = request.query.get("output", "tail")
    if output not in ("tail", "download"):
        raise _error(400, f"unknown output {output!r}; one of tail, download")
    try:
        lines = int(request.query.get("tail", LOG_TAIL_LINES))
    except ValueError:
        raise _error(400, "tail must be a whole number of lines") from None
    if not 1 <= lines <= LOG_TAIL_MOST:
        raise _error(400, f"tail must be 1 to {LOG_TAIL_MOST} lines")
    manifest = await keeper.manifest(namespace, summary.uid)
    piece = next((p for p in (manifest.pieces if manifest else ()) if (p.pod, p.container) == (pod, container)), None)
    if piece is None:
        raise _error(404, f"no log of container {container!r} of pod {pod!r} is kept for TrainJob {namespace}/{name}")
    read = await keeper.text(piece)
    if read is None:
        raise _error(404, f"the log of {pod}/{container} is no longer kept (older than the logs bucket keeps)")
    text = read.data.decode("utf-8", errors="replace")
    if output == "download":
        return web.Response(
            text=text,
            content_type="text/plain",
            charset="utf-8",
            headers={"Content-Disposition": f'attachment; filename="{namespace}_{name}_{pod}_{container}.log"'},
        )
    shown, total = logs.tail(text, lines)
    return _json(
        {
            "pod": pod,
            "container": container,
            "lines": shown,
            "totalLines": total,
            "complete": read.complete,
            "truncated": piece.truncated,
            "redacted": piece.redacted,
        }
    )


async def capture_logs(request: web.Request) -> web.Response:
    """Keep the TrainJob's pod logs now (while it runs; a finished one's were kept when it finished)."""
    from history_server import logs
    from history_server.capture import FINISHED

    namespace, name, summary, keeper = await _kept(request)
    if not keeper.captures_logs:
        raise _error(503, "this history server does not capture logs (it has no log-keeper identity)")
    if summary.state in FINISHED:
        kept = await keeper.manifest(namespace, summary.uid)
        if kept is not None and kept.reason == "finished":
            raise _error(409, f"TrainJob {namespace}/{name} has finished: its logs were kept then")
    wait = keeper.wait_before_request(summary.uid)
    if wait > 0:
        raise _error(409, f"the logs of TrainJob {namespace}/{name} were just kept; ask again in {wait:.0f} s")
    manifest = await keeper.capture(namespace, name, summary.uid, reason="requested")
    return _json({"kept": logs.manifest_json(manifest)})


async def export(request: web.Request) -> web.Response:
    """The TrainJob's whole record as one JSON-lines file (``history_server.export``)."""
    from history_server.export import record_lines

    namespace, name = request.match_info["namespace"], request.match_info["name"]
    await _require(request, "get", namespace, name)
    backend, scope = request.app[BACKEND], _scope(request)
    summary = scope.index.get(namespace, name)
    lines, records = await record_lines(
        backend.js,
        ObjectKey(namespace=namespace, name=name),
        about=_about(summary, namespace, name, backend, scope.cluster),
        since=_since(summary, scope),
        where=scope.records,
        keeper=backend.logs if not scope.cluster else None,
        uid=summary.uid if summary is not None else "",
    )
    if not records and summary is None:
        raise _error(404, f"no history for TrainJob {namespace}/{name} (wrong name, or older than the streams keep)")
    filename = f"{scope.cluster}_{namespace}_{name}.jsonl" if scope.cluster else f"{namespace}_{name}.jsonl"
    return web.Response(
        body=b"".join(lines),
        content_type="application/x-ndjson",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


# ---------------------------------------------------------------------------------------- the fleet's


async def clusters(request: web.Request) -> web.Response:
    """The fleet's cluster names, what the login page offers (no token goes anywhere for them)."""
    return _json({"items": sorted(request.app[BACKEND].clusters)})


def _named_clusters(request: web.Request) -> list[Scope]:
    """The clusters a fleet-wide request names (``?cluster=a&cluster=b``): only they see the token. A request
    that names none is refused (400) rather than offered to every member: a member's API server that reviews a
    token sees it, so a compromised member would collect the tokens of every cluster."""
    backend = request.app[BACKEND]
    names = request.query.getall("cluster", [])
    if not names:
        raise _error(400, "name the cluster this token is for (?cluster=NAME, once per cluster); it goes to no other")
    unknown = [n for n in names if n not in backend.clusters]
    if unknown:
        raise _error(400, f"no cluster {unknown[0]!r} in this fleet")
    return [backend.clusters[n] for n in dict.fromkeys(names)]


async def _accepted(request: web.Request) -> list[tuple[Scope, Caller | None, str]]:
    """Each named cluster with the user its API server says the token is (``None``: not accepted) and why
    not; 401 when none accepts it."""
    token = _bearer(request)
    named = _named_clusters(request)

    async def one(scope: Scope) -> tuple[Scope, Caller | None, str]:
        try:
            return scope, await scope.authorizer.authenticate(token), ""
        except Unauthenticated:
            return scope, None, "token not accepted"
        except Unavailable:
            return scope, None, "API server unavailable"

    answers = list(await asyncio.gather(*(one(scope) for scope in named)))
    accepted = [caller for _, caller, _ in answers if caller is not None]
    if not accepted:
        if any(why == "API server unavailable" for _, _, why in answers):
            raise _error(503, "no cluster named could be asked about this token")
        raise _error(401, "no cluster named accepts this token", **{"WWW-Authenticate": "Bearer"})
    request["caller"] = accepted[0]
    return answers


async def fleet_whoami(request: web.Request) -> web.Response:
    answers = await _accepted(request)
    out = []
    for scope, caller, why in answers:
        if caller is None:
            out.append({"cluster": scope.cluster, "accepted": False, "reason": why})
            continue
        wide = await _allowed(request, caller, "list", "", scope=scope)
        out.append(
            {
                "cluster": scope.cluster,
                "accepted": True,
                "username": caller.username,
                "groups": list(caller.groups),
                "clusterWide": wide,
            }
        )
    from tjpipe import about

    first = next(c for c in out if c["accepted"])
    return _json({"fleet": True, "username": first["username"], "clusters": out, "version": about.version()})


async def fleet_trainjobs(request: web.Request) -> web.Response:
    """Every TrainJob of the named clusters the caller may list, each with its cluster; ``namespace`` and the
    list's query narrow it. A cluster that does not accept the token adds nothing."""
    namespace = request.query.get("namespace", "")
    if namespace and not _valid_namespace(namespace):
        raise _error(400, f"invalid namespace {namespace!r}")
    answers = await _accepted(request)
    query = _query(request)
    found: list[Any] = []
    clusters: dict[int, str] = {}
    shown = []
    for scope, caller, why in answers:
        if caller is None:
            shown.append({"cluster": scope.cluster, "accepted": False, "reason": why})
            continue
        known = [namespace] if namespace else scope.index.namespaces()
        if await _allowed(request, caller, "list", "", scope=scope):
            readable = known
        else:
            decisions = await asyncio.gather(*(_allowed(request, caller, "list", ns, scope=scope) for ns in known))
            readable = [ns for ns, ok in zip(known, decisions, strict=True) if ok]
        for ns in readable:
            mine = list(scope.index.namespace_summaries(ns))
            found += mine
            clusters.update((id(s), scope.cluster) for s in mine)
        shown.append({"cluster": scope.cluster, "accepted": True, "namespaces": readable})
    return _json(_listing(found, query, request, lambda s: clusters[id(s)]) | {"clusters": shown})


async def fleet_health(request: web.Request) -> web.Response:
    """What the index holds per cluster, for each cluster named whose API server lets the caller list TrainJobs
    cluster-wide there (the counts are the whole cluster's); how full each member's fleet streams are (against its
    quota) only to a caller who may list cluster-wide in every cluster of the fleet."""
    from contracts import fleet

    answers = await _accepted(request)
    backend = request.app[BACKEND]
    visible = [
        scope
        for scope, caller, _ in answers
        if caller is not None and await _allowed(request, caller, "list", "", scope=scope)
    ]
    index = {s.cluster: {"trainjobs": len(s.index), "states": s.index.counts()} for s in visible}
    if {s.cluster for s in visible} != set(backend.clusters):
        return _json({"fleet": True, "streams": [], "index": index, "ready": backend.ready})
    usage: list[dict[str, Any]] = []
    for spec in fleet.FLEET_STREAMS:
        for cluster in backend.clusters:  # each member's copies in a stream of its own, within its quota
            name = fleet.fleet_stream(spec.origin, cluster)
            try:
                info = await backend.js.stream_info(name)
            except Exception as exc:
                usage.append({"stream": name, "cluster": cluster, "error": type(exc).__name__})
                continue
            usage.append(
                {
                    "stream": name,
                    "cluster": cluster,
                    "messages": int(info.state.messages or 0),
                    "bytes": int(info.state.bytes or 0),
                    "maxBytes": int(info.config.max_bytes or -1),
                }
            )
    return _json({"fleet": True, "streams": usage, "index": index, "ready": backend.ready})


# ---------------------------------------------------------------------------------------------- the UI


def _static(name: str) -> bytes:
    return resources.files("history_server").joinpath("static", name).read_bytes()


async def page(request: web.Request) -> web.Response:
    return web.Response(body=_static("index.html"), content_type="text/html", charset="utf-8")


async def static(request: web.Request) -> web.Response:
    name = request.match_info["file"]
    if name not in _STATIC:
        raise web.HTTPNotFound()
    return web.Response(body=_static(name), content_type=_STATIC[name], headers={"Cache-Control": "no-cache"})


def make_app(backend: Backend) -> web.Application:
    """The routes: a single cluster's under ``/api/v1``; at a fleet's hub, the same under
    ``/api/v1/clusters/{cluster}``, with the fleet-wide whoami, list and health at ``/api/v1``."""
    app = web.Application(middlewares=[_guard])
    app[BACKEND] = backend
    app.router.add_get("/healthz", healthz)
    app.router.add_get(f"{API}/docs", docs)
    app.router.add_get("/readyz", readyz)
    base = f"{API}/clusters/{{cluster}}" if backend.fleet else API
    if backend.fleet:
        app.router.add_get(f"{API}/clusters", clusters)
        app.router.add_get(f"{API}/whoami", fleet_whoami)
        app.router.add_get(f"{API}/trainjobs", fleet_trainjobs)
        app.router.add_get(f"{API}/health", fleet_health)
        app.router.add_get(f"{base}/whoami", whoami)
    else:
        app.router.add_get(f"{API}/whoami", whoami)
        app.router.add_get(f"{API}/health", health)
    app.router.add_get(f"{base}/namespaces", namespaces)
    app.router.add_get(f"{base}/trainjobs", all_trainjobs)
    app.router.add_get(f"{base}/namespaces/{{namespace}}/trainjobs", trainjobs)
    app.router.add_get(f"{base}/namespaces/{{namespace}}/trainjobs/{{name}}/history", history)
    app.router.add_get(f"{base}/namespaces/{{namespace}}/trainjobs/{{name}}/progress", progress)
    app.router.add_get(f"{base}/namespaces/{{namespace}}/trainjobs/{{name}}/plans/diff", plan_diff)
    app.router.add_get(f"{base}/namespaces/{{namespace}}/trainjobs/{{name}}/plans/{{seq}}", plan)
    if not backend.fleet:
        app.router.add_get(f"{API}/compare", compare)
        app.router.add_get(f"{base}/namespaces/{{namespace}}/trainjobs/{{name}}/retention", retention)
        app.router.add_get(f"{base}/namespaces/{{namespace}}/trainjobs/{{name}}/run-again", run_again_offer)
        app.router.add_post(f"{base}/namespaces/{{namespace}}/trainjobs/{{name}}/run-again", run_again)
    app.router.add_get(f"{base}/namespaces/{{namespace}}/trainjobs/{{name}}/export", export)
    if not backend.fleet:  # a cluster's logs are in its own bus's bucket, not at the hub
        job = f"{API}/namespaces/{{namespace}}/trainjobs/{{name}}"
        app.router.add_get(f"{job}/logs", trainjob_logs)
        app.router.add_post(f"{job}/logs/capture", capture_logs)
        app.router.add_get(f"{job}/logs/{{pod}}/{{container}}", trainjob_log)
    app.router.add_get("/", page)
    app.router.add_get("/static/{file}", static)
    return app
