"""A fleet's vocabulary: the hub's fleet streams, their subjects, and the rules for a cluster's name.

A fleet is one hub and many member clusters. A member keeps its bus exactly as a lone cluster has it
(``contracts.streams``, ``contracts.subjects``): the hub copies the member's record streams into its own
fleet streams with JetStream stream sources across JetStream domains, so nothing of a member changes when
it joins. Each source has a subject transform that puts the cluster's name in front of every subject, so at
the hub a record of cluster ``c1`` is stored as ``fleet.c1.<the subject it had in c1>``: no record of one
cluster can be stored, filtered or read under another's name, and a member's own subject scheme (the
partitions, the escaping of names) carries over unchanged.

Why one fleet stream per member and kind of record (``FLEET_RESULTS_c1``), and not one per kind for every
member: a stream's byte limit is the only quota JetStream enforces, and a stream at its limit drops its
oldest records whoever sent them, so in a shared stream one member's flood pushes every other member's
history out. Per member, each has its own quota (``fleet_stream``). A reader still finds a TrainJob in one
stream, named by the cluster, by a literal subject that names the cluster too; a member joining is one more
stream of each kind.

A cluster's name is also its JetStream domain (``$JS.<name>.API``), so it obeys the server's rule for a
domain (no ``.``, ``*``, ``>`` or whitespace) and is one subject token. Kubernetes does not name clusters,
so the operator does; a DNS label (lowercase letters, digits, ``-``) is asked for, which fits both.
"""

from __future__ import annotations

import re

import msgspec

from contracts import streams

PREFIX = "fleet"
"""First token of every record stored at the hub: ``fleet.<cluster>.<original subject>``."""
DELIVER_PREFIX = "fleet-deliver"
"""Where a member's JetStream delivers the copies the hub asked for: ``fleet-deliver.<cluster>.<stream>``.

Its own first token, so that no cluster name can make a delivery subject look like a stored record."""
HUB_DOMAIN = "hub"
"""The hub's JetStream domain, unless the operator names it otherwise."""

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class FleetNameError(ValueError):
    """A cluster name that cannot be a JetStream domain and a subject token."""


def check_cluster_name(name: str) -> str:
    """``name`` if it is a DNS label (1-63 of ``a-z``, ``0-9``, ``-``, not starting or ending with ``-``)."""
    if not _NAME.fullmatch(name):
        raise FleetNameError(
            f"cluster name {name!r} is not a DNS label (lowercase letters, digits and '-', at most 63): "
            "it is the cluster's JetStream domain and one token of its subjects at the hub"
        )
    if name == HUB_DOMAIN:
        raise FleetNameError(f"cluster name {name!r} is the hub's own JetStream domain")
    return name


class FleetStreamSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One kind of record at the hub: each member's copies in a stream of its own (``fleet_stream``)."""

    name: str
    """The kind's name, ``FLEET_<KIND>``; a member's stream of it is ``FLEET_<KIND>_<cluster>``."""
    origin: str
    """The member's record stream it copies (``contracts.streams.RECORD_STREAMS``)."""
    origin_filter: str
    """Every subject of the origin stream; with the cluster's name in front, what the copy is stored under."""
    description: str
    max_age_seconds: float
    member_max_bytes: int
    """A member's quota at the hub: the byte limit of its stream of this kind (the origin's own limit)."""
    max_msgs_per_subject: int = -1
    """The origin's limit per subject; at the hub a subject is one member's one TrainJob, so it holds there too."""


def _origin_subjects(spec: streams.StreamSpec) -> str:
    """The one subject filter that matches every message of ``spec`` (its own, or its source's)."""
    if spec.subjects:
        (subject,) = spec.subjects
        return subject
    (source,) = spec.sources
    (subject,) = next(s for s in streams.ALL_STREAMS if s.name == source).subjects
    return subject


FLEET_STREAMS: tuple[FleetStreamSpec, ...] = tuple(
    FleetStreamSpec(
        name=f"FLEET_{spec.name.removeprefix('TJ_')}",
        origin=spec.name,
        origin_filter=_origin_subjects(spec),
        description=f"{spec.description}, of one cluster of the fleet, under fleet.<cluster>.",
        max_age_seconds=spec.max_age_seconds,
        member_max_bytes=spec.max_bytes,
        max_msgs_per_subject=spec.max_msgs_per_subject,
    )
    for spec in streams.RECORD_STREAMS
)
"""``FLEET_EVENTS_HISTORY``, ``FLEET_APPLY_HISTORY``, ``FLEET_RESULTS``, ``FLEET_DLQ``, ``FLEET_PROGRESS``."""

FLEET_OF = {spec.origin: spec.name for spec in FLEET_STREAMS}
"""A member's record stream → the kind of fleet stream that holds its copies (``fleet_stream`` names one)."""


def fleet_stream(origin: str, cluster: str) -> str:
    """The hub's stream holding member ``cluster``'s copies of its record stream ``origin``.

    Why one stream per member and kind, and not one per kind for every member: a stream's byte limit is the
    only quota JetStream enforces on what it stores, and a stream at its limit drops its oldest records,
    whoever sent them. One stream per member gives each member its own quota (its own stream's limit), so a
    member that floods the hub drops only its own oldest copies, never another member's."""
    return f"{FLEET_OF[origin]}_{check_cluster_name(cluster)}"


def stream_of(name: str) -> tuple[FleetStreamSpec, str] | None:
    """``(kind, cluster)`` of a fleet stream's name (``fleet_stream``); None for any other name."""
    for spec in FLEET_STREAMS:
        prefix = f"{spec.name}_"
        if name.startswith(prefix) and _NAME.fullmatch(name[len(prefix) :]) and name[len(prefix) :] != HUB_DOMAIN:
            return spec, name[len(prefix) :]
    return None


def fleet_subject(cluster: str, subject: str) -> str:
    """Where the hub stores a record that had ``subject`` in ``cluster``."""
    return f"{PREFIX}.{cluster}.{subject}"


def transform(cluster: str, spec: FleetStreamSpec) -> tuple[str, str]:
    """The source's subject transform for ``cluster``: (what it takes, what it stores it as)."""
    return spec.origin_filter, fleet_subject(cluster, spec.origin_filter)


def deliver_subject(cluster: str, spec: FleetStreamSpec) -> str:
    """The prefix a member's JetStream delivers ``spec``'s copies under (``external.deliver``)."""
    return f"{DELIVER_PREFIX}.{cluster}.{spec.origin}"


def api_prefix(domain: str) -> str:
    """The JetStream API of ``domain`` as seen from across a leaf link."""
    return f"$JS.{domain}.API"


def cluster_of(subject: str) -> tuple[str, str]:
    """``(cluster, original subject)`` of a subject stored at the hub; ``("", subject)`` when it is not one."""
    head, _, rest = subject.partition(".")
    cluster, _, original = rest.partition(".")
    if head != PREFIX or not cluster or not original:
        return "", subject
    return cluster, original
