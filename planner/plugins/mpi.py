"""MPI: SSH keys, the OpenMPI hostfile and mpirun's environment, after Trainer's MPI plugin (OpenMPI only).

The launcher reaches every node over SSH, so both the launcher and the nodes mount one key pair, and the
launcher reads the list of nodes from a hostfile. The pod set named ``node`` gets the node count (one
fewer when the launcher trains too, ``runLauncherAsNode``); the trainer env reaches the ``node``
containers through the JobSet builder, not through this plugin, exactly as in Trainer.

The planner never sees a key: the Secret is planned without data, marked ``generate="mpi-ssh-auth"`` and
``if-absent``, and the applier makes the key pair when it creates the Secret, once. The hostfile lists
one line per pod of the node pod sets (and of the launcher when it trains), in replicated-job order:
``<endpoint> slots=<slots>``. Slots are ``spec.trainer.numProcPerNode`` if set; otherwise the runtime's
value, except that a runtime value of 1 becomes the GPU count when a node has more than one GPU.
"""

from __future__ import annotations

import msgspec

from contracts import trainer as t
from contracts.kube import ConfigMap, Secret
from contracts.trainer import MPIMLPolicySource, TrainJob
from contracts.values import is_set, name_of, or_default
from planner.framework import (
    INVALID,
    BuildError,
    ComponentBuilder,
    CustomValidation,
    EnforceMLPolicy,
    FieldError,
    RuntimeGated,
)
from planner.info import Component, PodSet, RuntimeInfo
from planner.merge import Obj, env_value, gpus_per_node, upsert_env, upsert_volume_mounts, upsert_volumes
from planner.owners import owned_metadata
from planner.runtime_info import node_resources, trainer_of

SSH_AUTH_SECRET_TYPE = "kubernetes.io/ssh-auth"
DEFAULT_SSH_AUTH_MOUNT_PATH = "/root/.ssh"
HOSTFILE_ITEM_MODE = 0o444
DEFAULT_NUM_PROC_PER_NODE = 1


def ssh_auth_secret_name(job_name: str) -> str:
    return job_name + t.MPI_SSH_AUTH_SECRET_SUFFIX


def hostfile_config_map_name(job_name: str) -> str:
    return job_name + t.MPI_HOSTFILE_CONFIGMAP_SUFFIX


def _mpi_policy(info: RuntimeInfo) -> MPIMLPolicySource | None:
    policy = info.ml_policy
    if policy is None or not is_set(policy.mpi):
        return None
    return policy.mpi


def _implementation(mpi: MPIMLPolicySource) -> str:
    # The CRD defaults an omitted implementation to OpenMPI; an explicit "" stays "" and is rejected.
    return or_default(mpi.mpi_implementation, t.MPI_IMPLEMENTATION_OPENMPI)


def _launcher_as_node(mpi: MPIMLPolicySource) -> bool:
    return mpi.run_launcher_as_node is True


def _trains(ps: PodSet, launcher_as_node: bool) -> bool:
    """Whether the pod set's pods are MPI hosts, i.e. appear in the hostfile."""
    return ps.name == t.NODE or (launcher_as_node and ps.name == t.LAUNCHER)


def _ssh_auth_volume(job_name: str) -> Obj:
    def item(key: str, path: str, mode: int) -> Obj:
        return {"key": key, "path": path, "mode": mode}

    return {
        "name": t.MPI_SSH_AUTH_VOLUME,
        "secret": {
            "secretName": ssh_auth_secret_name(job_name),
            "defaultMode": t.MPI_SSH_AUTH_DEFAULT_MODE,
            "items": [
                item(t.MPI_SSH_PRIVATE_KEY, t.MPI_SSH_PRIVATE_KEY_FILE, t.MPI_SSH_PRIVATE_KEY_FILE_MODE),
                item(t.MPI_SSH_PUBLIC_KEY, t.MPI_SSH_PUBLIC_KEY_FILE, t.MPI_SSH_PUBLIC_KEY_FILE_MODE),
                item(t.MPI_SSH_PUBLIC_KEY, t.MPI_SSH_AUTHORIZED_KEYS, t.MPI_SSH_PUBLIC_KEY_FILE_MODE),
            ],
        },
    }


def _hostfile_volume(job_name: str) -> Obj:
    return {
        "name": t.MPI_HOSTFILE_VOLUME,
        "configMap": {
            "name": hostfile_config_map_name(job_name),
            "items": [{"key": t.MPI_HOSTFILE_NAME, "path": t.MPI_HOSTFILE_NAME, "mode": HOSTFILE_ITEM_MODE}],
        },
    }


def resolve_slots(info: RuntimeInfo, job: TrainJob, mpi: MPIMLPolicySource) -> int:
    trainer = trainer_of(job)
    if trainer is not None and is_set(trainer.num_proc_per_node):
        return trainer.num_proc_per_node
    runtime_value = or_default(mpi.num_proc_per_node, DEFAULT_NUM_PROC_PER_NODE)
    if runtime_value == 1:
        gpus = gpus_per_node(node_resources(info, job))
        if gpus > 1:
            return gpus
    return runtime_value


# Laid out as every plugin is: name, enabled, then one method per extension point, each first checking
# its policy.
class MPI:
    name = "mpi"

    def enabled(self, info: RuntimeInfo) -> bool:
        return _mpi_policy(info) is not None

    def validate(self, info: RuntimeInfo, job: TrainJob) -> list[FieldError]:
        mpi = _mpi_policy(info)
        if mpi is None:
            return []
        errors: list[FieldError] = []
        implementation = _implementation(mpi)
        if implementation != t.MPI_IMPLEMENTATION_OPENMPI:
            errors.append(
                FieldError(
                    "spec.runtimeRef",
                    f"mlPolicy.mpi.mpiImplementation {implementation!r} is not supported: "
                    f"only {t.MPI_IMPLEMENTATION_OPENMPI} is",
                )
            )
        trainer = trainer_of(job)
        if trainer is None:
            return errors
        if (
            or_default(trainer.num_nodes, 1) >= 2
            and _launcher_as_node(mpi)
            and (info.pod_set_by_name(t.LAUNCHER) is None or info.pod_set_by_name(t.NODE) is None)
        ):
            errors.append(
                FieldError(
                    "spec.trainer.numNodes",
                    "must have 1 when MPI trainingRuntime with enabled runLauncherAsNode "
                    "does not have either launcher and node",
                )
            )
        reserved = sorted({e.name for e in or_default(trainer.env, []) if e.name in t.MPI_RESERVED_ENV_NAMES})
        if reserved:
            errors.append(
                FieldError(
                    "spec.trainer.env",
                    f"must not have reserved envs, invalid envs configured: [{' '.join(reserved)}]",
                    kind=INVALID,
                    value=msgspec.to_builtins(trainer.env),
                )
            )
        return errors

    def enforce_ml_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        mpi = _mpi_policy(info)
        if mpi is None:
            return
        implementation = _implementation(mpi)
        if implementation != t.MPI_IMPLEMENTATION_OPENMPI:
            raise BuildError(f"MPI implementation {implementation!r} is not supported")
        launcher_as_node = _launcher_as_node(mpi)
        trainer = trainer_of(job)
        if trainer is not None and is_set(trainer.num_nodes):
            node_ps = info.pod_set_by_name(t.NODE)
            if node_ps is not None:
                node_ps.count = max(trainer.num_nodes - 1, 1) if launcher_as_node else trainer.num_nodes

        slots = resolve_slots(info, job, mpi)
        info.mpi_slots = slots

        job_name = name_of(job)
        mount_path = or_default(mpi.ssh_auth_mount_path, DEFAULT_SSH_AUTH_MOUNT_PATH)
        for ps in info.pod_sets:
            if ps.name not in (t.NODE, t.LAUNCHER):
                continue
            is_launcher = ps.name == t.LAUNCHER
            upsert_volumes(ps.volumes, [_ssh_auth_volume(job_name)])
            if is_launcher:
                upsert_volumes(ps.volumes, [_hostfile_volume(job_name)])
            for container in ps.containers:
                if container.name != t.NODE:
                    continue
                upsert_volume_mounts(
                    container.volume_mounts, [{"name": t.MPI_SSH_AUTH_VOLUME, "mountPath": mount_path}]
                )
                if not is_launcher:
                    continue
                upsert_volume_mounts(
                    container.volume_mounts, [{"name": t.MPI_HOSTFILE_VOLUME, "mountPath": t.MPI_HOSTFILE_DIR}]
                )
                upsert_env(
                    container.env,
                    [
                        env_value(t.OPENMPI_ENV_HOSTFILE, f"{t.MPI_HOSTFILE_DIR}/{t.MPI_HOSTFILE_NAME}"),
                        env_value(t.OPENMPI_ENV_KEEP_FQDN_HOSTNAMES, "true"),
                        env_value(t.OPENMPI_ENV_DEFAULT_SLOTS, str(slots)),
                        env_value(t.OPENMPI_ENV_RSH_ARGS, t.OPENMPI_RSH_ARGS_DEFAULT),
                    ],
                )

    def sync_parallel_count(self, info: RuntimeInfo) -> None:
        return None

    def build(self, info: RuntimeInfo, job: TrainJob) -> list[Component]:
        mpi = _mpi_policy(info)
        if mpi is None:
            return []
        return [
            Component(object=self._ssh_auth_secret(job), policy="if-absent", generate="mpi-ssh-auth"),
            Component(object=self._hostfile(info, job, mpi)),
        ]

    @staticmethod
    def _ssh_auth_secret(job: TrainJob) -> Secret:
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": owned_metadata(job, ssh_auth_secret_name(name_of(job))),
            "type": SSH_AUTH_SECRET_TYPE,
            "immutable": True,
        }
        return msgspec.convert(body, Secret)

    @staticmethod
    def _hostfile(info: RuntimeInfo, job: TrainJob, mpi: MPIMLPolicySource) -> ConfigMap:
        launcher_as_node = _launcher_as_node(mpi)
        slots = info.mpi_slots if info.mpi_slots is not None else or_default(mpi.num_proc_per_node, 1)
        lines: list[str] = []
        for ps in info.pod_sets:
            if not _trains(ps, launcher_as_node):
                continue
            if ps.endpoints is None:
                raise BuildError(f"pod set {ps.name!r} has no endpoints: no pod network plugin ran")
            lines.extend(f"{endpoint} slots={slots}\n" for endpoint in ps.endpoints())
        body: Obj = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": owned_metadata(job, hostfile_config_map_name(name_of(job))),
            "data": {t.MPI_HOSTFILE_NAME: "".join(lines)},
        }
        return msgspec.convert(body, ConfigMap)


# The extension points MPI implements, checked by mypy as the Go compiler checks Trainer's
# ``var _ framework.<Point>Plugin = (*MPI)(nil)``; tests/unit/test_planner_plugin_phases.py ties them to the phases.
_implements_validation: CustomValidation = MPI()
_implements_ml_policy: EnforceMLPolicy = MPI()
_implements_builder: ComponentBuilder = MPI()
_implements_gate: RuntimeGated = MPI()
