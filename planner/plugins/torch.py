"""Torch: torchrun's ``PET_*`` rendezvous environment, the trainer port, envInjection targets, and torchtune.

``PET_NPROC_PER_NODE`` follows Trainer: the TrainJob's value if given, otherwise ``auto`` when the node has
GPUs, otherwise the CPU count (at least 1). The GPU and CPU counts come from ``resourcesPerNode`` as a
whole when the TrainJob sets it, else from the runtime's ``node`` container.

Torchtune is the case where the TrainJob's trainer command is exactly ``tune run``. Trainer v2.3.0 then:

* validates the TrainJob against what the torchtune runtimes support (model from the runtime name,
  node count, QLoRA limits, LoRA on one node only, no runtime-managed config keys in ``args``);
* leaves ``PET_MASTER_ADDR`` / ``PET_MASTER_PORT`` off the trainer container, because the rendezvous
  endpoint goes on the command line instead (envInjection targets still get all five ``PET_*`` envs);
* appends to the trainer command, in this order: ``--rdzv_endpoint=<tj>-node-0-0.<tj>:29500`` when more
  than one process takes part in total; the recipe, ``--config`` and ``<model><suffix>``; and every token
  of the runtime's ``node`` command whose key (the part before ``=``) is a runtime-managed config.

The rewritten command lives in ``RuntimeInfo.trainer_command``; the TrainJob itself is never changed.
Like the rest of this plugin, the torchtune validation only runs when ``spec.trainer`` is set (it must
be, for the command to be ``tune run``).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from msgspec import UNSET

from contracts import trainer as t
from contracts.trainer import RuntimeRef, Trainer, TrainJob
from contracts.values import is_set, name_of, or_default
from planner.framework import INVALID, CustomValidation, EnforceMLPolicy, FieldError, RuntimeGated
from planner.gofmt import go_quote, go_string_list
from planner.info import RuntimeInfo
from planner.merge import (
    Obj,
    cpus_per_node,
    gpus_per_node,
    upsert_env,
    upsert_ports,
)
from planner.runtime_info import builtins, node_resources, spec_of, trainer_of

_TRAINER_PORT = str(t.CONTAINER_TRAINER_PORT)


def rendezvous_host(job: TrainJob) -> str:
    name = name_of(job)
    return f"{name}-{t.NODE}-0-0.{name}"


# ------------------------------------------------------------------------------------------ torchtune


def is_torchtune(trainer: Trainer | None) -> bool:
    """The TrainJob's own command is exactly ``tune run``."""
    return trainer is not None and trainer.command is not UNSET and tuple(trainer.command) == t.TORCHTUNE_ENTRYPOINT


def torchtune_model(runtime_name: str) -> str:
    """``torchtune-llama3.2-1b`` → ``llama3_2/1B``; empty unless the name has exactly three ``-`` parts."""
    fields = runtime_name.split("-")
    if len(fields) != 3:
        return ""
    return f"{fields[1].replace('.', '_')}/{_go_upper(fields[2])}"


def _go_upper(text: str) -> str:
    # Go's strings.ToUpper maps rune by rune (simple case mapping), never expanding one letter into two.
    return "".join(u if len(u := c.upper()) == 1 else c for c in text)


_GO_SPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | frozenset(
    chr(c) for c in range(0x2000, 0x200B)
)


def _go_trim_space(text: str) -> str:
    start, end = 0, len(text)
    while start < end and text[start] in _GO_SPACE:
        start += 1
    while end > start and text[end - 1] in _GO_SPACE:
        end -= 1
    return text[start:end]


def lora_enabled(args: Sequence[str]) -> bool:
    return any(t.TORCHTUNE_LORA_ATTN_MODULES in arg for arg in args)


def _bool_arg_enabled(args: Sequence[str], item: str) -> bool:
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and item in key and _go_trim_space(value).lower() == "true":
            return True
    return False


def qlora_enabled(args: Sequence[str]) -> bool:
    """``model.quantize_base=True`` without ``model.use_dora=True`` (DoRA rules QLoRA out)."""
    if _bool_arg_enabled(args, t.TORCHTUNE_USE_DORA):
        return False
    return _bool_arg_enabled(args, t.TORCHTUNE_QUANTIZE_BASE)


class ProcsPerNode(msgspec.Struct, frozen=True):
    """Trainer's int-or-string ``numProcPerNode``: a number, or ``auto`` (``value is None``)."""

    value: int | None

    def __str__(self) -> str:
        return "auto" if self.value is None else str(self.value)


def recipe_and_config(
    num_nodes: int, procs: ProcsPerNode, gpus: int, args: Sequence[str], runtime_name: str
) -> tuple[str, str]:
    recipe = t.TORCHTUNE_FULL_FINETUNE_DISTRIBUTED
    suffix = t.TORCHTUNE_SUFFIX_FULL_MULTI_DEVICES
    if num_nodes == 1 and (procs.value == 1 or gpus == 1):
        if qlora_enabled(args):
            recipe, suffix = t.TORCHTUNE_LORA_FINETUNE_SINGLE_DEVICE, t.TORCHTUNE_SUFFIX_QLORA_SINGLE_DEVICE
        elif lora_enabled(args):
            recipe, suffix = t.TORCHTUNE_LORA_FINETUNE_SINGLE_DEVICE, t.TORCHTUNE_SUFFIX_LORA_SINGLE_DEVICE
        else:
            recipe, suffix = t.TORCHTUNE_FULL_FINETUNE_SINGLE_DEVICE, t.TORCHTUNE_SUFFIX_FULL_SINGLE_DEVICE
    elif num_nodes == 1 and qlora_enabled(args):
        recipe, suffix = t.TORCHTUNE_LORA_FINETUNE_DISTRIBUTED, t.TORCHTUNE_SUFFIX_QLORA_DISTRIBUTED
    elif num_nodes == 1 and lora_enabled(args):
        recipe, suffix = t.TORCHTUNE_LORA_FINETUNE_DISTRIBUTED, t.TORCHTUNE_SUFFIX_LORA_DISTRIBUTED
    elif num_nodes > 1:
        suffix = t.TORCHTUNE_SUFFIX_FULL_MULTI_NODES
    return recipe, f"{torchtune_model(runtime_name)}{suffix}"


def runtime_managed_overrides(info: RuntimeInfo) -> list[str]:
    """Tokens of every trainer-ancestor ``node`` command whose key is one of the immutable configs."""
    overrides: list[str] = []
    for rjob in info.jobset_spec.get("replicatedJobs") or []:
        template = rjob.get("template") or {}
        labels = (template.get("metadata") or {}).get("labels") or {}
        if labels.get(t.LABEL_TRAINJOB_ANCESTOR) != t.ANCESTOR_TRAINER:
            continue
        pod_spec = ((template.get("spec") or {}).get("template") or {}).get("spec") or {}
        for container in pod_spec.get("containers") or []:
            if container.get("name") != t.NODE:
                continue
            overrides.extend(
                token
                for token in container.get("command") or []
                if token.split("=")[0] in t.TORCHTUNE_IMMUTABLE_CONFIGS
            )
    return overrides


def _runtime_name(job: TrainJob) -> str:
    return or_default(or_default(spec_of(job).runtime_ref, RuntimeRef()).name, "")


def validate_torchtune(info: RuntimeInfo, job: TrainJob, trainer: Trainer) -> list[FieldError]:
    errors: list[FieldError] = []
    runtime_name = _runtime_name(job)
    model = torchtune_model(runtime_name)
    if model not in t.TORCHTUNE_SUPPORTED_MODELS:
        errors.append(
            FieldError(
                "spec.runtimeRef.name", f"must have a supported pretrained model, invalid model configured: {model}"
            )
        )

    num_nodes = or_default(trainer.num_nodes, 1)
    if num_nodes > 1 and model != t.TORCHTUNE_MODEL_LLAMA3_3_70B:
        errors.append(FieldError("spec.trainer.numNodes", f"must be 1 for {model} model"))

    # Unlike the ML policy, validation keeps an unset numProcPerNode as ``auto`` even on CPU-only nodes.
    procs = ProcsPerNode(trainer.num_proc_per_node if is_set(trainer.num_proc_per_node) else None)
    args = list(or_default(trainer.args, []))
    _, config = recipe_and_config(num_nodes, procs, gpus_per_node(node_resources(info, job)), args, runtime_name)
    if t.TORCHTUNE_SUFFIX_QLORA_DISTRIBUTED in config:
        if model == t.TORCHTUNE_MODEL_QWEN2_5_1_5B:
            errors.append(FieldError("spec.runtimeRef.name", f"QLoRA is not supported for {model} model"))
        if t.TORCHTUNE_SUFFIX_QLORA_SINGLE_DEVICE not in config and model in (
            t.TORCHTUNE_MODEL_LLAMA3_2_1B,
            t.TORCHTUNE_MODEL_LLAMA3_2_3B,
        ):
            errors.append(
                FieldError("spec.trainer.numProcPerNode", f"must be auto or 1 for {model} model when using QLoRA")
            )
            errors.append(
                FieldError(
                    "spec.trainer.resourcesPerNode",
                    f"must have gpu resource with value 1 for {model} model when using QLoRA",
                )
            )
    if num_nodes > 1 and (lora_enabled(args) or qlora_enabled(args)):
        errors.append(
            FieldError(
                "spec.trainer.numNodes", "LoRA fine-tuning is not supported for multi-node training in TorchTune"
            )
        )
    for index, arg in enumerate(args):
        key = arg.split("=", 1)[0]
        if key in t.TORCHTUNE_IMMUTABLE_CONFIGS:
            errors.append(
                FieldError(
                    f"spec.trainer.args[{index}]",
                    f"must not set immutable config {go_quote(key)} in trainer args; it is managed by the runtime",
                )
            )
    return errors


# ---------------------------------------------------------------------------------------------- plugin


class Torch:
    name = "torch"

    def enabled(self, info: RuntimeInfo) -> bool:
        policy = info.ml_policy
        return policy is not None and policy.torch is not UNSET

    def validate(self, info: RuntimeInfo, job: TrainJob) -> list[FieldError]:
        policy = info.ml_policy
        if policy is None or policy.torch is UNSET:
            return []
        errors: list[FieldError] = []
        injection = policy.torch.env_injection
        if injection is not UNSET and injection.targets is not UNSET:
            for target in injection.targets:
                job_name = or_default(target.job_name, "")
                for cname in target.container_names if is_set(target.container_names) else []:
                    ps = info.pod_set_by_name(job_name)
                    if ps is None or ps.container(cname) is None:
                        errors.append(
                            FieldError(
                                "spec.runtimeRef",
                                f"envInjection target podSet {go_quote(job_name)} container {go_quote(cname)} "
                                "not found in runtime template",
                            )
                        )
        trainer = trainer_of(job)
        if trainer is not None:
            env = trainer.env
            reserved = sorted({e.name for e in env if e.name in t.TORCH_RESERVED_ENV_NAMES}) if env else []
            if reserved:
                errors.append(
                    FieldError(
                        "spec.trainer.env",
                        f"must not have reserved envs, invalid envs configured: {go_string_list(reserved)}",
                        kind=INVALID,
                        value=msgspec.to_builtins(env),
                    )
                )
            if is_torchtune(trainer):
                errors.extend(validate_torchtune(info, job, trainer))
        return errors

    def enforce_ml_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        policy = info.ml_policy
        if policy is None or policy.torch is UNSET:
            return
        trainer = trainer_of(job)
        trainer_ps = info.pod_set_by_ancestor(t.ANCESTOR_TRAINER)
        if trainer_ps is not None and trainer is not None and trainer.num_nodes is not UNSET:
            trainer_ps.count = trainer.num_nodes

        resources = node_resources(info, job)
        gpus = gpus_per_node(resources)
        procs: ProcsPerNode
        if trainer is not None and trainer.num_proc_per_node is not UNSET:
            procs = ProcsPerNode(trainer.num_proc_per_node)
        elif gpus > 0:
            procs = ProcsPerNode(None)
        else:
            procs = ProcsPerNode(max(1, cpus_per_node(resources)))

        count = trainer_ps.count if trainer_ps is not None else 1
        # Literal dicts rather than env_value/env_field_ref: the same entries, built on every plan.
        pet_env: list[Obj] = [
            {"name": t.TORCH_ENV_NUM_NODES, "value": str(count)},
            {"name": t.TORCH_ENV_NUM_PROC_PER_NODE, "value": str(procs)},
            {
                "name": t.TORCH_ENV_NODE_RANK,
                "valueFrom": {"fieldRef": {"fieldPath": t.JOB_COMPLETION_INDEX_FIELD_PATH}},
            },
        ]
        master_env: list[Obj] = [
            {"name": t.TORCH_ENV_MASTER_ADDR, "value": rendezvous_host(job)},
            {"name": t.TORCH_ENV_MASTER_PORT, "value": _TRAINER_PORT},
        ]
        container = info.trainer_container(t.NODE)
        # Trainer v2.3.0 injects nothing when spec.trainer is omitted (upstream #4076); we inject the
        # rendezvous env whenever the runtime has a trainer node, which is what the runtime promises.
        if container is not None:
            if trainer is not None and trainer.env is not UNSET:
                upsert_env(container.env, builtins(trainer.env))
            if trainer is not None and is_torchtune(trainer):
                upsert_env(container.env, pet_env)
                self._rewrite_torchtune_command(info, job, trainer, count, procs, gpus)
            else:
                upsert_env(container.env, pet_env + master_env)
            upsert_ports(container.ports, [{"containerPort": t.CONTAINER_TRAINER_PORT}])

        # envInjection targets (sidecars, preflight checks) get the master address even under torchtune.
        injection = policy.torch.env_injection
        if injection is not UNSET and injection.targets is not UNSET:
            for target in injection.targets:
                ps = info.pod_set_by_name(or_default(target.job_name, ""))
                for cname in target.container_names if is_set(target.container_names) else []:
                    found = ps.container(cname) if ps is not None else None
                    if found is not None:
                        upsert_env(found.env, pet_env)
                        upsert_env(found.env, master_env)

    @staticmethod
    def _rewrite_torchtune_command(
        info: RuntimeInfo, job: TrainJob, trainer: Trainer, count: int, procs: ProcsPerNode, gpus: int
    ) -> None:
        appended: list[str] = []
        multi_device = procs.value > 1 if procs.value is not None else gpus > 1
        if count > 1 or multi_device:
            appended.append(f"{t.TORCHTUNE_ARG_RDZV_ENDPOINT}={rendezvous_host(job)}:{t.CONTAINER_TRAINER_PORT}")
        recipe, config = recipe_and_config(count, procs, gpus, list(or_default(trainer.args, [])), _runtime_name(job))
        appended.extend((recipe, t.TORCHTUNE_ARG_CONFIG, config))
        appended.extend(runtime_managed_overrides(info))
        base = info.trainer_command if info.trainer_command is not None else list(or_default(trainer.command, []))
        info.trainer_command = [*base, *appended]


# The extension points Torch implements, checked by mypy as the Go compiler checks Trainer's
# ``var _ framework.<Point>Plugin = (*Torch)(nil)``; tests/unit/test_planner_plugin_phases.py ties them to the phases.
_implements_validation: CustomValidation = Torch()
_implements_ml_policy: EnforceMLPolicy = Torch()
_implements_gate: RuntimeGated = Torch()
