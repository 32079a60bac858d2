"""What one apply or delete attempt did (``Done``), and the words its result gives for why.

Outcomes use fluxcd ssa's words: created, configured, unchanged, plus skipped and failed.
"""

from __future__ import annotations

import msgspec

from contracts.messages import ApplyAction


class Done(msgspec.Struct, frozen=True, kw_only=True):
    """What one apply or delete attempt did: the action reported, the resourceVersion it left, and why."""

    action: ApplyAction
    resource_version: str = ""
    reason: str = ""


STALE_PLAN = "stale plan: a newer plan for this target was claimed or applied"
ALREADY_APPLIED = "already applied; the live object still holds it"
ALREADY_HELD = "the live object already holds the plan; applying it would change nothing"
STALE_STATUS = "stale status: the TrainJob changed since this status was planned"
CREATED_CONCURRENTLY = "created concurrently"
ALREADY_CREATED = "exists already; created once and never changed"
