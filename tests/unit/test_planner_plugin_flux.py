"""The Flux plugin through ``planner.core.plan``: installer init container, volumes, wrapped command,
the entrypoint ConfigMap and the (data-less) CURVE Secret.

The runtime is shaped like Trainer v2.3.0's Flux test fixtures and ``flux-distributed`` example: one
``node`` job with the trainer ancestor and a ``node`` container. The two scripts must be Trainer's text
byte for byte; their expected SHA-256 digests were computed by rendering Trainer's own templates with Go's
``fmt.Sprintf`` for the same inputs (a one-off check, not a test dependency).
"""

from __future__ import annotations

import hashlib

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric import x25519

from applier.secrets import curve_certificate
from contracts import messages as m
from contracts.labels import MANAGED_BY, MANAGED_BY_LABEL
from planner.framework import FieldError
from planner.plugins.flux import FLUX_VIEW_IMAGE_DEFAULT, Flux, hostlist, index_range

from .builders import (
    ANCESTOR,
    JOBSET_API,
    Obj,
    components,
    framework,
    jobset_of,
    owner_reference,
    plan_with,
    pod_spec,
    replicated_job,
    runtime_dict,
    trainjob_dict,
    trainjob_observed,
    validate_with,
)

FW = framework("flux", "plainml", "torch", "jobset")
OWNER = owner_reference("test-job", "test-uid")

# sha256 of Trainer's templates rendered for: test-job/default, 2 nodes, 1 task per node, no GPU, eth0, fcfs.
INIT_SHA_TEST_JOB = "b8a9b80ca20b593ac89c46527d09bdb9dde6557d3d30057dc5139619f9d49bc1"
ENTRYPOINT_SHA_TEST_JOB = "ea78e4de849cb2fae997cfa3a637bad0cbb87bf4228d456b952bd6ed4219c143"
# ... and for: lammps/team-a, 4 nodes, 3 tasks per node, 2 GPUs, net1, easy.
INIT_SHA_LAMMPS = "b0ddf993705c7259eef4704f6352cc58e0c572383287f75c0cba0a42cd40065c"
ENTRYPOINT_SHA_LAMMPS = "ec67413c0ed248536f64ad07385b5dee136d9df30b1920fa804c9c7f92d095e1"


# ------------------------------------------------------------------------------------------ fixtures


def flux_runtime(node: Obj | None = None, *, flux: Obj | None = None, init_containers: list[Obj] | None = None) -> Obj:
    container = node if node is not None else {"name": "node", "image": "example.com/ubuntu:jammy"}
    return runtime_dict(
        [replicated_job("node", [container], ancestor="trainer", init_containers=init_containers)],
        name="flux-distributed",
        ml_policy={"numNodes": 1, "flux": flux if flux is not None else {"numProcPerNode": 1}},
    )


def trainjob(
    trainer: Obj | None = None, *, name: str = "test-job", namespace: str = "default", uid: str = "test-uid"
) -> Obj:
    return trainjob_dict(trainer, name=name, namespace=namespace, uid=uid, runtime="flux-distributed")


def run(job: Obj, rt: Obj) -> m.Plan:
    return plan_with(FW, trainjob_observed(job, rt, runtime_source="snapshot"), source_seq=3)


def scripts_of(p: m.Plan) -> dict[str, str]:
    [message] = [a for a in p.applies if isinstance(a, m.ApplyConfigMap)]
    assert message.object.data is not msgspec.UNSET
    return dict(message.object.data)


def node_pod(p: m.Plan) -> Obj:
    return pod_spec(jobset_of(p), "node")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def assert_no_key_material(p: m.Plan, *, name: str, uid: str) -> None:
    """No certificate in the plan, and not even the key Trainer would derive from the UID."""
    trainers = x25519.X25519PrivateKey.from_private_bytes(hashlib.sha256(uid.encode()).digest())
    cert = curve_certificate(trainjob_name=name, secret=trainers).decode()
    keys = [line.split('"')[1] for line in cert.splitlines() if "-key = " in line]
    assert len(keys) == 2
    for message in p.applies:
        encoded = m.encode(message).decode()
        assert "PRIVATE KEY" not in encoded
        assert "ZeroMQ CURVE" not in encoded
        for key in keys:
            assert key not in encoded
        if isinstance(message, m.ApplySecret):
            assert message.object.data is msgspec.UNSET
            assert message.object.string_data is msgspec.UNSET


# ------------------------------------------------------------------------------ upstream fixture shape


def test_flux_exact_outputs() -> None:
    p = run(trainjob({"numNodes": 2}), flux_runtime())
    assert p.warnings == ()
    messages = components(p)
    assert [type(a) for a in messages] == [m.ApplyConfigMap, m.ApplySecret, m.ApplyJobSet]
    config_map, secret, _ = messages
    assert isinstance(config_map, m.ApplyConfigMap)
    assert isinstance(secret, m.ApplySecret)

    assert config_map.policy == "always"
    assert config_map.target == m.Target(
        api_version="v1", kind="ConfigMap", namespace="default", name="test-job-flux-entrypoint"
    )
    cm = msgspec.to_builtins(config_map.object)
    assert list(cm["data"]) == ["entrypoint.sh", "init.sh"]
    assert sha(cm["data"]["init.sh"]) == INIT_SHA_TEST_JOB
    assert sha(cm["data"]["entrypoint.sh"]) == ENTRYPOINT_SHA_TEST_JOB
    cm["data"] = {}
    assert cm == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "test-job-flux-entrypoint",
            "namespace": "default",
            "ownerReferences": [OWNER],
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
        },
        "data": {},
    }

    # Random key, created once (Trainer derives it from the UID and applies it every reconcile).
    assert secret.policy == "if-absent"
    assert secret.generate == "flux-curve"
    assert secret.target == m.Target(api_version="v1", kind="Secret", namespace="default", name="test-job-flux-curve")
    assert msgspec.to_builtins(secret.object) == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "test-job-flux-curve",
            "namespace": "default",
            "ownerReferences": [OWNER],
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
        },
    }

    config_mount = {"mountPath": "/etc/flux-config", "name": "test-job-flux-entrypoint", "readOnly": True}
    assert jobset_of(p) == {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": {"name": "test-job", "namespace": "default", "ownerReferences": [OWNER]},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "node",
                    "replicas": 1,
                    "template": {
                        "metadata": {"labels": {ANCESTOR: "trainer"}},
                        "spec": {
                            "completions": 2,
                            "parallelism": 2,
                            "template": {
                                "metadata": {},
                                "spec": {
                                    "containers": [
                                        {
                                            "name": "node",
                                            "image": "example.com/ubuntu:jammy",
                                            # No command anywhere: the wrapped command is empty.
                                            "command": ["/bin/bash", "/etc/flux-config/entrypoint.sh", ""],
                                            "volumeMounts": [
                                                {"mountPath": "/mnt/flux", "name": "flux-install"},
                                                {"mountPath": "/opt/software", "name": "spack-install"},
                                                config_mount,
                                                {"mountPath": "/curve", "name": "flux-curve", "readOnly": True},
                                                {"mountPath": "/dev/shm", "name": "shared-memory", "readOnly": True},
                                            ],
                                            "resources": {},
                                        }
                                    ],
                                    "initContainers": [
                                        {
                                            "name": "flux-installer",
                                            "image": FLUX_VIEW_IMAGE_DEFAULT,
                                            "command": ["/bin/bash", "/etc/flux-config/init.sh"],
                                            "volumeMounts": [
                                                {"mountPath": "/mnt/flux", "name": "flux-install"},
                                                config_mount,
                                            ],
                                            "resources": {},
                                        }
                                    ],
                                    "volumes": [
                                        {"emptyDir": {}, "name": "spack-install"},
                                        {"emptyDir": {}, "name": "flux-install"},
                                        {
                                            "configMap": {"defaultMode": 0o755, "name": "test-job-flux-entrypoint"},
                                            "name": "test-job-flux-entrypoint",
                                        },
                                        {"emptyDir": {"medium": "Memory"}, "name": "shared-memory"},
                                        {
                                            "name": "flux-curve",
                                            "secret": {"defaultMode": 0o400, "secretName": "test-job-flux-curve"},
                                        },
                                    ],
                                },
                            },
                        },
                    },
                }
            ]
        },
    }
    assert_no_key_material(p, name="test-job", uid="test-uid")


def test_default_installer_image_is_trainers() -> None:
    assert FLUX_VIEW_IMAGE_DEFAULT.endswith("/converged-computing/flux-view-ubuntu:tag-jammy")


def test_scripts_for_the_default_fixture_read_as_expected() -> None:
    scripts = scripts_of(run(trainjob({"numNodes": 2}), flux_runtime()))
    init = scripts["init.sh"].splitlines()
    assert "fluxroot=/opt/view" in init
    assert "mainHost=test-job-0" in init
    assert 'hosts="test-job-node-0-[0-1]"' in init
    assert 'default_bind = "tcp://eth0:%p"' in init
    assert 'default_connect = "tcp://%h.test-job.default.svc.cluster.local:%p"' in init
    assert '{ host="test-job-node-0-[0-1]"},' in init
    assert 'queue-policy = "fcfs"' in init
    entrypoint = scripts["entrypoint.sh"].splitlines()
    assert "flux R encode --hosts=${hosts} --cores=0 > /tmp/R" in entrypoint
    assert 'mainHost="test-job-node-0-0"' in entrypoint
    assert '    flags="-N 2 -n 2  "' in entrypoint
    assert scripts["entrypoint.sh"].endswith("touch $viewbase/flux-operator-complete.txt\n")


# ----------------------------------------------------------------------- settings, GPUs and commands


def test_gpus_tasks_and_settings_from_runtime_env_then_trainjob_env() -> None:
    rt = flux_runtime(
        {
            "name": "node",
            "image": "example.com/lammps",
            "command": ["lmp"],
            "env": [
                {"name": "FLUX_NETWORK_DEVICE", "value": "net1"},
                {"name": "FLUX_QUEUE_POLICY", "value": "fcfs"},
                {"name": "FLUX_VIEW_IMAGE", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
            ],
        }
    )
    job = trainjob(
        {
            "numNodes": 4,
            "numProcPerNode": 3,
            "args": ["-in", "in.reaxff"],
            "resourcesPerNode": {"limits": {"nvidia.com/gpu": "2"}},
            "env": [
                {"name": "FLUX_QUEUE_POLICY", "value": "easy"},
                {"name": "FLUX_VIEW_IMAGE", "value": "example.com/flux-view-rocky:tag-9"},
            ],
        },
        name="lammps",
        namespace="team-a",
        uid="lammps-uid",
    )
    p = run(job, rt)
    scripts = scripts_of(p)
    assert sha(scripts["init.sh"]) == INIT_SHA_LAMMPS
    assert sha(scripts["entrypoint.sh"]) == ENTRYPOINT_SHA_LAMMPS
    assert "flux R encode --hosts=${hosts} --cores=0-2 --gpu=0-1 > /tmp/R" in scripts["entrypoint.sh"]
    assert '    flags="-N 4 -n 12 -g 2  "' in scripts["entrypoint.sh"]

    pod = node_pod(p)
    [installer] = pod["initContainers"]
    assert installer["image"] == "example.com/flux-view-rocky:tag-9"
    [node] = pod["containers"]
    assert node["command"] == ["/bin/bash", "/etc/flux-config/entrypoint.sh", "lmp -in in.reaxff"]
    assert "args" not in node
    assert_no_key_material(p, name="lammps", uid="lammps-uid")


def test_trainjob_command_and_args_are_joined_and_trimmed() -> None:
    rt = flux_runtime({"name": "node", "image": "x", "command": ["ignored"], "args": ["kept-by-the-runtime"]})
    job = trainjob({"numNodes": 1, "command": ["  python  "], "args": [" script.py "]})
    [node] = node_pod(run(job, rt))["containers"]
    assert node["command"] == ["/bin/bash", "/etc/flux-config/entrypoint.sh", "python    script.py"]
    # Trainer clears only the TrainJob's args; the runtime's own args stay on the container.
    assert node["args"] == ["kept-by-the-runtime"]


def test_one_node_one_task() -> None:
    scripts = scripts_of(run(trainjob({"numNodes": 1}), flux_runtime(flux={})))
    assert 'hosts="test-job-node-0-[0]"' in scripts["init.sh"]
    assert '    flags="-N 1 -n 1  "' in scripts["entrypoint.sh"]
    assert "--cores=0 > /tmp/R" in scripts["entrypoint.sh"]


def test_without_spec_trainer_the_policy_node_count_and_runtime_command_are_used() -> None:
    rt = flux_runtime({"name": "node", "image": "x", "command": ["lmp", "-in", "in.lj"]})
    p = run(trainjob(), rt)
    assert p.warnings == ()
    scripts = scripts_of(p)
    assert 'hosts="test-job-node-0-[0]"' in scripts["init.sh"]
    [node] = node_pod(p)["containers"]
    assert node["command"] == ["/bin/bash", "/etc/flux-config/entrypoint.sh", "lmp -in in.lj"]


def test_runtime_init_containers_keep_their_slots() -> None:
    rt = flux_runtime(init_containers=[{"name": "fetch", "image": "example.com/fetch"}])
    pod = node_pod(run(trainjob({"numNodes": 2}), rt))
    assert [c["name"] for c in pod["initContainers"]] == ["fetch", "flux-installer"]
    assert pod["initContainers"][0] == {"name": "fetch", "image": "example.com/fetch", "resources": {}}


# ----------------------------------------------------------------------------------------- validation


def validate(job: Obj, rt: Obj) -> list[FieldError]:
    return validate_with(Flux(), job, rt)


NPROC_ERROR = FieldError("spec.trainer.numProcPerNode", "must be greater than or equal to 1 for Flux TrainJob")


@pytest.mark.parametrize(
    ("flux", "trainer", "errors"),
    [
        pytest.param({}, None, [], id="defaults"),
        pytest.param({"numProcPerNode": 0}, None, [NPROC_ERROR], id="runtime-zero"),
        pytest.param({"numProcPerNode": 1}, {"numProcPerNode": 0}, [NPROC_ERROR], id="trainjob-zero"),
        pytest.param({"numProcPerNode": 0}, {"numProcPerNode": 2}, [], id="trainjob-overrides-runtime"),
    ],
)
def test_num_proc_per_node_must_be_positive(flux: Obj, trainer: Obj | None, errors: list[FieldError]) -> None:
    assert validate(trainjob(trainer), flux_runtime(flux=flux)) == errors


def test_flux_installer_init_container_is_reserved() -> None:
    rt = flux_runtime(init_containers=[{"name": "flux-installer", "image": "x"}])
    expected = FieldError("spec.trainer.initContainers", "InitContainer 'flux-installer' is reserved")
    assert validate(trainjob({"numNodes": 1}), rt) == [expected]
    p = run(trainjob({"numNodes": 1}), rt)
    assert components(p) == []
    assert any(str(expected) in w for w in p.warnings)


def test_other_policies_are_left_alone() -> None:
    rt = flux_runtime()
    rt["spec"]["mlPolicy"] = {"numNodes": 1, "torch": {}}
    assert validate(trainjob({"numProcPerNode": 0}), rt) == []
    encoded = b"".join(m.encode(a) for a in components(run(trainjob({"numNodes": 1}), rt)))
    assert b"flux" not in encoded


# ------------------------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(("size", "start", "want"), [(1, 0, "0"), (4, 0, "0-3"), (3, 10, "10-12")])
def test_index_range(size: int, start: int, want: str) -> None:
    assert index_range(size, start) == want


@pytest.mark.parametrize(
    ("prefix", "size", "want"),
    [("lammps-job", 1, "lammps-job-node-0-[0]"), ("flux-cluster", 4, "flux-cluster-node-0-[0-3]")],
)
def test_hostlist(prefix: str, size: int, want: str) -> None:
    assert hostlist(prefix, size) == want
