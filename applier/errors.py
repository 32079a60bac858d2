"""How an attempt ends when it does not finish, and what a check answers.

Errors are types, as in kopf (TemporaryError / PermanentError) and controller-runtime (TerminalError): a
transient failure is retried in process and then handed back to JetStream with a delay; a permanent one is
dead-lettered at once, because sending the same bytes again cannot change the answer. Every module of the
applier raises these, and ``applier.service`` finishes each its own way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class TransientError(Exception):
    def __init__(self, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class PermanentError(Exception):
    def __init__(self, reason: str, *, api_reason: str = "", api_message: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.api_reason = api_reason
        """The API server's own status reason (``Invalid``, ``Forbidden``, ...) when it refused the write."""
        self.api_message = api_message


class SettlingRefusal(TransientError):
    """A refusal that the cluster clears by itself within moments, e.g. JobSet's webhook refusing a JobSet
    made again while the claim of the one deleted before it is still being collected. It is retried as a
    transient error for ``SETTLING_DELIVERIES`` deliveries (a few minutes), then it is ``permanent``: a
    refusal that does not clear ends as a condition and a dead letter, never as an endless retry."""

    def __init__(self, reason: str, *, permanent: PermanentError) -> None:
        super().__init__(reason)
        self.permanent = permanent


class Held(Exception):
    """The message waits (nak with a delay) for something that resolves itself, e.g. a claim's grace."""

    def __init__(self, delay: float) -> None:
        super().__init__(f"held for {delay:.1f}s")
        self.delay = delay


class Unauthorized(Exception):
    """The message asks for a write no real TrainJob justifies: dead-lettered, and nothing is written."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class TrainJobGone(Exception):
    """The TrainJob a plan is for no longer exists (deleted, or replaced by one of the same name).

    Its plans in flight are finished, not failed: nothing is written, the result says ``skipped`` and why,
    and no dead letter is kept, since there is nothing for an operator to do.
    """

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


SETTLING_DELIVERIES = 8
"""With the applier's growing nak delay (2 s doubling, at most 60 s) about three minutes."""
SETTLING_REFUSALS = ("retentionPolicy must be retain when PVC exists",)
"""Refusals that name a state the garbage collector is removing: JobSet v0.12.0's webhook answers this when
a claim of the JobSet's name still exists (whenDeleted: Delete claims go with the JobSet that owned them)."""


TRANSIENT_STATUSES = frozenset({0, 408, 409, 425, 429, 500, 502, 503, 504})
PERMANENT_STATUSES = frozenset({400, 401, 403, 404, 405, 406, 410, 413, 415, 422})
"""A 401 gets here only after the API client loaded its credentials again and the retry was refused too
(``plumbing.kube.KubeClient``): an expired exec or service-account token never reaches the dead letters."""


def classify(status: int, reason: str, message: str, *, retry_after: float | None = None) -> Exception:
    """Map an API answer to TransientError or PermanentError. Status 0 means no answer (connection)."""
    text = f"{status} {reason}: {message}" if status else message
    if status in TRANSIENT_STATUSES or status >= 500:
        return TransientError(text, retry_after=retry_after)
    if status == 404 and ("the server could not find the requested resource" in message or "page not found" in message):
        return PermanentError(f"{text} (is the CRD installed?)", api_reason=reason or "NotFound", api_message=message)
    permanent = PermanentError(text, api_reason=reason or str(status), api_message=message)
    if status == 422 and any(settling in message for settling in SETTLING_REFUSALS):
        return SettlingRefusal(f"{text} (waiting for the cluster to settle)", permanent=permanent)
    return permanent


class ApiAnswer(Protocol):
    """What ``classify`` reads of an API client's error (``plumbing.kube.KubeApiError``)."""

    status: int
    reason: str
    message: str
    retry_after: float | None


def from_api(exc: ApiAnswer) -> Exception:
    """What a request the API server refused (or never answered) means for the retry tiers (``classify``)."""
    return classify(exc.status, exc.reason, exc.message, retry_after=exc.retry_after)


@dataclass(frozen=True)
class Verdict:
    """A check's answer: allowed, or refused and why. A refusal is raised as ``Unauthorized`` (or, when the
    TrainJob is gone, ``TrainJobGone``) by whoever made the check."""

    allowed: bool
    why: str = ""
    gone: bool = False
    """Refused because the TrainJob the message names no longer exists: noise, not a forgery."""


ALLOWED = Verdict(True)
