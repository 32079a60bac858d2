"""The ``history-retention`` component on top of the history server's: the policy ConfigMap mounted where the
server reads it (and a policy the server accepts), the ``history-keeper`` identity from its own Secret next to
the reader identity, and objects the API server accepts."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from history_server.retention import parse_policy
from tjpipe.local.kustomize import kustomize_build

from . import REPO, cli_env_names, unset_settings
from .test_kustomize import NAMESPACE, Obj, _client_with, _dry_run_each, _named, _progress

NAME = "tjpipe-history-server"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    root = tmp_path_factory.mktemp("history-retention-overlay")
    components = REPO / "deploy" / "components"
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / "deploy" / "base", root)],
        "components": [os.path.relpath(components / c, root) for c in ("history-server", "history-retention")],
    }
    (root / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return kustomize_build(root, progress=_progress)


def test_the_server_reads_the_policy_from_the_configmap_and_purges_as_history_keeper(rendered: list[Obj]) -> None:
    pod = _named(rendered, "Deployment", NAME)["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert set(env) <= cli_env_names()["history-server"], set(env) - cli_env_names()["history-server"]
    assert unset_settings("history-server", env, container["args"], in_cluster=True) == []
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    policy_dir, policy_file = env["TJPIPE_HISTORY_RETENTION_POLICY"].rsplit("/", 1)
    config_map = volumes[mounts[policy_dir]["name"]]["configMap"]["name"]
    keeper = volumes[mounts[env["TJPIPE_HISTORY_RETENTION_CREDS"].rsplit("/", 1)[0]]["name"]]["secret"]
    reader = volumes[mounts[env["NATS_CREDS"].rsplit("/", 1)[0]]["name"]]["secret"]
    assert (keeper["secretName"], reader["secretName"]) == (
        "tjpipe-history-keeper-nats-creds",
        "tjpipe-reader-nats-creds",
    )
    assert keeper["defaultMode"] == 0o440
    assert all(m["readOnly"] for m in container["volumeMounts"] if m["mountPath"] != "/tmp")
    assert "subPath" not in mounts[policy_dir]  # a ConfigMap's update reaches a whole mounted folder only
    shipped = _named(rendered, "ConfigMap", config_map)
    assert shipped["metadata"]["namespace"] == NAMESPACE
    assert parse_policy(shipped["data"][policy_file]).default.keep_for == 7 * 86400.0


@pytest.fixture(scope="module")
def api(kube: Any, rendered: list[Obj]) -> Iterator[tuple[Any, dict[str, dict[str, tuple[str, bool]]]]]:
    yield from _client_with(kube, [_named(rendered, "Namespace", NAMESPACE)])


@pytest.mark.cluster
def test_the_api_server_accepts_every_object(
    rendered: list[Obj], api: tuple[Any, dict[str, dict[str, tuple[str, bool]]]]
) -> None:
    client, known = api
    assert _dry_run_each(client, known, rendered) == ([], [])
