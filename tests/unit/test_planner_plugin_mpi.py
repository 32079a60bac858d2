"""The MPI plugin through ``planner.core.plan``: SSH-auth Secret, OpenMPI hostfile, counts, mounts and env.

Runtimes here are small hand-written dicts shaped like Trainer v2.3.0's shipped ``deepspeed-distributed``
and ``mlx-distributed`` (``node`` job without ancestor running sshd, ``launcher`` job with the trainer
ancestor, ``runLauncherAsNode``), see ``/work/shared/reference/trainer-v2.3.0.md`` §4 MPI and §7.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest

from contracts import messages as m
from contracts.labels import MANAGED_BY, MANAGED_BY_LABEL
from contracts.trainer import TrainingRuntime, TrainJob
from planner.framework import FieldError
from planner.plugins.mpi import MPI
from planner.runtime_info import new_runtime_info

from .builders import (
    ANCESTOR,
    JOBSET_API,
    Obj,
    components,
    framework,
    jobset_of,
    owner_reference,
    plan_with,
    replicated_job,
    runtime_dict,
    trainjob_dict,
    trainjob_observed,
    validate_with,
)

NAME = "ds"
NAMESPACE = "team-a"
UID = "9f1c-uid"
SEQ = 7
OWNER = owner_reference(NAME, UID)

FW = framework("mpi", "plainml", "torch", "jobset")


# ------------------------------------------------------------------------------------------ fixtures


def mpi_runtime(
    name: str = "deepspeed-distributed",
    image: str = "example.com/deepspeed-runtime",
    *,
    mpi: Obj | None = None,
    launcher_first: bool = False,
    node_resources: Obj | None = None,
) -> Obj:
    """deepspeed-/mlx-distributed: ``node`` (sshd, no ancestor) then ``launcher`` (trainer ancestor)."""
    node_container: Obj = {
        "name": "node",
        "image": image,
        "securityContext": {"runAsUser": 1000},
        "command": ["/usr/sbin/sshd"],
        "args": ["-De", "-f", "/home/mpiuser/.sshd_config"],
        "readinessProbe": {"tcpSocket": {"port": 2222}, "initialDelaySeconds": 5},
    }
    if node_resources is not None:
        node_container["resources"] = node_resources
    node = replicated_job("node", [node_container], pod={"securityContext": {"fsGroup": 1000}})
    launcher = replicated_job(
        "launcher",
        [{"name": "node", "image": image, "securityContext": {"runAsUser": 1000}}],
        ancestor="trainer",
        depends_on=[{"name": "node", "status": "Ready"}],
        pod={"securityContext": {"fsGroup": 1000}},
    )
    policy = {
        "numProcPerNode": 1,
        "mpiImplementation": "OpenMPI",
        "sshAuthMountPath": "/home/mpiuser/.ssh",
        "runLauncherAsNode": True,
    }
    if mpi is not None:
        policy = mpi
    return runtime_dict(
        [launcher, node] if launcher_first else [node, launcher],
        name=name,
        metadata={"labels": {"trainer.kubeflow.org/framework": name.split("-")[0]}},
        ml_policy={"numNodes": 1, "mpi": policy},
        jobset_spec={
            "network": {"publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["launcher"]},
        },
    )


def trainjob(trainer: Obj | None = None, *, runtime: str = "deepspeed-distributed", **spec: Any) -> Obj:
    return trainjob_dict(trainer, name=NAME, namespace=NAMESPACE, uid=UID, runtime=runtime, spec=spec)


def run(job: Obj, rt: Obj) -> m.Plan:
    # As on every plan after the first: the runtime comes from the TrainJob's snapshot, which keeps the
    # snapshot ConfigMap out of these plans.
    return plan_with(FW, trainjob_observed(job, rt, runtime_source="snapshot"), source_seq=SEQ)


def hostfile_of(p: m.Plan) -> str:
    [message] = [a for a in p.applies if isinstance(a, m.ApplyConfigMap)]
    assert message.object.data is not msgspec.UNSET
    return message.object.data["hostfile"]


def pod_spec(js: Obj, job_name: str) -> Obj:
    spec: Obj = next(rj for rj in js["spec"]["replicatedJobs"] if rj["name"] == job_name)["template"]["spec"]
    return spec


def ssh_volume(name: str = NAME) -> Obj:
    return {
        "name": "mpi-ssh-auth",
        "secret": {
            "defaultMode": 0o400,
            "items": [
                {"key": "ssh-privatekey", "mode": 0o640, "path": "id_rsa"},
                {"key": "ssh-publickey", "mode": 0o644, "path": "id_rsa.pub"},
                {"key": "ssh-publickey", "mode": 0o644, "path": "authorized_keys"},
            ],
            "secretName": f"{name}-mpi-ssh-auth",
        },
    }


def hostfile_volume(name: str = NAME) -> Obj:
    return {
        "configMap": {
            "items": [{"key": "hostfile", "mode": 0o444, "path": "hostfile"}],
            "name": f"{name}-mpi-hostfile",
        },
        "name": "mpi-hostfile",
    }


def ompi_env(slots: str) -> list[Obj]:
    return [
        {"name": "OMPI_MCA_orte_default_hostfile", "value": "/etc/mpi/hostfile"},
        {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
        {"name": "OMPI_MCA_orte_set_default_slots", "value": slots},
        {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"},
    ]


def assert_no_key_material(p: m.Plan) -> None:
    for message in p.applies:
        encoded = m.encode(message)
        assert b"PRIVATE KEY" not in encoded
        assert b"ecdsa-sha2" not in encoded
        if isinstance(message, m.ApplySecret):
            assert message.object.data is msgspec.UNSET
            assert message.object.string_data is msgspec.UNSET


# ------------------------------------------------------------------------------- deepspeed: full shape


def test_deepspeed_exact_outputs() -> None:
    job = trainjob(
        {
            "image": "example.com/deepspeed:2",
            "command": ["mpirun"],
            "args": ["--hostfile", "/etc/mpi/hostfile", "python", "train.py"],
            "numNodes": 3,
            "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
        }
    )
    p = run(job, mpi_runtime())

    assert p.warnings == ()
    messages = components(p)
    assert [type(a) for a in messages] == [m.ApplySecret, m.ApplyConfigMap, m.ApplyJobSet]
    secret, config_map, jobset = messages
    assert isinstance(secret, m.ApplySecret)
    assert isinstance(config_map, m.ApplyConfigMap)

    assert secret.policy == "if-absent"
    assert secret.generate == "mpi-ssh-auth"
    assert secret.target == m.Target(api_version="v1", kind="Secret", namespace=NAMESPACE, name="ds-mpi-ssh-auth")
    assert msgspec.to_builtins(secret.object) == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "ds-mpi-ssh-auth",
            "namespace": NAMESPACE,
            "ownerReferences": [OWNER],
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
        },
        "type": "kubernetes.io/ssh-auth",
        "immutable": True,
    }

    assert config_map.policy == "always"
    assert config_map.target == m.Target(
        api_version="v1", kind="ConfigMap", namespace=NAMESPACE, name="ds-mpi-hostfile"
    )
    # Replicated-job order: the two worker pods (numNodes - 1), then the launcher, which trains too.
    assert msgspec.to_builtins(config_map.object) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "ds-mpi-hostfile",
            "namespace": NAMESPACE,
            "ownerReferences": [OWNER],
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
        },
        "data": {"hostfile": "ds-node-0-0.ds slots=1\nds-node-0-1.ds slots=1\nds-launcher-0-0.ds slots=1\n"},
    }

    assert jobset.policy == "while-suspended"
    assert jobset_of(p) == {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "ownerReferences": [OWNER]},
        "spec": {
            "network": {"publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["launcher"]},
            "replicatedJobs": [
                {
                    "name": "node",
                    "template": {
                        "metadata": {},
                        "spec": {
                            "completions": 2,
                            "parallelism": 2,
                            "template": {
                                "metadata": {},
                                "spec": {
                                    "securityContext": {"fsGroup": 1000},
                                    "containers": [
                                        {
                                            "name": "node",
                                            "image": "example.com/deepspeed-runtime",
                                            "securityContext": {"runAsUser": 1000},
                                            "command": ["/usr/sbin/sshd"],
                                            "args": ["-De", "-f", "/home/mpiuser/.sshd_config"],
                                            "readinessProbe": {"tcpSocket": {"port": 2222}, "initialDelaySeconds": 5},
                                            # runLauncherAsNode: the trainer env reaches the workers too.
                                            "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                                            "volumeMounts": [
                                                {"mountPath": "/home/mpiuser/.ssh", "name": "mpi-ssh-auth"}
                                            ],
                                            "resources": {},
                                        }
                                    ],
                                    "volumes": [ssh_volume()],
                                },
                            },
                        },
                    },
                },
                {
                    "name": "launcher",
                    "dependsOn": [{"name": "node", "status": "Ready"}],
                    "replicas": 1,
                    "template": {
                        "metadata": {"labels": {ANCESTOR: "trainer"}},
                        "spec": {
                            "completions": 1,
                            "parallelism": 1,
                            "template": {
                                "metadata": {},
                                "spec": {
                                    "securityContext": {"fsGroup": 1000},
                                    "containers": [
                                        {
                                            "name": "node",
                                            "image": "example.com/deepspeed:2",
                                            "securityContext": {"runAsUser": 1000},
                                            "command": ["mpirun"],
                                            "args": ["--hostfile", "/etc/mpi/hostfile", "python", "train.py"],
                                            "env": [*ompi_env("1"), {"name": "NCCL_DEBUG", "value": "INFO"}],
                                            "volumeMounts": [
                                                {"mountPath": "/home/mpiuser/.ssh", "name": "mpi-ssh-auth"},
                                                {"mountPath": "/etc/mpi", "name": "mpi-hostfile"},
                                            ],
                                            "resources": {},
                                        }
                                    ],
                                    "volumes": [ssh_volume(), hostfile_volume()],
                                },
                            },
                        },
                    },
                },
            ],
        },
    }
    assert_no_key_material(p)


def test_mlx_single_node_still_has_one_worker_and_the_launcher() -> None:
    p = run(trainjob({"numNodes": 1}, runtime="mlx-distributed"), mpi_runtime("mlx-distributed", "example.com/mlx"))
    js = jobset_of(p)
    assert pod_spec(js, "node")["parallelism"] == 1
    assert pod_spec(js, "launcher")["parallelism"] == 1
    assert hostfile_of(p) == "ds-node-0-0.ds slots=1\nds-launcher-0-0.ds slots=1\n"
    assert_no_key_material(p)


def test_without_spec_trainer_counts_and_env_come_from_the_runtime() -> None:
    p = run(trainjob(), mpi_runtime())
    js = jobset_of(p)
    assert pod_spec(js, "node")["parallelism"] == 1
    launcher = pod_spec(js, "launcher")["template"]["spec"]["containers"][0]
    assert launcher["env"] == ompi_env("1")
    assert "command" not in launcher
    assert hostfile_of(p) == "ds-node-0-0.ds slots=1\nds-launcher-0-0.ds slots=1\n"


def test_launcher_listed_first_comes_first_in_the_hostfile() -> None:
    p = run(trainjob({"numNodes": 3}), mpi_runtime(launcher_first=True))
    assert hostfile_of(p) == "ds-launcher-0-0.ds slots=1\nds-node-0-0.ds slots=1\nds-node-0-1.ds slots=1\n"


def test_launcher_not_a_node_gets_the_full_count_and_is_left_out_of_the_hostfile() -> None:
    rt = mpi_runtime(mpi={"numProcPerNode": 2})
    p = run(trainjob({"numNodes": 2, "env": [{"name": "X", "value": "1"}]}), rt)
    js = jobset_of(p)
    assert pod_spec(js, "node")["parallelism"] == 2
    assert hostfile_of(p) == "ds-node-0-0.ds slots=2\nds-node-0-1.ds slots=2\n"
    worker = pod_spec(js, "node")["template"]["spec"]["containers"][0]
    # Defaults: OpenMPI, keys mounted at /root/.ssh; the trainer env stays on the trainer (launcher) only.
    assert worker["volumeMounts"] == [{"mountPath": "/root/.ssh", "name": "mpi-ssh-auth"}]
    assert "env" not in worker
    launcher = pod_spec(js, "launcher")["template"]["spec"]["containers"][0]
    assert launcher["env"] == [*ompi_env("2"), {"name": "X", "value": "1"}]
    assert launcher["volumeMounts"] == [
        {"mountPath": "/root/.ssh", "name": "mpi-ssh-auth"},
        {"mountPath": "/etc/mpi", "name": "mpi-hostfile"},
    ]


# ---------------------------------------------------------------------------------------------- slots


@pytest.mark.parametrize(
    ("runtime_slots", "trainer", "node_resources", "slots"),
    [
        pytest.param(1, {"numProcPerNode": 3}, None, "3", id="trainjob-numProcPerNode-wins"),
        pytest.param(4, {"numProcPerNode": 2}, None, "2", id="trainjob-beats-runtime"),
        pytest.param(
            1, {"resourcesPerNode": {"limits": {"nvidia.com/gpu": "4"}}}, None, "4", id="gpus-of-resourcesPerNode"
        ),
        pytest.param(1, {}, {"limits": {"nvidia.com/gpu": "2"}}, "2", id="gpus-of-runtime-node"),
        pytest.param(1, {"resourcesPerNode": {"limits": {"nvidia.com/gpu": "1"}}}, None, "1", id="one-gpu"),
        pytest.param(2, {"resourcesPerNode": {"limits": {"nvidia.com/gpu": "8"}}}, None, "2", id="runtime-not-1"),
    ],
)
def test_slots(runtime_slots: int, trainer: Obj, node_resources: Obj | None, slots: str) -> None:
    rt = mpi_runtime(mpi={"numProcPerNode": runtime_slots, "runLauncherAsNode": True}, node_resources=node_resources)
    p = run(trainjob(trainer), rt)
    assert hostfile_of(p) == f"ds-node-0-0.ds slots={slots}\nds-launcher-0-0.ds slots={slots}\n"
    launcher = pod_spec(jobset_of(p), "launcher")["template"]["spec"]["containers"][0]
    assert launcher["env"][2] == {"name": "OMPI_MCA_orte_set_default_slots", "value": slots}


def test_slots_are_recorded_on_the_runtime_info() -> None:
    job = msgspec.convert(trainjob({"numProcPerNode": 5}), TrainJob)
    info = new_runtime_info(job, msgspec.convert(mpi_runtime(), TrainingRuntime))
    MPI().enforce_ml_policy(info, job)
    assert info.mpi_slots == 5


# ----------------------------------------------------------------------------------------- validation


def validate(job: Obj, rt: Obj) -> list[FieldError]:
    return validate_with(MPI(), job, rt)


def only_launcher(rt: Obj) -> Obj:
    out = copy.deepcopy(rt)
    jobs = out["spec"]["template"]["spec"]["replicatedJobs"]
    out["spec"]["template"]["spec"]["replicatedJobs"] = [j for j in jobs if j["name"] == "launcher"]
    return out


def test_reserved_env_is_rejected() -> None:
    job = trainjob(
        {
            "env": [
                {"name": "OMPI_MCA_plm_rsh_args", "value": "-x"},
                {"name": "OK", "value": "1"},
                {"name": "OMPI_MCA_orte_default_hostfile", "value": "/h"},
            ]
        }
    )
    expected = FieldError(
        "spec.trainer.env",
        "must not have reserved envs, invalid envs configured: [OMPI_MCA_orte_default_hostfile OMPI_MCA_plm_rsh_args]",
    )
    assert validate(job, mpi_runtime()) == [expected]
    p = run(job, mpi_runtime())
    assert components(p) == []
    assert any(str(expected) in w for w in p.warnings)


def test_two_nodes_need_launcher_and_node_when_the_launcher_trains() -> None:
    expected = FieldError(
        "spec.trainer.numNodes",
        "must have 1 when MPI trainingRuntime with enabled runLauncherAsNode does not have either launcher and node",
    )
    rt = only_launcher(mpi_runtime())
    assert validate(trainjob({"numNodes": 2}), rt) == [expected]
    assert validate(trainjob({"numNodes": 1}), rt) == []
    assert validate(trainjob({"numNodes": 2}), mpi_runtime()) == []
    assert validate(trainjob({"numNodes": 2}), only_launcher(mpi_runtime(mpi={"runLauncherAsNode": False}))) == []
    p = run(trainjob({"numNodes": 2}), rt)
    assert components(p) == []
    assert any(str(expected) in w for w in p.warnings)


@pytest.mark.parametrize("implementation", ["Intel", "MPICH", ""])
def test_only_openmpi_is_supported(implementation: str) -> None:
    rt = mpi_runtime(mpi={"mpiImplementation": implementation, "runLauncherAsNode": True})
    errors = validate(trainjob({"numNodes": 1}), rt)
    assert [e.path for e in errors] == ["spec.runtimeRef"]
    assert repr(implementation) in errors[0].message
    assert components(run(trainjob({"numNodes": 1}), rt)) == []


def test_other_policies_are_left_alone() -> None:
    rt = runtime_dict(
        [replicated_job("node", [{"name": "node", "image": "x"}], ancestor="trainer")],
        name="torch-distributed",
        ml_policy={"numNodes": 1, "torch": {}},
    )
    job = trainjob({"numNodes": 2, "env": [{"name": "OMPI_MCA_plm_rsh_args", "value": "-x"}]}, runtime="torch")
    assert validate(job, rt) == []
    p = run(job, rt)
    assert [type(a) for a in components(p)] == [m.ApplyJobSet]
    assert "mpi" not in m.encode(components(p)[0]).decode()


def test_the_secret_is_rechecked_only_when_someone_changes_the_trainjob() -> None:
    """``ApplySecret.recheck``: the same for every plan of an unchanged TrainJob (its status, resourceVersion
    and JobSet moving on, as after a restart or a resync), new when its spec, labels or annotations change."""

    def recheck(job: Obj) -> str:
        [secret] = [a for a in run(job, mpi_runtime()).applies if isinstance(a, m.ApplySecret)]
        return secret.recheck

    base = trainjob({"numNodes": 2})
    base["metadata"].update(generation=1, resourceVersion="10")
    moved_on = copy.deepcopy(base)
    moved_on["metadata"]["resourceVersion"] = "42"
    moved_on["status"] = {"conditions": [{"type": "Complete", "status": "False", "reason": "x", "message": "y"}]}
    assert recheck(base) and recheck(moved_on) == recheck(base)
    for path, value in (("generation", 2), ("labels", {"touched": "yes"}), ("annotations", {"a": "b"})):
        changed = copy.deepcopy(base)
        changed["metadata"][path] = value
        assert recheck(changed) != recheck(base), path
