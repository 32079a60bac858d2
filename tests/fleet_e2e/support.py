"""What the fleet's end-to-end tests share: the members' names, their namespace, the running world, and the
check that the hub holds every record of every member once (also used by tests/compose's fleet)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from faults.support import Pipeline

from contracts import fleet as fleet_contract
from plumbing import bus_history
from tjpipe.local.cluster import SimulatedCluster
from tjpipe.local.fleet import LocalFleet, LocalMember

CLUSTERS = ("c1", "c2")
NAMESPACE = "team-a"
"""The namespace of every TrainJob here, in both clusters."""
POD_RUN_SECONDS = 3.0


@dataclass
class Member:
    """One member cluster: its simulated cluster, its pipeline, and its nats-server in the fleet."""

    name: str
    cluster: SimulatedCluster
    pipe: Pipeline
    server: LocalMember


@dataclass
class World:
    fleet: LocalFleet
    members: dict[str, Member]


RECORD_STREAMS = tuple(spec.origin for spec in fleet_contract.FLEET_STREAMS)
"""The member streams the hub copies, each into its fleet stream (``contracts.fleet``)."""


def origin_seqs(records: Iterable[bus_history.StoredMessage]) -> dict[str, list[int]]:
    """A fleet stream's records as each member's stream sequences, by cluster (from the subject's name)."""
    by_cluster: dict[str, list[int]] = {}
    for record in records:
        cluster, original = fleet_contract.cluster_of(record.subject)
        assert original.startswith("tj."), record.subject
        by_cluster.setdefault(cluster, []).append(record.origin_seq)
    return by_cluster


def copy_problems(origin: str, at_hub: dict[str, list[int]], held: dict[str, tuple[int, int]]) -> list[str]:
    """What breaks "every record at the hub once" for one member stream: ``held`` is each member's (first,
    last) sequence of it, ``at_hub`` the origin sequences its fleet stream holds per cluster. Each member's
    1..last must be there once: none missing, none twice, none beyond; and no cluster that is not a member."""
    problems = []
    for cluster, (first, last) in held.items():
        if last and first != 1:
            problems.append(f"{cluster} {origin}: its stream dropped records below {first}")
        got = at_hub.get(cluster, [])
        doubles = sorted(seq for seq, n in Counter(got).items() if n > 1)
        missing = sorted(set(range(1, last + 1)) - set(got))
        extra = sorted(set(got) - set(range(1, last + 1)))
        if doubles or missing or extra:
            problems.append(
                f"{cluster} {origin}: member holds 1..{last}, hub {len(got)}: "
                f"missing {missing[:5]}{'…' if len(missing) > 5 else ''} ({len(missing)}), "
                f"twice {doubles[:5]} ({len(doubles)}), beyond the member {extra[:5]}"
            )
    unknown = set(at_hub) - set(held)
    if unknown:
        problems.append(f"{origin}: records under clusters that are not members: {sorted(unknown)}")
    return problems
