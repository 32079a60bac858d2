"""JobSet: pod network endpoints, parallelism from pod-set counts, and the JobSet apply configuration.

The JobSet is the component users look at, so its builder follows Trainer's order of overrides exactly:
first what plugins put into the pod sets (volumes, images, commands, env, ports, mounts, extra init
containers), then the initializer overrides, then the trainer overrides, then scheduler labels and
annotations, then ``suspend``. Each later step wins over an earlier one.

Whether an existing, running JobSet may be touched is not decided here: the planner never reads the
cluster. The message carries the ``while-suspended`` policy and the applier checks it against the live
object.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
from msgspec import UNSET

from contracts import trainer as t
from contracts.jobset import JOBSET_API_VERSION, JOBSET_KIND, JobSet
from contracts.trainer import Initializer, Trainer, TrainJob
from contracts.values import is_set, name_of, or_default
from planner.framework import BuildError, ComponentBuilder, PodNetwork
from planner.info import Component, RuntimeInfo
from planner.merge import Obj, env_value, upsert_env, upsert_ports, upsert_volume_mounts, upsert_volumes
from planner.owners import owned_metadata
from planner.quantities import canonical_quantity, canonical_resources
from planner.runtime_info import builtins, spec_of


def _pod_spec(rjob: Obj) -> Obj:
    pod_spec: Obj = rjob["template"]["spec"]["template"].setdefault("spec", {})
    return pod_spec


def _ancestor(rjob: Obj) -> str | None:
    labels = ((rjob.get("template") or {}).get("metadata") or {}).get("labels") or {}
    value = labels.get(t.LABEL_TRAINJOB_ANCESTOR)
    return str(value) if value is not None else None


def _go_typed_shape(rjob: Obj) -> None:
    """The empty structs Trainer's typed round trip writes, so SSA sees the same owned fields as Trainer's.

    Go encodes a non-pointer struct even when it is empty: every container gets ``resources: {}`` and every
    job and pod template ``metadata: {}``. Sending the same keys makes the field manager own exactly what
    Trainer's would, so handing a TrainJob from one controller to the other causes no write.
    """
    job_template = rjob.setdefault("template", {})
    job_template.setdefault("metadata", {})
    pod_template = job_template.setdefault("spec", {}).setdefault("template", {})
    pod_template.setdefault("metadata", {})
    pod_spec = pod_template.setdefault("spec", {})
    for kind in ("containers", "initContainers"):
        for container in pod_spec.get(kind) or []:
            container.setdefault("resources", {})


def _canonical_quantities(pod_spec: Obj) -> None:
    """Quantities as Trainer's typed round trip writes them (``2`` → ``"2"``, ``1000m`` → ``"1"``)."""
    for kind in ("containers", "initContainers"):
        for container in pod_spec.get(kind) or []:
            if "resources" in container:
                container["resources"] = canonical_resources(container["resources"])
    if "resources" in pod_spec:
        pod_spec["resources"] = canonical_resources(pod_spec["resources"])
    for volume in pod_spec.get("volumes") or []:
        empty_dir = volume.get("emptyDir")
        if isinstance(empty_dir, dict) and "sizeLimit" in empty_dir:
            empty_dir["sizeLimit"] = canonical_quantity(empty_dir["sizeLimit"])


class JobSetPlugin:
    name = "jobset"

    def identify_pod_network(self, info: RuntimeInfo, job: TrainJob) -> None:
        job_name = name_of(job)
        network = info.jobset_spec.get("network") or {}
        subdomain = network.get("subdomain") or job_name
        for index, rjob in enumerate(info.jobset_spec.get("replicatedJobs") or []):
            ps = info.pod_sets[index]
            replicas = int(rjob.get("replicas", 1))
            rname = rjob.get("name")

            def endpoints(replicas: int = replicas, rname: str = str(rname), count: int = ps.count) -> Iterator[str]:
                for r in range(replicas):
                    for p in range(count):
                        yield f"{job_name}-{rname}-{r}-{p}.{subdomain}"

            ps.endpoints = endpoints

    def sync_parallel_count(self, info: RuntimeInfo) -> None:
        jobs = info.jobset_spec.get("replicatedJobs") or []
        for ps in info.pod_sets:
            for rjob in jobs:
                if rjob.get("name") == ps.name:
                    rjob["template"]["spec"]["parallelism"] = ps.count
                    rjob["template"]["spec"]["completions"] = ps.count
                    break

    def build(self, info: RuntimeInfo, job: TrainJob) -> list[Component]:
        spec = info.jobset_spec
        jobs: list[Obj] = spec.get("replicatedJobs") or []
        if len(jobs) < len(info.pod_sets):
            raise BuildError(
                f"runtime template has {len(jobs)} replicatedJobs but runtime info has {len(info.pod_sets)} podSets"
            )
        for ps, rjob in zip(info.pod_sets, jobs, strict=False):
            pod_spec = _pod_spec(rjob)
            if ps.volumes:
                upsert_volumes(pod_spec.setdefault("volumes", []), ps.volumes)
            for kind, containers in (("containers", ps.containers), ("initContainers", ps.init_containers)):
                if not containers and not pod_spec.get(kind):
                    pod_spec.pop(kind, None)
                    continue
                slots: list[Obj] = pod_spec.setdefault(kind, [])
                for i, container in enumerate(containers):
                    if i >= len(slots):
                        slots.append({"name": container.name})
                    slot = slots[i]
                    if container.command:
                        slot["command"] = list(container.command)
                    if container.image:
                        slot["image"] = container.image
                    if container.env:
                        upsert_env(slot.setdefault("env", []), container.env)
                    if container.ports:
                        upsert_ports(slot.setdefault("ports", []), container.ports)
                    if container.volume_mounts:
                        upsert_volume_mounts(slot.setdefault("volumeMounts", []), container.volume_mounts)
                if not slots:
                    pod_spec.pop(kind)

        ancestors = [_ancestor(rjob) for rjob in jobs]
        job_spec = spec_of(job)
        if t.DATASET_INITIALIZER in ancestors or t.MODEL_INITIALIZER in ancestors:
            self._initializers(jobs, ancestors, or_default(job_spec.initializer, None))
        self._trainer(info, jobs, ancestors, or_default(job_spec.trainer, None))
        for rjob in jobs:
            pod_template = rjob["template"]["spec"]["template"]
            if info.pod_labels:
                pod_template.setdefault("metadata", {}).setdefault("labels", {}).update(info.pod_labels)
            if info.pod_annotations:
                pod_template.setdefault("metadata", {}).setdefault("annotations", {}).update(info.pod_annotations)
            _canonical_quantities(_pod_spec(rjob))
            _go_typed_shape(rjob)
        for policy in spec.get("volumeClaimPolicies") or []:
            for template in policy.get("templates") or []:
                template.setdefault("status", {})
        suspend = or_default(job_spec.suspend, None)
        if suspend is not None:
            spec["suspend"] = suspend
        metadata = owned_metadata(job, name_of(job))
        if info.labels:
            metadata["labels"] = dict(info.labels)
        if info.annotations:
            metadata["annotations"] = dict(info.annotations)
        body = {"apiVersion": JOBSET_API_VERSION, "kind": JOBSET_KIND, "metadata": metadata, "spec": spec}
        try:
            jobset = msgspec.convert(body, JobSet)
        except msgspec.ValidationError as exc:
            raise BuildError(f"the JobSet built from the runtime is not valid: {exc}") from exc
        return [Component(object=jobset, policy="while-suspended")]

    @staticmethod
    def _initializers(jobs: list[Obj], ancestors: list[str | None], init: Initializer | None) -> None:
        for rjob, ancestor in zip(jobs, ancestors, strict=True):
            if ancestor not in (t.DATASET_INITIALIZER, t.MODEL_INITIALIZER):
                continue
            rjob["replicas"] = 1
            source = None
            if init is not None:
                source = init.dataset if ancestor == t.DATASET_INITIALIZER else init.model
            if not is_set(source) or source is None:
                continue
            for container in _pod_spec(rjob).get("containers") or []:
                if container.get("name") != ancestor:
                    continue
                env = container.setdefault("env", [])
                if is_set(source.storage_uri):
                    upsert_env(env, [env_value(t.ENV_STORAGE_URI, source.storage_uri)])
                if is_set(source.env):
                    upsert_env(env, builtins(source.env))
                if not env:
                    container.pop("env")
                if is_set(source.secret_ref):
                    container.setdefault("envFrom", []).append({"secretRef": {"name": source.secret_ref.name}})

    @staticmethod
    def _trainer(info: RuntimeInfo, jobs: list[Obj], ancestors: list[str | None], trainer: Trainer | None) -> None:
        policy = info.ml_policy
        launcher_as_node = policy is not None and policy.mpi is not UNSET and policy.mpi.run_launcher_as_node is True
        user_env = trainer.env if trainer is not None else UNSET
        for rjob, ancestor in zip(jobs, ancestors, strict=True):
            containers = _pod_spec(rjob).get("containers") or []
            if ancestor == t.ANCESTOR_TRAINER:
                rjob["replicas"] = 1
                for container in containers:
                    if container.get("name") != t.NODE or trainer is None:
                        continue
                    if trainer.image is not UNSET:
                        container["image"] = trainer.image
                    if info.trainer_command is not None:
                        container["command"] = list(info.trainer_command)
                    if info.trainer_args is not None:
                        container["args"] = list(info.trainer_args)
            if user_env is not UNSET and (
                ancestor == t.ANCESTOR_TRAINER or (launcher_as_node and rjob.get("name") == t.NODE)
            ):
                for container in containers:
                    if container.get("name") == t.NODE:
                        upsert_env(container.setdefault("env", []), builtins(user_env))


# The extension points JobSetPlugin implements, checked by mypy as the Go compiler checks Trainer's
# ``var _ framework.<Point>Plugin = (*JobSetPlugin)(nil)``;
# tests/unit/test_planner_plugin_phases.py ties them to the phases.
_implements_pod_network: PodNetwork = JobSetPlugin()
_implements_builder: ComponentBuilder = JobSetPlugin()
