"""``contracts.components``: one row per component message, and the watcher's informers made from it."""

from __future__ import annotations

from typing import Any, cast, get_args

import pytest

from applier.authorize import COMPONENT_RESOURCES
from contracts import components, labels, messages, resources
from contracts.components import COMPONENT_KINDS, WATCHED, ComponentKind, Watch
from plumbing.informer import Informer
from plumbing.kube import KubeClient
from plumbing.signing import Signer, generate_private_key
from watcher.service import Watcher, WatcherSettings


def test_every_component_message_has_one_row_and_its_resource_is_the_appliers() -> None:
    assert {kind.message for kind in COMPONENT_KINDS} == set(get_args(messages.ObjectApply)) - {
        messages.ApplyTrainJobStatus
    }
    assert {kind.message: kind.resource for kind in COMPONENT_KINDS} == COMPONENT_RESOURCES


def test_a_table_missing_a_message_or_naming_one_twice_stops_the_import() -> None:
    with pytest.raises(TypeError, match="ApplySecret"):
        components._check(tuple(kind for kind in COMPONENT_KINDS if kind.message is not messages.ApplySecret))
    with pytest.raises(TypeError):
        components._check((*COMPONENT_KINDS, COMPONENT_KINDS[0]))
    twice = ComponentKind(message=messages.ApplyPodGroup, resource=resources.JOBSET, watch=Watch())
    with pytest.raises(TypeError, match="one resource"):
        components._check(tuple(twice if k.message is messages.ApplyPodGroup else k for k in COMPONENT_KINDS))


def test_secrets_are_never_watched() -> None:
    assert resources.SECRET not in {kind.resource for kind in WATCHED}


@pytest.mark.parametrize("namespaces", [(), ("a", "b")])
def test_the_watcher_has_one_informer_per_watched_kind_and_namespace(namespaces: tuple[str, ...]) -> None:
    watcher = Watcher(
        WatcherSettings(nats_url="nats://unused", namespaces=namespaces),
        cast(KubeClient, None),
        cast(Any, None),
        signer=Signer(generate_private_key()),
    )
    informers: list[Informer[Any]] = [*watcher.jobsets, *watcher.config_maps, *watcher.owned]
    expected = [(kind.resource, ns) for kind in WATCHED for ns in namespaces or (None,)]
    assert sorted((inf.resource.plural, inf.resource.api_version, inf.namespace or "") for inf in informers) == sorted(
        (r.plural, r.api_version, ns or "") for r, ns in expected
    )
    (config_maps,) = {inf._label_selector for inf in watcher.config_maps}
    assert config_maps == labels.OWNED_SELECTOR
    assert all(inf._keep is None for inf in watcher.jobsets)
    kept: list[Informer[Any]] = [*watcher.config_maps, *watcher.owned]
    assert all(inf._keep is not None for inf in kept)
    # What the watcher waits for before its first TrainJob event: what observations carry.
    assert watcher._listed_first == [*watcher.jobsets, *watcher.config_maps]
