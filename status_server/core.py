"""The status server's decisions, without I/O: which request it is, whether its body is valid, who owns a pod,
and when the coalesced write of a TrainJob's ``trainerStatus`` is due.

Why validate here and not leave it to the CRD, as Trainer does: Trainer writes every update to the API server
and lets the CRD's schema answer (422 with the API server's message). Here an update is recorded in the history
first and written to the TrainJob later, coalesced, so the schema's rules (progress 0-100, at most 256 metrics,
names and values of 1 to 64 characters, ``lastUpdatedTime`` required) are checked before anything is recorded:
what the history holds is only what the TrainJob could hold. The messages follow the API server's field paths.

Why the coalescer compares ``lastUpdatedTime``: several pods of one TrainJob report, each on its own clock and
over its own connection, so arrival order says nothing about which value is newer. The status shows the update
whose ``lastUpdatedTime`` is the newest seen; an older one is kept in the history but never written over it.

Why whole seconds: the live status keeps ``metav1.Time``, whole seconds. Comparing an update's fraction with
the live time cut to the second lets an older update of the same second overwrite a newer one, depending on
which replica (or which restart) decides. So every comparison (the coalescer, the write, the recovery at
start-up) is made on the whole second, and "newer" means a later second: within one second the first accepted
update shows and the others are kept in the history only. The history keeps the time as sent.

Why a bound on the future: a pod whose node clock runs ahead, or a leaked token, would otherwise post an update
from next year that every honest update after it is "older" than, freezing the TrainJob's progress until it
ends. An update stamped more than ``max_skew`` ahead of the server's receipt is refused (422, saying so), and
times outside years 0001-9999 in UTC (what ``metav1.Time`` can hold) are refused as the CRD would.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from contracts.progress import ProgressReported
from contracts.trainer import TrainerStatus, UpdateTrainJobStatusRequest

PATH = re.compile(
    r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/(?P<namespace>[^/]+)/trainjobs/(?P<name>[^/]+)/status$"
)
"""Trainer's one route; anything else is 404 with a ``metav1.Status`` body, as Trainer's."""
MAX_BODY = 1 << 16
"""Trainer's request body limit (64 KiB); above it: 413."""
MAX_METRICS = 256
MAX_METRIC_TEXT = 64
INT32_MAX = 2**31 - 1
AUDIENCE_PREFIX = "trainer.kubeflow.org"
CLOCK_LEEWAY = 60.0
MAX_CLOCK_SKEW = 60.0
"""Seconds an update's ``lastUpdatedTime`` may lie ahead of its receipt (the default of ``--max-clock-skew``)."""
MAX_REVIEWS = 8
"""TokenReviews in flight at once, per server process (the default of ``--max-token-reviews``)."""
_FIRST = dt.datetime(1, 1, 1, tzinfo=dt.UTC)
_LAST = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC)
"""Seconds a token's ``nbf`` may lie ahead of the server's clock (the API server's and ours may differ a little)."""

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def audience(namespace: str, name: str) -> str:
    """The token audience Trainer's plugin projects for one TrainJob, and the only one the server accepts."""
    return f"{AUDIENCE_PREFIX}/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


def status_path(namespace: str, name: str) -> str:
    return f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


def route(path: str) -> tuple[str, str] | None:
    """``(namespace, name)`` of a status path whose parts are Kubernetes names; ``None`` for any other path."""
    found = PATH.match(path)
    if found is None:
        return None
    namespace, name = found["namespace"], found["name"]
    if len(namespace) > 63 or len(name) > 63 or not _NAME.match(namespace) or not _NAME.match(name):
        return None
    return namespace, name


def bearer_token(header: str) -> str:
    """The credential of an RFC 7235 ``Bearer`` header (scheme case-insensitive); empty for anything else."""
    parts = header.split()
    return parts[1] if len(parts) == 2 and parts[0].lower() == "bearer" else ""


# ---------------------------------------------------------------------------------------------- the token

MAX_TOKEN = 16_384
"""A projected ServiceAccount token is about a kilobyte; anything far longer is not one."""
SIGNING_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512"})
"""What the API server signs its ServiceAccount tokens with; ``none`` and the HMAC family are never its."""
_B64URL = re.compile(r"^[A-Za-z0-9_-]+$")


def _segment(text: str) -> object:
    return json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def token_claims(token: str) -> dict[str, Any] | None:
    """The payload of a signed compact JWT, decoded without verifying it; ``None`` when ``token`` is not shaped
    as one (three base64url parts, a header naming a signing algorithm, JSON objects)."""
    parts = token.split(".")
    if len(token) > MAX_TOKEN or len(parts) != 3 or not all(_B64URL.match(part) for part in parts):
        return None
    try:
        header, claims = _segment(parts[0]), _segment(parts[1])
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(header, dict) or header.get("alg") not in SIGNING_ALGORITHMS or not isinstance(claims, dict):
        return None
    return claims


def token_audiences(claims: Mapping[str, Any]) -> list[str]:
    aud = claims.get("aud")
    if isinstance(aud, str):
        return [aud]
    return [a for a in aud if isinstance(a, str)] if isinstance(aud, list) else []


def screen_token(token: str, *, audience: str, namespace: str, now: float) -> str:
    """Why ``token`` cannot be a pod's token for ``audience``, read locally without verifying it; empty when it
    may be one (then only the API server's review can say it is). A refusal here costs no TokenReview."""
    claims = token_claims(token)
    if claims is None:
        return "not a signed JWT"
    if token_audiences(claims) != [audience]:
        return "not minted for this TrainJob's status endpoint alone"
    exp, nbf = claims.get("exp"), claims.get("nbf", 0)
    if not isinstance(exp, int | float) or isinstance(exp, bool) or exp <= now:
        return "expired, or without an expiry"
    if not isinstance(nbf, int | float) or nbf > now + CLOCK_LEEWAY:
        return "not valid yet"
    bound = claims.get("kubernetes.io")
    pod = bound.get("pod") if isinstance(bound, dict) else None
    if not isinstance(bound, dict) or bound.get("namespace") != namespace or not isinstance(pod, dict):
        return f"not bound to a pod of namespace {namespace}"
    return ""


# ---------------------------------------------------------------------------------------------- the body


class Invalid(ValueError):
    """A body the server refuses with 422; the message says which field and why, as the API server would."""


_request_decoder = msgspec.json.Decoder(UpdateTrainJobStatusRequest)
_encoder = msgspec.json.Encoder()


def parse_time(text: str) -> float:
    """RFC 3339 (``Z`` or an offset, fractions allowed, as Go's ``metav1.Time`` reads it) as Unix seconds."""
    value = text.strip()
    if not re.match(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$", value):
        raise ValueError(text)
    head, _, rest = value.partition(".")
    fraction = 0.0
    if rest:
        digits = re.match(r"\d+", rest)
        assert digits is not None
        fraction = float("0." + digits[0])
        head += rest[digits.end() :]
    when = dt.datetime.fromisoformat(head.replace("z", "Z").replace("t", "T"))
    if not _FIRST <= when <= _LAST:  # an offset can carry 0001 or 9999 out of the range metav1.Time holds
        raise ValueError(f"{text}: outside years 0001-9999 in UTC")
    return (when - _FIRST).total_seconds() + _FIRST.timestamp() + fraction


def format_time(seconds: float) -> str:
    """``metav1.Time``'s own form: UTC, whole seconds, ``Z`` (what Trainer echoes and writes)."""
    when = _FIRST + dt.timedelta(seconds=whole_second(seconds) - _FIRST.timestamp())
    return f"{when.year:04d}-{when.month:02d}-{when.day:02d}T{when.hour:02d}:{when.minute:02d}:{when.second:02d}Z"


def whole_second(seconds: float) -> int:
    """The precision every comparison of update times is made at: what ``metav1.Time`` keeps."""
    return math.floor(seconds)


@dataclass(frozen=True, slots=True)
class Update:
    """One valid update: the status as it is written (time in ``metav1.Time`` form) and its time in seconds."""

    status: TrainerStatus
    updated_at: float

    @property
    def second(self) -> int:
        """``updated_at`` at the precision the live status keeps, the one every comparison uses."""
        return whole_second(self.updated_at)


def parse_update(body: bytes, *, received_at: float | None = None, max_skew: float = MAX_CLOCK_SKEW) -> Update | None:
    """The update in a request body, checked against the CRD's rules and, given ``received_at``, against the
    server's clock (at most ``max_skew`` seconds ahead); ``None`` when it has no ``trainerStatus`` (Trainer answers
    that with 200 and writes nothing). Raises :class:`Invalid`."""
    try:
        request = _request_decoder.decode(body)
    except msgspec.MsgspecError as exc:
        raise Invalid(f"Invalid payload: {exc}") from None
    status = request.trainer_status
    if isinstance(status, msgspec.UnsetType):
        return None
    problems: list[str] = []
    base = "status.trainerStatus"
    progress = status.progress_percentage
    if not isinstance(progress, msgspec.UnsetType) and not 0 <= progress <= 100:
        bound = "greater than or equal to 0" if progress < 0 else "less than or equal to 100"
        problems.append(f"{base}.progressPercentage: Invalid value: {progress}: should be {bound}")
    remaining = status.estimated_remaining_seconds
    if not isinstance(remaining, msgspec.UnsetType) and not 0 <= remaining <= INT32_MAX:
        bound = "greater than or equal to 0" if remaining < 0 else f"less than or equal to {INT32_MAX}"
        problems.append(f"{base}.estimatedRemainingSeconds: Invalid value: {remaining}: should be {bound}")
    metrics = [] if isinstance(status.metrics, msgspec.UnsetType) else status.metrics
    if len(metrics) > MAX_METRICS:
        problems.append(f"{base}.metrics: Too many: {len(metrics)}: must have at most {MAX_METRICS} items")
    for i, metric in enumerate(metrics[: MAX_METRICS + 1]):
        for part in ("name", "value"):
            text = getattr(metric, part)
            where = f"{base}.metrics[{i}].{part}"
            if isinstance(text, msgspec.UnsetType) or not text:
                problems.append(f"{where}: Required value")
            elif len(text) > MAX_METRIC_TEXT:
                problems.append(f"{where}: Too long: may not be more than {MAX_METRIC_TEXT} bytes")
    updated_at = 0.0
    if isinstance(status.last_updated_time, msgspec.UnsetType) or not status.last_updated_time:
        problems.append(f'{base}: Invalid value: "object": lastUpdatedTime is required when trainerStatus is present')
    else:
        try:
            updated_at = parse_time(status.last_updated_time)
        except ValueError:
            problems.append(
                f"{base}.lastUpdatedTime: Invalid value: {status.last_updated_time!r}: "
                "not RFC 3339 within years 0001-9999"
            )
        else:
            ahead = updated_at - received_at if received_at is not None else 0.0
            if ahead > max_skew:
                problems.append(
                    f"{base}.lastUpdatedTime: Invalid value: {status.last_updated_time!r}: {ahead:.0f}s ahead of "
                    f"the server's clock, more than the {max_skew:.0f}s allowed (is the node's clock right?)"
                )
    if problems:
        raise Invalid("TrainJob status is invalid: " + "; ".join(problems[:8]))
    normal = msgspec.structs.replace(status, last_updated_time=format_time(updated_at))
    return Update(status=normal, updated_at=updated_at)


def echo(update: Update | None) -> bytes:
    """The 200 answer: the request as the server understood it (Trainer re-encodes what it decoded)."""
    request = UpdateTrainJobStatusRequest(trainer_status=update.status if update else msgspec.UNSET)
    return _encoder.encode(request)


def status_body(code: int, reason: str, message: str) -> bytes:
    """A ``metav1.Status`` failure, as Trainer answers every refusal."""
    return _encoder.encode(
        {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason, "code": code}
    )


def apply_body(namespace: str, name: str, *, uid: str, resource_version: str, status: TrainerStatus) -> bytes:
    """The server-side apply of ``status.trainerStatus`` alone, conditional on the TrainJob's uid and version.

    The uid keeps the write off a new TrainJob of the same name; the resourceVersion makes it fail (409)
    when the TrainJob changed since the writer read it, so a writer that read an older ``lastUpdatedTime``
    never writes over a newer one (another replica's write in between), it reads and decides again.
    """
    return _encoder.encode(
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": resource_version},
            "status": {"trainerStatus": status},
        }
    )


# ------------------------------------------------------------------------------------------- ownership


class OwnerRef(msgspec.Struct, frozen=True, kw_only=True):
    api_version: str = msgspec.field(default="", name="apiVersion")
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool = False


class Meta(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = msgspec.field(default="", name="resourceVersion")
    deletion_timestamp: str = msgspec.field(default="", name="deletionTimestamp")
    labels: dict[str, str] = {}
    owner_references: list[OwnerRef] = msgspec.field(default_factory=list, name="ownerReferences")


class Owned(msgspec.Struct, frozen=True, kw_only=True):
    """Any object, as far as ownership goes."""

    metadata: Meta = msgspec.field(default_factory=Meta)


class _LiveTrainerStatus(msgspec.Struct, frozen=True, kw_only=True):
    last_updated_time: str = msgspec.field(default="", name="lastUpdatedTime")


class _LiveStatus(msgspec.Struct, frozen=True, kw_only=True):
    trainer_status: _LiveTrainerStatus | None = msgspec.field(default=None, name="trainerStatus")


class LiveTrainJob(msgspec.Struct, frozen=True, kw_only=True):
    """The live TrainJob, as far as the status server reads it."""

    metadata: Meta = msgspec.field(default_factory=Meta)
    status: _LiveStatus = msgspec.field(default_factory=_LiveStatus)

    def trainer_status_second(self) -> int | None:
        """``status.trainerStatus.lastUpdatedTime`` as a whole second; ``None`` when it has none (or none we read)."""
        text = self.status.trainer_status.last_updated_time if self.status.trainer_status else ""
        try:
            return whole_second(parse_time(text)) if text else None
        except ValueError:
            return None


decode_owned = msgspec.json.Decoder(Owned).decode
decode_trainjob = msgspec.json.Decoder(LiveTrainJob).decode


def controller_of(meta: Meta, *, api_version: str, kind: str) -> OwnerRef | None:
    """The controller owner reference of ``meta``, if it is of that kind; ``None`` otherwise."""
    for ref in meta.owner_references:
        if ref.controller:
            return ref if ref.api_version == api_version and ref.kind == kind else None
    return None


# ------------------------------------------------------------------------------------------- coalescing


@dataclass
class _Job:
    pending: Update | None = None
    newest: int | None = None
    """The newest second accepted for this TrainJob (pending or written); ``None``: none yet."""
    last_write: float = float("-inf")
    """When (monotonic) the last write was made; none yet: minus infinity."""


@dataclass
class Coalescer:
    """Per TrainJob: the newest pending update, and at most one write per ``interval`` seconds.

    ``offer`` takes an accepted update and says whether it is the newest (it replaces what was pending) or
    older than one already seen (kept in the history, never written). ``due`` says when the pending update
    may be written: at once for a TrainJob not written within the interval (the first update shows without
    delay), else when the interval since the last write is over (the newest update then, whatever arrived
    meanwhile). ``take`` hands the pending update to the writer, ``written`` starts the next interval.
    """

    interval: float
    jobs: dict[tuple[str, str], _Job] = field(default_factory=dict)

    def offer(self, key: tuple[str, str], update: Update) -> bool:
        job = self.jobs.setdefault(key, _Job())
        if job.newest is not None and update.second <= job.newest:
            return False
        job.pending, job.newest = update, update.second
        return True

    def due(self, key: tuple[str, str], now: float) -> float | None:
        """The monotonic time the pending update may be written; ``None`` when nothing is pending."""
        job = self.jobs.get(key)
        if job is None or job.pending is None:
            return None
        return max(now, job.last_write + self.interval)

    def take(self, key: tuple[str, str]) -> Update | None:
        job = self.jobs.get(key)
        if job is None or job.pending is None:
            return None
        pending, job.pending = job.pending, None
        return pending

    def written(self, key: tuple[str, str], now: float) -> None:
        self.jobs.setdefault(key, _Job()).last_write = now

    def put_back(self, key: tuple[str, str], update: Update) -> None:
        """A write that failed: its update is pending again unless a newer one came meanwhile."""
        job = self.jobs.setdefault(key, _Job())
        if job.pending is None or job.pending.second < update.second:
            job.pending = update

    def forget(self, key: tuple[str, str]) -> None:
        self.jobs.pop(key, None)

    def prune(self, now: float) -> int:
        """Forget TrainJobs with nothing pending whose interval is over (they would be written at once anyway),
        so the table holds the TrainJobs reporting now, not every TrainJob ever seen; how many went. What an
        entry also remembered, the newest time seen, the writer reads again from the live TrainJob."""
        idle = [k for k, job in self.jobs.items() if job.pending is None and job.last_write + self.interval < now]
        for key in idle:
            del self.jobs[key]
        return len(idle)


# ------------------------------------------------------------------------------------------- recovery


@dataclass(frozen=True, slots=True)
class Recorded:
    """The newest recorded update of one TrainJob (by its uid), to be written if the live status is older."""

    trainjob_uid: str
    update: Update


def newest_recorded(records: Iterable[ProgressReported]) -> dict[tuple[str, str], Recorded]:
    """Per TrainJob, in the order the history holds ``records``: the update with the newest second (the first of
    that second), of the uid recorded last under its name (a new TrainJob of an old name starts afresh)."""
    out: dict[tuple[str, str], Recorded] = {}
    for record in records:
        key = (record.trainjob.namespace, record.trainjob.name)
        try:
            at = record.updated_at or parse_time(str(record.trainer_status.last_updated_time))
        except ValueError:
            continue
        update = Update(status=record.trainer_status, updated_at=at)
        known = out.get(key)
        if known is None or known.trainjob_uid != record.trainjob_uid or update.second > known.update.second:
            out[key] = Recorded(trainjob_uid=record.trainjob_uid, update=update)
    return out


# ------------------------------------------------------------------------------------------- fair share


@dataclass(frozen=True, slots=True)
class Rate:
    """A token bucket's shape: ``per_second`` refill, up to ``burst`` at once."""

    per_second: float
    burst: float

    def __str__(self) -> str:
        """``PER_SECOND/BURST``, as a setting writes a rate (``1/10``)."""
        return f"{self.per_second:g}/{self.burst:g}"


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


@dataclass
class RateLimits:
    """Token buckets per key (a pod, a TrainJob), so that one caller's flood is answered 429 and every other
    caller keeps its share of the server, the bus and the history.

    ``take`` charges one request to every bucket it names, or to none: the answer is 0 when it may go on, else
    the seconds until each named bucket has a token again (the ``Retry-After``). A refused request costs its
    buckets nothing, so a caller that waits as told is served. Full buckets are forgotten by ``prune`` (a key
    that comes back starts full, as it would be), so the table holds the callers of the last moments only.
    """

    buckets: dict[tuple[str, str], _Bucket] = field(default_factory=dict)

    def take(self, wanted: list[tuple[tuple[str, str], Rate]], now: float) -> float:
        waits = []
        for key, rate in wanted:
            bucket = self._refilled(key, rate, now)
            if bucket.tokens < 1:
                waits.append((1 - bucket.tokens) / rate.per_second if rate.per_second > 0 else math.inf)
        if waits:
            return max(waits)
        for key, _ in wanted:
            self.buckets[key].tokens -= 1
        return 0.0

    def _refilled(self, key: tuple[str, str], rate: Rate, now: float) -> _Bucket:
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = _Bucket(tokens=rate.burst, at=now)
        bucket.tokens = min(rate.burst, bucket.tokens + (now - bucket.at) * rate.per_second)
        bucket.at = now
        return bucket

    def prune(self, now: float, rates: Mapping[str, Rate]) -> int:
        """Forget the buckets that would be full by now (``rates`` by the key's kind); how many went."""
        full = [
            key
            for key, bucket in self.buckets.items()
            if bucket.tokens + (now - bucket.at) * rates[key[0]].per_second >= rates[key[0]].burst
        ]
        for key in full:
            del self.buckets[key]
        return len(full)
