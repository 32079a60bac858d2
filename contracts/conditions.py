"""TrainJob conditions this pipeline adds to Trainer's three (Suspended, Complete, Failed).

Trainer v2.3.0 reports a TrainJob that cannot be built only as a Kubernetes Event (upstream #3671), which
disappears after an hour and is invisible to anything that reads status. Here the problem stays on the
TrainJob as ``ResourcesCreated=False`` with a reason, until it is resolved, when the condition turns True.
A TrainJob that can never be built — invalid against the checks Trainer's webhooks make — is ``Failed``
with reason ``ValidationFailed`` instead, since no later event can change an immutable spec.

A healthy TrainJob never gets the extra condition, so its status stays what Trainer would write.
"""

from __future__ import annotations

CONDITION_RESOURCES_CREATED = "ResourcesCreated"

REASON_RESOURCES_CREATED = "ResourcesCreated"
MESSAGE_RESOURCES_CREATED = "the TrainJob's components were planned"
REASON_RUNTIME_NOT_FOUND = "RuntimeNotFound"
REASON_INVALID_RUNTIME = "InvalidRuntime"
REASON_INVALID_RUNTIME_SNAPSHOT = "InvalidRuntimeSnapshot"
REASON_BUILD_FAILED = "BuildFailed"
REASON_VALIDATION_FAILED = "ValidationFailed"
REASON_IMMUTABLE_FIELDS_KEPT = "ImmutableFieldsKept"
REASON_PLAN_TOO_LARGE = "PlanTooLarge"
"""A component's apply message is larger than the bus's max payload; the planner dead-letters the event."""

# --------------------------------------------------------------------------- conditions the applier owns
#
# The applier reports what only it can see — the API server refusing a component, a ledger claim the
# cluster cannot account for — as a condition of its own, written by Server-Side Apply on the status
# subresource under its own field manager. It must not be ``trainer``: the planner's status apply lists
# every condition it wants, and SSA removes list entries a manager stops sending, so a condition applied
# as ``trainer`` would vanish with the next status plan. Under its own manager the applier clears the
# condition by applying a status without it. The planner leaves these types out of the conditions it
# sends (``APPLIER_CONDITION_TYPES``), so it never co-owns them.
#
# A healthy TrainJob never gets one, so its status stays exactly Trainer's.

APPLIER_FIELD_MANAGER = "tjpipe-applier"
CONDITION_COMPONENTS_APPLIED = "ComponentsApplied"
APPLIER_CONDITION_TYPES = frozenset({CONDITION_COMPONENTS_APPLIED})
REASON_STALE_LEDGER_CLAIM = "StaleLedgerClaim"
"""A ledger claim newer than anything the cluster holds kept a component from being applied."""
CONDITION_MESSAGE_LIMIT = 1024
"""Bound on the condition message: an admission webhook's answer can be long."""
