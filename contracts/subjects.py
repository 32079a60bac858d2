"""Subject names on the bus, and the partition a TrainJob belongs to.

Every subject carries a partition token chosen by a stable hash of ``namespace/name``. The number of
partitions is fixed for the life of a deployment: changing it would move keys between partitions and
break per-TrainJob ordering while old messages drain, so it is a constant here, not a setting.

The hash is FNV-1a 32-bit over ``namespace`` and ``name`` joined without a separator, the same function
the NATS server uses for its ``partition()`` subject transform. A stream transform could therefore take
over the job of computing partitions without moving any key.

Kubernetes namespaces are DNS-1123 labels and TrainJob names RFC 1035 labels, so neither holds a dot;
component names may (a ConfigMap name is a DNS subdomain), so they are escaped with ``_``, which no
Kubernetes name can contain.
"""

from __future__ import annotations

import functools

PARTITIONS = 16

EVENTS_PREFIX = "tj.ev"
APPLY_PREFIX = "tj.apply"
RESULTS_PREFIX = "tj.result"
DLQ_PREFIX = "tj.dlq"
PROGRESS_PREFIX = "tj.progress"
"""Training progress records (``contracts.progress``), one subject per TrainJob like the events."""

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


def fnv1a32(data: bytes) -> int:
    h = _FNV_OFFSET
    for byte in data:
        h ^= byte
        h = (h * _FNV_PRIME) & 0xFFFFFFFF
    return h


@functools.lru_cache(maxsize=65536)
def partition_of(namespace: str, name: str, partitions: int = PARTITIONS) -> int:
    return fnv1a32((namespace + name).encode()) % partitions


def escape_token(value: str) -> str:
    """Make a Kubernetes name safe as one subject token."""
    return value.replace(".", "_") or "_"


def event_subject(namespace: str, name: str) -> str:
    return f"{EVENTS_PREFIX}.{partition_of(namespace, name)}.{namespace}.{name}"


def apply_subject(namespace: str, name: str, component: str) -> str:
    return f"{APPLY_PREFIX}.{partition_of(namespace, name)}.{namespace}.{name}.{escape_token(component)}"


def result_subject(namespace: str, name: str, component: str) -> str:
    return f"{RESULTS_PREFIX}.{partition_of(namespace, name)}.{namespace}.{name}.{escape_token(component)}"


def dlq_subject(stage: str, namespace: str, name: str) -> str:
    return f"{DLQ_PREFIX}.{stage}.{namespace}.{name}"


def progress_subject(namespace: str, name: str) -> str:
    return f"{PROGRESS_PREFIX}.{partition_of(namespace, name)}.{namespace}.{name}"


def events_filter(partition: int | None = None) -> str:
    return f"{EVENTS_PREFIX}.{'*' if partition is None else partition}.>"


def apply_filter(partition: int | None = None) -> str:
    return f"{APPLY_PREFIX}.{'*' if partition is None else partition}.>"


# One TrainJob's subjects name its own partition rather than ``*``: the events filter is then a literal
# subject, which the server answers from its per-subject index instead of matching a wildcard against every
# subject it holds (about four times faster on 10,000 TrainJobs' history), and the others match in one
# partition's subjects only.


def trainjob_events_filter(namespace: str, name: str) -> str:
    return event_subject(namespace, name)


def trainjob_apply_filter(namespace: str, name: str) -> str:
    return f"{APPLY_PREFIX}.{partition_of(namespace, name)}.{namespace}.{name}.>"


def trainjob_results_filter(namespace: str, name: str) -> str:
    return f"{RESULTS_PREFIX}.{partition_of(namespace, name)}.{namespace}.{name}.>"


def trainjob_progress_filter(namespace: str, name: str) -> str:
    """One TrainJob's progress records: a literal subject, as its events."""
    return progress_subject(namespace, name)


def namespace_progress_filter(namespace: str) -> str:
    """Every progress record of one namespace (``*`` only for the partition and the name)."""
    return f"{PROGRESS_PREFIX}.*.{namespace}.*"


def trainjob_of_subject(subject: str) -> tuple[str, str]:
    """``(namespace, name)`` from an event, apply, result or progress subject; ``("_", "_")`` when it has none."""
    parts = subject.split(".")
    if len(parts) >= 5 and parts[0] == "tj":
        return parts[3], parts[4]
    return "_", "_"
