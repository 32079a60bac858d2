"""Which servers ``tjpipe up`` writes to: its own, unless existing ones are named explicitly."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tjpipe.local.procs import NOT_INHERITED, spawn
from tjpipe.local.stack import AdoptedCluster, Backends, choose_backends, describe_kubeconfig


def _kubeconfig(path: Path, *, server: str = "https://prod.example:6443", context: str = "prod-admin") -> Path:
    path.write_text(
        json.dumps(
            {
                "clusters": [{"name": "prod", "cluster": {"server": server}}],
                "contexts": [{"name": context, "context": {"cluster": "prod", "user": "me"}}],
                "users": [{"name": "me", "user": {"token": "t"}}],
                "current-context": context,
            }
        )
    )
    return path


def test_the_environment_alone_adopts_nothing(tmp_path: Path) -> None:
    environ = {"KUBECONFIG": str(_kubeconfig(tmp_path / "k")), "NATS_URL": "nats://prod:4222"}
    assert choose_backends(environ=environ) == Backends(nats_url=None, cluster=None)


def test_use_env_adopts_what_the_environment_names(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path / "k")
    backends = choose_backends(use_env=True, environ={"KUBECONFIG": str(config), "NATS_URL": "nats://prod:4222"})
    assert backends == Backends(
        nats_url="nats://prod:4222",
        cluster=AdoptedCluster(kubeconfig=config.resolve(), server="https://prod.example:6443", context="prod-admin"),
    )
    assert backends.describe() == [
        "NATS: the EXISTING server(s) nats://prod:4222",
        f"Kubernetes: the EXISTING cluster at https://prod.example:6443, context 'prod-admin' (kubeconfig {config})",
    ]


def test_flags_win_over_the_environment_and_each_backend_is_chosen_alone(tmp_path: Path) -> None:
    named = _kubeconfig(tmp_path / "named", server="https://staging:6443", context="staging")
    environ = {"KUBECONFIG": str(_kubeconfig(tmp_path / "k")), "NATS_URL": "nats://prod:4222"}
    backends = choose_backends(kubeconfig=named, use_env=True, environ=environ)
    assert backends.cluster is not None and backends.cluster.server == "https://staging:6443"
    assert backends.nats_url == "nats://prod:4222"
    only_nats = choose_backends(nats_url="nats://other:4222", environ=environ)
    assert only_nats == Backends(nats_url="nats://other:4222", cluster=None)
    assert only_nats.describe()[1] == "Kubernetes: its own etcd and kube-apiserver on 127.0.0.1 (started now)"


def test_a_kubeconfig_list_or_a_broken_kubeconfig_is_refused(tmp_path: Path) -> None:
    two = os.pathsep.join([str(_kubeconfig(tmp_path / "a")), str(_kubeconfig(tmp_path / "b"))])
    with pytest.raises(ValueError, match="KUBECONFIG names 2 files"):
        choose_backends(use_env=True, environ={"KUBECONFIG": two})
    (tmp_path / "empty").write_text("current-context: gone\n")
    with pytest.raises(ValueError, match="no current context 'gone'"):
        describe_kubeconfig(tmp_path / "empty")
    with pytest.raises(ValueError, match="cannot read kubeconfig"):
        describe_kubeconfig(tmp_path / "missing")


def test_spawned_processes_do_not_inherit_the_users_servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in NOT_INHERITED:
        monkeypatch.setenv(name, f"users-{name}")
    monkeypatch.setenv("TJPIPE_UNRELATED", "kept")
    process = spawn(name="env", argv=["env"], log_dir=tmp_path, env={"KUBECONFIG": "given"})
    assert process.popen.wait(timeout=10) == 0
    lines = set((tmp_path / "env.log").read_text().splitlines())
    assert "KUBECONFIG=given" in lines and "TJPIPE_UNRELATED=kept" in lines
    assert not [line for line in lines if line.startswith("NATS_") or "users-" in line]
