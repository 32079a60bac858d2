"""What a capture of a TrainJob's pod logs keeps, decided from what the live cluster shows: the pure part.

Which pods: those of the TrainJob's JobSet, as the API server lists them now, and only when that JobSet is the
TrainJob's (its owner reference names the TrainJob's uid). A request to capture, or the event that says a
TrainJob finished, names the TrainJob; it never names a pod, so nothing the bus or a user says decides which
logs are read. Which containers: every container of those pods that ran; one that never started, a pod that
is gone, a kubelet that does not answer each become a ``MissingLog`` saying so. A pod that ran although none of
its containers has a container id is a simulated cluster's (kwok plays the pod's life, no runtime runs it):
there is no log to keep, and the capture says the cluster runs no containers.

What is kept of a log: at most ``MOST_BYTES`` per container, the first part and the newest lines when it is
longer, with every secret the training code may have printed (a PEM private key, a bearer token, a JSON web
token such as a ServiceAccount's, a NATS seed) replaced by ``[redacted]`` before it is stored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from contracts import logs
from contracts.jobset import LABEL_JOBSET_NAME, LABEL_JOBSET_UID, LABEL_REPLICATED_JOB_NAME

MOST_BYTES = 4 * 1024 * 1024
"""What one container's log keeps at most: the first half of it and the newest lines for the rest."""
MOST_PODS = 64
"""Pods one capture reads at most (a JobSet of more keeps the first 64 by name, and says so)."""
REDACTED = "[redacted]"

_SECRETS = (
    re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.DOTALL),
    re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}"),
    re.compile(r"(?i)(?<=bearer )[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"\bS[UAOCNPX][A-Z2-7]{56}\b"),
)


def redact(text: str) -> tuple[str, int]:
    """``text`` with every secret replaced, and how many were."""
    count = 0
    for pattern in _SECRETS:
        text, found = pattern.subn(REDACTED, text)
        count += found
    return text, count


def tail(text: str, lines: int) -> tuple[list[str], int]:
    """The last ``lines`` lines of ``text`` and how many it has."""
    every = text.splitlines()
    return every[-lines:] if lines > 0 else [], len(every)


def shortened(head: bytes, newest: bytes, most: int = MOST_BYTES) -> bytes:
    """A log longer than ``most``: its first half and the newest lines that fit, with a line between saying so."""
    half = most // 2
    first = head[:half]
    cut = first.rfind(b"\n")
    first = first[: cut + 1] if cut > 0 else first
    last = newest[-half:]
    start = last.find(b"\n")
    last = last[start + 1 :] if 0 <= start < len(last) - 1 else last
    return first + b"[... the middle of this log was not kept: it is longer than a capture keeps ...]\n" + last


def owned_by(jobset: Mapping[str, Any], uid: str) -> bool:
    """Whether the live JobSet is the TrainJob's: an owner reference of kind TrainJob with its uid."""
    refs = (jobset.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("kind") == "TrainJob" and r.get("uid") == uid for r in refs)


def of_jobset(pod: Mapping[str, Any], jobset: Mapping[str, Any]) -> bool:
    """Whether a pod listed by the JobSet's name label is that JobSet's: JobSet labels its pods with its uid;
    a pod without that label must be owned by one of the JobSet's Jobs (named ``<jobset>-...``)."""
    meta = pod.get("metadata") or {}
    js_meta = jobset.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(LABEL_JOBSET_NAME) != js_meta.get("name"):
        return False
    if LABEL_JOBSET_UID in labels:
        return bool(labels[LABEL_JOBSET_UID] == js_meta.get("uid"))
    prefix = f"{js_meta.get('name')}-"
    return any(
        r.get("kind") == "Job" and str(r.get("name", "")).startswith(prefix) for r in meta.get("ownerReferences") or []
    )


@dataclass(frozen=True)
class Target:
    """A container whose log is read."""

    pod: str
    container: str
    replicated_job: str
    phase: str


@dataclass(frozen=True)
class Plan:
    targets: tuple[Target, ...]
    missing: tuple[logs.MissingLog, ...]
    no_containers: bool


def plan(pods: Iterable[Mapping[str, Any]]) -> Plan:
    """Which containers of the JobSet's pods to read, which are missing and why, and whether the cluster runs
    containers at all."""
    targets: list[Target] = []
    missing: list[logs.MissingLog] = []
    ran_without_runtime = 0
    ordered = sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name", "")))
    if not ordered:
        why = "no pod of the TrainJob's JobSet is left (deleted, or never created)"
        return Plan((), (logs.MissingLog(why=logs.POD_GONE, detail=why),), False)
    for pod in ordered[MOST_PODS:]:
        name = str(pod["metadata"]["name"])
        missing.append(logs.MissingLog(pod=name, why=logs.TOO_MANY, detail=f"more than {MOST_PODS} pods: not read"))
    for pod in ordered[:MOST_PODS]:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        name = str(meta.get("name", ""))
        phase = str(status.get("phase", ""))
        job = str((meta.get("labels") or {}).get(LABEL_REPLICATED_JOB_NAME, ""))
        started = {s.get("name"): bool(s.get("containerID")) for s in status.get("containerStatuses") or []}
        if phase in ("Running", "Succeeded", "Failed") and started and not any(started.values()):
            ran_without_runtime += 1
            continue
        for container in spec.get("containers") or []:
            cname = str(container.get("name", ""))
            if started.get(cname):
                targets.append(Target(name, cname, job, phase))
            else:
                detail = f"the container had not started (pod {phase or 'pending'})"
                missing.append(logs.MissingLog(pod=name, container=cname, why=logs.NOT_STARTED, detail=detail))
    return Plan(tuple(targets), tuple(missing), ran_without_runtime > 0 and not targets)


def missing_after_error(target: Target, status: int, message: str) -> logs.MissingLog:
    """What a failed log read means: the pod gone (404), the container not started, the kubelet not reached."""
    lowered = message.lower()
    if status == 404:
        why = logs.POD_GONE
    elif status == 403:
        why = logs.REFUSED
    elif status == 400 and (
        "waiting to start" in lowered or "containercreating" in lowered or "podinitializing" in lowered
    ):
        why = logs.NOT_STARTED
    else:  # no answer, a 5xx from the kubelet's proxy, a pod without a node: the kubelet could not be asked
        why = logs.UNREACHABLE
    detail, _ = redact(f"{status} {message}".strip() if status else message)
    return logs.MissingLog(pod=target.pod, container=target.container, why=why, detail=detail[:300])


WHY = {
    logs.POD_GONE: "the pod is gone",
    logs.NOT_STARTED: "the container never started",
    logs.UNREACHABLE: "the node's kubelet could not be reached",
    logs.NO_CONTAINERS: "this cluster runs no containers",
    logs.NO_JOBSET: "the TrainJob's JobSet is gone",
    logs.REFUSED: "the history server may not read it",
    logs.TOO_MANY: f"a capture reads {MOST_PODS} pods at most",
}
"""Each reason in a user's words (the page says the same)."""


def manifest_json(manifest: logs.LogManifest | None) -> dict[str, Any] | None:
    """The manifest as the API shows it."""
    if manifest is None:
        return None
    return {
        "capturedAt": manifest.captured_at,
        "reason": manifest.reason,
        "noContainers": manifest.no_containers,
        "pieces": [
            {
                "pod": p.pod,
                "container": p.container,
                "replicatedJob": p.replicated_job,
                "phase": p.phase,
                "bytes": p.bytes,
                "truncated": p.truncated,
                "redacted": p.redacted,
            }
            for p in manifest.pieces
        ],
        "missing": [
            {"pod": m.pod, "container": m.container, "why": m.why, "reason": WHY.get(m.why, m.why), "detail": m.detail}
            for m in manifest.missing
        ],
    }
