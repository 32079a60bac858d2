"""What the local stack registers on its own apiserver for the processes it runs, and its removal at start.

Why: the apiserver's state outlives the processes. etcd keeps its data in the state folder, so a stack
started again in another mode (``tjpipe up --control-plane-only`` after a full ``tjpipe up``) finds what
the processes of the last start left: JobSet's webhook configurations with ``failurePolicy: Fail`` pointing
at a port where nothing listens refuse every JobSet, a default StorageClass names a provisioner that is not
running, nodes that no kwok heartbeats stay as they were. Each object a process of the stack registers
carries the label ``REGISTERED_FOR`` with that process's name; at start, the stack removes every labelled
object whose process it is not going to run (``remove_registrations``). A process that does run
registers its objects again as it starts (a new port and a new CA each time), so those are left to it.

Only the stack's own apiserver is swept: an adopted cluster's objects are never the stack's to remove.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from kubernetes.client import AdmissionregistrationV1Api, ApiClient, CoreV1Api, StorageV1Api
from kubernetes.client.exceptions import ApiException

REGISTERED_FOR = "tjpipe.local/registered-for"
"""Label: the name of the stack's process an object exists for (``jobset-manager``, ``webhook``, ...)."""

REGISTERED_KINDS: tuple[tuple[type[Any], str], ...] = (
    (AdmissionregistrationV1Api, "mutating_webhook_configuration"),
    (AdmissionregistrationV1Api, "validating_webhook_configuration"),
    (StorageV1Api, "storage_class"),
    (CoreV1Api, "node"),
)
"""Every cluster-scoped kind the stack's processes register objects of: (client API, the name in its
``list_*`` and ``delete_*`` methods)."""


def registered_for(process: str, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with the label that ties it to ``process`` (changed in place and returned)."""
    obj.setdefault("metadata", {}).setdefault("labels", {})[REGISTERED_FOR] = process
    return obj


def remove_registrations(api: ApiClient, *, running: Collection[str]) -> list[str]:
    """Delete every labelled object of ``REGISTERED_KINDS`` whose process is not in ``running``; return
    ``kind/name`` of each deleted."""
    selector = REGISTERED_FOR
    if running:
        selector += f",{REGISTERED_FOR} notin ({','.join(sorted(running))})"
    removed: list[str] = []
    for api_class, kind in REGISTERED_KINDS:
        client = api_class(api)
        listed = getattr(client, f"list_{kind}")(label_selector=selector)
        for item in listed.items:
            try:
                getattr(client, f"delete_{kind}")(item.metadata.name)
            except ApiException as error:
                if error.status != 404:
                    raise
            removed.append(f"{kind}/{item.metadata.name}")
    return removed
