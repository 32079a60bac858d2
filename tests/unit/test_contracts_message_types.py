"""The apply message for each object type is read off the ``ObjectApply`` union, never kept by hand.

The planner turns a component into the message that carries its type, and the applier binds each
component message to the one resource it may write; both must cover every member of the union.
"""

from __future__ import annotations

from typing import get_args

from applier.authorize import COMPONENT_RESOURCES
from contracts import messages as m
from contracts.jobset import JobSet
from contracts.kube import ConfigMap, Secret
from contracts.scheduling import PodGroup, VolcanoPodGroup
from contracts.trainer import TrainJob
from planner import core as planner_core


def test_every_object_apply_member_is_found_by_its_object_type() -> None:
    assert dict(m.MESSAGE_FOR_OBJECT_TYPE) == {
        JobSet: m.ApplyJobSet,
        TrainJob: m.ApplyTrainJobStatus,
        ConfigMap: m.ApplyConfigMap,
        Secret: m.ApplySecret,
        PodGroup: m.ApplyPodGroup,
        VolcanoPodGroup: m.ApplyVolcanoPodGroup,
    }
    assert set(m.MESSAGE_FOR_OBJECT_TYPE.values()) == set(get_args(m.ObjectApply))


def test_the_planner_has_a_message_for_every_component_and_none_for_the_status() -> None:
    components = planner_core._COMPONENT_MESSAGES
    assert set(components.values()) == set(get_args(m.ObjectApply)) - {m.ApplyTrainJobStatus}
    assert TrainJob not in components


def test_the_applier_binds_every_component_message_to_a_resource() -> None:
    assert set(COMPONENT_RESOURCES) == set(get_args(m.ObjectApply)) - {m.ApplyTrainJobStatus}
