"""What the fleet's end-to-end tests share: the members' names, their namespace, and the running world."""

from __future__ import annotations

from dataclasses import dataclass

from faults.support import Pipeline

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
