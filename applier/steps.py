"""What one claim round can do: the closed set of ``Step``s ``applier.claim_round.decide`` answers with, each
of which ``applier.fence`` performs. Data only.
"""

from __future__ import annotations

import msgspec

from contracts.messages import AppliedRecord


class Refuse(msgspec.Struct, frozen=True, kw_only=True):
    """The live target is controlled by something other than this TrainJob: nothing is written or taken over."""

    why: str


class Advance(msgspec.Struct, frozen=True, kw_only=True):
    """The record is this very plan and the live object still holds it (``still_applied``): only the record
    moves on to this message (compare-and-set); the outcome is ``unchanged``."""

    record: AppliedRecord
    resource_version: str


class Leave(msgspec.Struct, frozen=True, kw_only=True):
    """The policy leaves the live object as it is (``policy_allows``); ``skipped``, and why. With ``label``,
    the merge patch that adds this pipeline's missing label first (``owned_label_patch``)."""

    resource_version: str
    reason: str
    label: bytes | None = None


class Adopt(msgspec.Struct, frozen=True, kw_only=True):
    """The live object already holds the plan (``held_state``): ``record`` is written as applied
    (compare-and-set) and nothing else, but for this pipeline's label when ``label`` says it lacks it."""

    record: AppliedRecord
    label: bool = False


class Create(msgspec.Struct, frozen=True, kw_only=True):
    """A create-only target (``CREATE_ONLY``): ``claim`` it, then create it; it is never read or patched.

    ``known`` is the record as this cluster made it (``None`` if none, or another history's): whom it says
    the object was created for judges a create answered 409 (``existing``).
    """

    claim: AppliedRecord
    known: AppliedRecord | None = None


class SkipStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A status planned from another TrainJob version than the live one (``status_outdated``): ``claim`` the
    target, then skip it; a newer plan carries the newer status."""

    claim: AppliedRecord
    resource_version: str


class Write(msgspec.Struct, frozen=True, kw_only=True):
    """``claim`` the target, then apply the plan, on condition of ``precondition`` (the live resourceVersion
    read, ``""`` for none); ``before`` is the resourceVersion the outcome is told from (``outcome``)."""

    claim: AppliedRecord
    precondition: str
    before: str


Step = Refuse | Advance | Leave | Adopt | Create | SkipStatus | Write
"""What one claim round does; ``applier.fence`` performs each, and any compare-and-set it loses starts the
next round."""
