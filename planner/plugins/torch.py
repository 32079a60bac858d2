"""Torch: torchrun's ``PET_*`` rendezvous environment, the trainer port, and envInjection targets.

``PET_NPROC_PER_NODE`` follows Trainer: the TrainJob's value if given, otherwise ``auto`` when the node has
GPUs, otherwise the CPU count (at least 1). The GPU and CPU counts come from ``resourcesPerNode`` as a
whole when the TrainJob sets it, else from the runtime's ``node`` container.
"""

from __future__ import annotations

from contracts import trainer as t
from contracts.trainer import TrainJob
from contracts.values import is_set, name_of, or_default
from planner.framework import FieldError
from planner.info import RuntimeInfo
from planner.merge import (
    Obj,
    cpus_per_node,
    env_field_ref,
    env_value,
    gpus_per_node,
    upsert_env,
    upsert_ports,
)
from planner.runtime_info import builtins, spec_of


def node_resources(info: RuntimeInfo, job: TrainJob) -> Obj | None:
    """resourcesPerNode of the TrainJob if set, else the runtime's trainer ``node`` container resources."""
    trainer = or_default(spec_of(job).trainer, None)
    if trainer is not None and is_set(trainer.resources_per_node):
        resources: Obj = builtins(trainer.resources_per_node)
        return resources
    for rjob in info.jobset_spec.get("replicatedJobs") or []:
        labels = ((rjob.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if rjob.get("name") == t.NODE or labels.get(t.LABEL_TRAINJOB_ANCESTOR) == t.ANCESTOR_TRAINER:
            pod_spec = rjob["template"]["spec"]["template"]["spec"]
            for container in pod_spec.get("containers") or []:
                if container.get("name") == t.NODE and container.get("resources") is not None:
                    found: Obj = container["resources"]
                    return found
    return None


def rendezvous_host(job: TrainJob) -> str:
    name = name_of(job)
    return f"{name}-{t.NODE}-0-0.{name}"


class Torch:
    name = "torch"

    def validate(self, info: RuntimeInfo, job: TrainJob) -> list[FieldError]:
        policy = info.ml_policy
        if policy is None or not is_set(policy.torch):
            return []
        errors: list[FieldError] = []
        injection = policy.torch.env_injection
        if is_set(injection) and is_set(injection.targets):
            for target in injection.targets:
                for cname in target.container_names if is_set(target.container_names) else []:
                    ps = info.pod_set_by_name(or_default(target.job_name, ""))
                    if ps is None or ps.container(cname) is None:
                        errors.append(
                            FieldError(
                                "spec.runtimeRef",
                                f"envInjection target podSet {target.job_name!r} container {cname!r} "
                                "not found in runtime template",
                            )
                        )
        trainer = or_default(spec_of(job).trainer, None)
        if trainer is not None and is_set(trainer.env):
            reserved = sorted({e.name for e in trainer.env if e.name in t.TORCH_RESERVED_ENV_NAMES})
            if reserved:
                errors.append(
                    FieldError("spec.trainer.env", f"must not have reserved envs, invalid envs configured: {reserved}")
                )
        return errors

    def enforce_ml_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        policy = info.ml_policy
        if policy is None or not is_set(policy.torch):
            return
        trainer = or_default(spec_of(job).trainer, None)
        trainer_ps = info.pod_set_by_ancestor(t.ANCESTOR_TRAINER)
        if trainer_ps is not None and trainer is not None and is_set(trainer.num_nodes):
            trainer_ps.count = trainer.num_nodes

        resources = node_resources(info, job)
        gpus = gpus_per_node(resources)
        nproc: str
        if trainer is not None and is_set(trainer.num_proc_per_node):
            nproc = str(trainer.num_proc_per_node)
        elif gpus > 0:
            nproc = "auto"
        else:
            nproc = str(max(1, cpus_per_node(resources)))

        count = trainer_ps.count if trainer_ps is not None else 1
        pet_env = [
            env_value(t.TORCH_ENV_NUM_NODES, str(count)),
            env_value(t.TORCH_ENV_NUM_PROC_PER_NODE, nproc),
            env_field_ref(t.TORCH_ENV_NODE_RANK, t.JOB_COMPLETION_INDEX_FIELD_PATH),
        ]
        master_env = [
            env_value(t.TORCH_ENV_MASTER_ADDR, rendezvous_host(job)),
            env_value(t.TORCH_ENV_MASTER_PORT, str(t.CONTAINER_TRAINER_PORT)),
        ]
        container = info.trainer_container(t.NODE)
        # Trainer v2.3.0 injects nothing when spec.trainer is omitted (upstream #4076); we inject the
        # rendezvous env whenever the runtime has a trainer node, which is what the runtime promises.
        if container is not None:
            if trainer is not None and is_set(trainer.env):
                upsert_env(container.env, builtins(trainer.env))
            upsert_env(container.env, pet_env)
            upsert_env(container.env, master_env)
            upsert_ports(container.ports, [{"containerPort": t.CONTAINER_TRAINER_PORT}])

        injection = policy.torch.env_injection
        if is_set(injection) and is_set(injection.targets):
            for target in injection.targets:
                ps = info.pod_set_by_name(or_default(target.job_name, ""))
                for cname in target.container_names if is_set(target.container_names) else []:
                    found = ps.container(cname) if ps is not None else None
                    if found is not None:
                        upsert_env(found.env, pet_env)
                        upsert_env(found.env, master_env)
