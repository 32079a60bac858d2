"""``plan --from-cluster`` and ``--server-dry-run`` as subprocesses on the real kube-apiserver, ``--context``
choosing between a kubeconfig's contexts, and the exit codes of each outcome."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import dynamic

from .support import SDK_COMMAND, TRAINER, closed_port, runtime, tjpipe, trainjob

pytestmark = [pytest.mark.cluster]


@pytest.fixture(scope="module")
def runtime_name(kube: Any) -> str:
    """A ClusterTrainingRuntime of this module's own on the session's apiserver."""
    name = "cli-tiny-" + os.urandom(3).hex()
    body = runtime(name)
    dyn = dynamic.DynamicClient(kube.api_client())
    dyn.resources.get(api_version=TRAINER, kind="ClusterTrainingRuntime").create(body=body)
    return name


@pytest.fixture
def two_contexts(kube: Any, tmp_path: Path) -> Path:
    """The session's kubeconfig with a second context, ``gone``, made current: its server is a closed port."""
    config = yaml.safe_load(Path(kube.kubeconfig).read_text())
    working = config["current-context"]
    config["clusters"].append({"name": "gone", "cluster": {"server": f"https://127.0.0.1:{closed_port()}"}})
    user = config["contexts"][0]["context"]["user"]
    config["contexts"].append({"name": "gone", "context": {"cluster": "gone", "user": user}})
    config["current-context"] = "gone"
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    (tmp_path / "working-context").write_text(working)
    return path


def _job_file(tmp_path: Path, namespace: str, runtime_name: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(trainjob("sdk", namespace, runtime_name)))
    return path


def test_plan_reads_the_runtime_from_the_cluster_of_the_chosen_context(
    kube: Any, namespace: str, runtime_name: str, two_contexts: Path, tmp_path: Path
) -> None:
    job = _job_file(tmp_path, namespace, runtime_name)
    env = {"KUBECONFIG": str(two_contexts)}
    working = (tmp_path / "working-context").read_text()

    done = tjpipe("plan", "-f", str(job), "--from-cluster", "--context", working, env=env)
    assert (done.returncode, done.stderr) == (0, "")
    objects = [d for d in yaml.safe_load_all(done.stdout) if d]
    jobset = next(o for o in objects if o["kind"] == "JobSet")
    container = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == SDK_COMMAND and container["image"] == "busybox"
    assert "                x = batch[i]\n" in done.stdout

    current = tjpipe("plan", "-f", str(job), "--from-cluster", "--connect-timeout", "2", env=env)
    assert (current.returncode, current.stdout) == (4, "")
    assert current.stderr.startswith("error: cannot reach the apiserver at https://127.0.0.1:"), current.stderr

    missing = tjpipe(
        "plan",
        "-f",
        "-",
        "--from-cluster",
        "--context",
        working,
        env=env,
        stdin=yaml.safe_dump(trainjob("sdk", namespace, "no-such-runtime")),
    )
    assert (missing.returncode, missing.stdout, missing.stderr) == (
        3,
        "",
        "error: ClusterTrainingRuntime 'no-such-runtime' (spec.runtimeRef) is not in the cluster\n",
    )


def test_server_dry_run_diffs_and_exits_1_when_the_cluster_would_change(
    kube: Any, namespace: str, runtime_name: str, tmp_path: Path
) -> None:
    job = _job_file(tmp_path, namespace, runtime_name)
    env = {"KUBECONFIG": str(kube.kubeconfig)}
    done = tjpipe("plan", "-f", str(job), "--from-cluster", "--server-dry-run", "-o", "json", env=env)
    assert (done.returncode, done.stderr) == (1, "")
    rows = json.loads(done.stdout)
    assert done.stdout == json.dumps(rows, indent=2, ensure_ascii=False) + "\n"
    by_kind = {row["target"].split(" ")[0]: row for row in rows}
    assert by_kind["JobSet"] == {"target": f"JobSet {namespace}/sdk", "result": "created", "changes": []}
    assert by_kind["ConfigMap"]["result"] == "created"

    human = tjpipe("plan", "-f", str(job), "--from-cluster", "--server-dry-run", env=env)
    assert (human.returncode, human.stderr) == (1, "")
    assert f"JobSet {namespace}/sdk: would be created\n" in human.stdout
    # dryRun=All: nothing was written.
    dyn = dynamic.DynamicClient(kube.api_client())
    jobsets = dyn.resources.get(api_version="jobset.x-k8s.io/v1alpha2", kind="JobSet")
    assert jobsets.get(namespace=namespace).items == []
