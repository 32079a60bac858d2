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
