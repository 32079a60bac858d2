"""A TrainJob's kept pod logs, as objects of the logs bucket (``contracts.streams.LOGS``), and what says what
was kept and what could not be.

Why names by cluster, namespace and the TrainJob's uid: a TrainJob's name is reused after a delete, its uid
never is, so the logs of two runs of one name never mix, and everything of one TrainJob sits under one prefix
(``<cluster>/<namespace>/<uid>/``) that a retention purge or an operator finds and deletes in one pass
(``plumbing.object_store.delete_prefix``). Why a manifest per capture: the bucket is read with direct gets
by name (no consumer, no listing), so the manifest (``<prefix>manifest``, replaced by each capture) is what
names the capture's objects; it also says, per pod and container, what could not be kept and why, so a
page never shows nothing where a log is missing.
"""

from __future__ import annotations

import msgspec

LOCAL_CLUSTER = "local"
"""The cluster part of the names on a single cluster's bus."""

MANIFEST = "manifest"

# Why a capture has nothing for a container: said to users as they are.
POD_GONE = "pod-gone"
NOT_STARTED = "not-started"
UNREACHABLE = "unreachable"
NO_CONTAINERS = "no-containers"
NO_JOBSET = "no-jobset"
REFUSED = "refused"
TOO_MANY = "too-many-pods"


class LogPiece(msgspec.Struct, frozen=True, kw_only=True):
    """One container's log as kept."""

    pod: str
    container: str
    object: str
    """The object's name in the bucket."""
    bytes: int
    replicated_job: str = ""
    truncated: bool = False
    """The container wrote more than a capture keeps: the newest part is kept."""
    redacted: int = 0
    """How many secrets (private keys, tokens, seeds) were blanked out before it was stored."""
    phase: str = ""


class MissingLog(msgspec.Struct, frozen=True, kw_only=True):
    """A log the capture could not keep, and why (``why`` one of the constants above; ``detail`` the cluster's
    words, with no credential in them)."""

    pod: str = ""
    container: str = ""
    why: str
    detail: str = ""


class LogManifest(msgspec.Struct, frozen=True, kw_only=True):
    cluster: str
    namespace: str
    name: str
    uid: str
    captured_at: float
    reason: str
    """``finished`` (the TrainJob ended) or ``requested`` (asked for from its page while it ran)."""
    pieces: tuple[LogPiece, ...] = ()
    missing: tuple[MissingLog, ...] = ()
    no_containers: bool = False
    """The cluster runs no containers (a simulated cluster): its pods never write a log."""


def prefix(cluster: str, namespace: str, uid: str) -> str:
    """Where every object of one TrainJob's logs is: ``<cluster>/<namespace>/<uid>/``."""
    return f"{cluster or LOCAL_CLUSTER}/{namespace}/{uid}/"


def manifest_name(cluster: str, namespace: str, uid: str) -> str:
    return prefix(cluster, namespace, uid) + MANIFEST


def piece_name(cluster: str, namespace: str, uid: str, capture: str, pod: str, container: str) -> str:
    """A container's log of one capture (``capture`` tells captures apart, so none overwrites another)."""
    return f"{prefix(cluster, namespace, uid)}{capture}/{pod}/{container}"


encode_manifest = msgspec.json.Encoder().encode
decode_manifest = msgspec.json.Decoder(LogManifest).decode
