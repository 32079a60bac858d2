"""Torchtune: the ``tune run`` command rewrite, the missing master env, and torchtune's validation.

Runtimes are shaped like Trainer's ``torchtune-*`` ClusterTrainingRuntimes (dataset and model initializers,
a ``node`` job with a full ``tune run`` command and ``nvidia.com/gpu: 2``); expected values follow
``torch.go``/``torchtune.go`` and their tests at v2.3.0.
"""

from __future__ import annotations

from typing import Any

import pytest

from contracts import messages as m
from planner.plugins.torch import torchtune_model

from .builders import (
    FRAMEWORK_WITHOUT_FLUX_AND_MPI,
    RANK,
    Obj,
    only_object,
    plan_with,
    pod_spec,
    replicated_job,
    runtime_dict,
    trainjob_dict,
    trainjob_observed,
    validate_with,
)

NAME = "tune-1"
NAMESPACE = "llm"
UID = "c0ffee-uid"
RDZV = f"--rdzv_endpoint={NAME}-node-0-0.{NAME}:29500"
RUNTIME_OVERRIDES = [
    "output_dir=/workspace/output",
    "tokenizer.path=/workspace/model/original/tokenizer.model",
    "checkpointer.checkpoint_dir=/workspace/model",
]
NAME_1B = "torchtune-llama3.2-1b"
MODEL_URIS = {
    "torchtune-llama3.2-1b": "hf://meta-llama/Llama-3.2-1B-Instruct",
    "torchtune-llama3.2-3b": "hf://meta-llama/Llama-3.2-3B-Instruct",
    "torchtune-qwen2.5-1.5b": "hf://Qwen/Qwen2.5-1.5B-Instruct",
    "torchtune-llama3.3-70b": "hf://meta-llama/Llama-3.3-70B-Instruct",
}


def initializer(kind: str, uri: str) -> Obj:
    container = {
        "name": kind,
        "image": f"ghcr.io/kubeflow/trainer/{kind}",
        "env": [{"name": "STORAGE_URI", "value": uri}],
        "volumeMounts": [{"mountPath": "/workspace", "name": "initializer"}],
    }
    return replicated_job(kind, [container], ancestor=kind)


def runtime(name: str = "torchtune-llama3.2-1b", *, gpus: int | None = 2, env_injection: Obj | None = None) -> Obj:
    model = name.split("-")[1].replace(".", "_") + "/" + name.split("-")[2].upper()
    node: Obj = {
        "name": "node",
        "image": "ghcr.io/kubeflow/trainer/torchtune-trainer",
        "command": [
            "tune",
            "run",
            "--rdzv_endpoint=localhost:29500",
            "full_finetune_distributed",
            "--config",
            f"{model}_full",
            "dataset=torchtune.datasets.instruct_dataset",
            "dataset.source=parquet",
            "dataset.data_dir=/workspace/dataset/data",
            *RUNTIME_OVERRIDES,
        ],
        "volumeMounts": [{"mountPath": "/workspace", "name": "initializer"}],
    }
    if gpus is not None:
        node["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    torch: Obj = {} if env_injection is None else {"envInjection": env_injection}
    claim = {
        "metadata": {"name": "initializer"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "20Gi"}}},
    }
    initialized = [
        {"name": "dataset-initializer", "status": "Complete"},
        {"name": "model-initializer", "status": "Complete"},
    ]
    return runtime_dict(
        [
            initializer("dataset-initializer", "hf://tatsu-lab/alpaca"),
            initializer("model-initializer", MODEL_URIS.get(name, "hf://example/model")),
            replicated_job("node", [node], ancestor="trainer", depends_on=initialized),
        ],
        name=name,
        metadata={"labels": {"trainer.kubeflow.org/framework": "torchtune"}},
        ml_policy={"numNodes": 1, "torch": torch},
        jobset_spec={"volumeClaimPolicies": [{"templates": [claim]}]},
    )


def trainjob(runtime_name: str = "torchtune-llama3.2-1b", **trainer: Any) -> Obj:
    return trainjob_dict(
        {"command": ["tune", "run"], **trainer}, name=NAME, namespace=NAMESPACE, uid=UID, runtime=runtime_name
    )


def run(job: Obj, rt: Obj) -> m.Plan:
    return plan_with(FRAMEWORK_WITHOUT_FLUX_AND_MPI, trainjob_observed(job, rt))


def jobset(job: Obj, rt: Obj) -> Obj:
    return only_object(run(job, rt), m.ApplyJobSet)


def node(js: Obj) -> Obj:
    container: Obj = pod_spec(js, "node")["containers"][0]
    return container


def command(job: Obj, rt: Obj) -> list[str]:
    out: list[str] = node(jobset(job, rt))["command"]
    return out


def validate(job: Obj, rt: Obj) -> list[str]:
    return [str(e) for e in validate_with(FRAMEWORK_WITHOUT_FLUX_AND_MPI, job, rt)]


def pet_env(nnodes: str, nproc: str) -> list[Obj]:
    return [
        {"name": "PET_NNODES", "value": nnodes},
        {"name": "PET_NPROC_PER_NODE", "value": nproc},
        {"name": "PET_NODE_RANK", "valueFrom": RANK},
    ]


MASTER_ENV = [
    {"name": "PET_MASTER_ADDR", "value": f"{NAME}-node-0-0.{NAME}"},
    {"name": "PET_MASTER_PORT", "value": "29500"},
]


# ------------------------------------------------------------------------------------ command rewrite


def test_shipped_runtime_as_is_multi_gpu_node_container_is_exact() -> None:
    js = jobset(trainjob(), runtime())
    assert node(js) == {
        "name": "node",
        "image": "ghcr.io/kubeflow/trainer/torchtune-trainer",
        "command": [
            "tune",
            "run",
            RDZV,
            "full_finetune_distributed",
            "--config",
            "llama3_2/1B_full",
            *RUNTIME_OVERRIDES,
        ],
        "env": pet_env("1", "auto"),
        "ports": [{"containerPort": 29500}],
        "resources": {"limits": {"nvidia.com/gpu": "2"}},  # canonical, as Trainer writes it
        "volumeMounts": [{"mountPath": "/workspace", "name": "initializer"}],
    }


def test_initializers_get_no_torch_env() -> None:
    js = jobset(trainjob(), runtime())
    for name, uri in (("dataset-initializer", "hf://tatsu-lab/alpaca"), ("model-initializer", MODEL_URIS[NAME_1B])):
        assert pod_spec(js, name)["containers"][0]["env"] == [{"name": "STORAGE_URI", "value": uri}]


@pytest.mark.parametrize(
    ("trainer", "gpus", "want"),
    [
        pytest.param({}, 1, ["full_finetune_single_device", "--config", "llama3_2/1B_full_single_device"], id="1gpu"),
        pytest.param(
            {"args": ["model.lora_attn_modules=[q_proj,v_proj]"]},
            1,
            ["lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device"],
            id="1gpu-lora",
        ),
        pytest.param(
            {"args": ["model.quantize_base=True"]},
            1,
            ["lora_finetune_single_device", "--config", "llama3_2/1B_qlora_single_device"],
            id="1gpu-qlora",
        ),
        pytest.param(
            {"numProcPerNode": 1},
            2,
            ["full_finetune_single_device", "--config", "llama3_2/1B_full_single_device"],
            id="npn1-forces-single-device",
        ),
        pytest.param(
            {"args": ["model.lora_attn_modules=[q_proj]"]},
            2,
            [RDZV, "lora_finetune_distributed", "--config", "llama3_2/1B_lora"],
            id="2gpu-lora",
        ),
        pytest.param(
            {"args": ["model.lora_attn_modules=[q_proj]", "model.use_dora=True", "model.quantize_base=true"]},
            2,
            [RDZV, "lora_finetune_distributed", "--config", "llama3_2/1B_lora"],
            id="dora-rules-out-qlora",
        ),
        pytest.param(
            {"args": ["model.quantize_base=False", "model.lora_attn_modules=[q_proj]"]},
            1,
            ["lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device"],
            id="quantize-base-false",
        ),
        pytest.param(
            {"numProcPerNode": 4},
            1,
            ["full_finetune_single_device", "--config", "llama3_2/1B_full_single_device"],
            id="one-gpu-wins-over-npn-but-rdzv-follows-npn",
        ),
    ],
)
def test_recipe_and_config_selection(trainer: Obj, gpus: int, want: list[str]) -> None:
    got = command(trainjob(**trainer), runtime(gpus=gpus))
    expected_prefix = ["tune", "run"]
    if trainer.get("numProcPerNode", 0) > 1:
        expected_prefix.append(RDZV)
    assert got == [*expected_prefix, *want, *RUNTIME_OVERRIDES]


def test_multi_node_70b_uses_the_multinode_config_and_numbers() -> None:
    job = trainjob("torchtune-llama3.3-70b", numNodes=2, numProcPerNode=8)
    c = node(jobset(job, runtime("torchtune-llama3.3-70b", gpus=8)))
    assert c["command"] == [
        "tune",
        "run",
        RDZV,
        "full_finetune_distributed",
        "--config",
        "llama3_3/70B_full_multinode",
        *RUNTIME_OVERRIDES,
    ]
    assert c["env"] == pet_env("2", "8")


def test_cpu_only_node_counts_cpus_as_processes() -> None:
    rt = runtime(gpus=None)
    many = trainjob(resourcesPerNode={"requests": {"cpu": "4"}})
    c = node(jobset(many, rt))
    assert c["command"] == [
        "tune",
        "run",
        RDZV,
        "full_finetune_distributed",
        "--config",
        "llama3_2/1B_full",
        *RUNTIME_OVERRIDES,
    ]
    assert c["env"] == pet_env("1", "4")
    one = trainjob(resourcesPerNode={"requests": {"cpu": "500m"}})
    assert command(one, rt) == [
        "tune",
        "run",
        "full_finetune_single_device",
        "--config",
        "llama3_2/1B_full_single_device",
        *RUNTIME_OVERRIDES,
    ]


def test_user_args_image_and_env_reach_the_container() -> None:
    job = trainjob(
        image="example.com/tune:1",
        args=["epochs=2", "batch_size=8"],
        env=[{"name": "HF_HOME", "value": "/workspace/cache"}],
    )
    c = node(jobset(job, runtime()))
    assert c["image"] == "example.com/tune:1"
    assert c["args"] == ["epochs=2", "batch_size=8"]
    assert c["env"] == [{"name": "HF_HOME", "value": "/workspace/cache"}, *pet_env("1", "auto")]


def test_planning_twice_does_not_append_twice() -> None:
    job, rt = trainjob(), runtime()
    assert command(job, rt) == command(job, rt)
    assert len(command(job, rt)) == 9


def test_only_runtime_managed_tokens_of_trainer_node_commands_are_copied() -> None:
    rt = runtime()
    jobs = rt["spec"]["template"]["spec"]["replicatedJobs"]
    # A runtime-managed key on an initializer container is not the trainer's and is ignored.
    jobs[0]["template"]["spec"]["template"]["spec"]["containers"][0]["command"] = ["init", "output_dir=/nope"]
    jobs[2]["template"]["spec"]["template"]["spec"]["containers"][0]["command"] = [
        "tune",
        "run",
        "tokenizer.merges_file=/workspace/model/merges.txt",
        "output_dir",
        "output_dir.extra=1",
    ]
    assert command(trainjob(), rt) == [
        "tune",
        "run",
        RDZV,
        "full_finetune_distributed",
        "--config",
        "llama3_2/1B_full",
        "tokenizer.merges_file=/workspace/model/merges.txt",
        "output_dir",
    ]


def test_other_commands_are_plain_torchrun() -> None:
    c = node(jobset(trainjob(command=["tune", "run", "lora_finetune_distributed"]), runtime()))
    assert c["command"] == ["tune", "run", "lora_finetune_distributed"]
    assert c["env"] == [*pet_env("1", "auto"), *MASTER_ENV]


def test_env_injection_targets_keep_the_master_env_under_torchtune() -> None:
    rt = runtime(env_injection={"targets": [{"jobName": "node", "containerNames": ["preflight"]}]})
    node_pod = rt["spec"]["template"]["spec"]["replicatedJobs"][2]["template"]["spec"]["template"]["spec"]
    node_pod["initContainers"] = [{"name": "preflight", "image": "example.com/check"}]
    js = jobset(trainjob(), rt)
    assert pod_spec(js, "node")["initContainers"] == [
        {
            "name": "preflight",
            "image": "example.com/check",
            "env": [*pet_env("1", "auto"), *MASTER_ENV],
            "resources": {},
        }
    ]
    assert node(js)["env"] == pet_env("1", "auto")


def test_model_from_runtime_name() -> None:
    assert [
        torchtune_model(n)
        for n in (
            "torchtune-llama3.2-1b",
            "torchtune-qwen2.5-1.5b",
            "torchtune-llama3.3-70b",
            "torch-distributed",
            "a-b-c-d",
            "",
        )
    ] == ["llama3_2/1B", "qwen2_5/1.5B", "llama3_3/70B", "", "", ""]


# ------------------------------------------------------------------------------------------ validation


def test_supported_shipped_shapes_are_valid() -> None:
    assert validate(trainjob(), runtime()) == []
    assert validate(trainjob("torchtune-qwen2.5-1.5b"), runtime("torchtune-qwen2.5-1.5b")) == []
    assert validate(trainjob("torchtune-llama3.3-70b", numNodes=2), runtime("torchtune-llama3.3-70b")) == []


def test_unsupported_model() -> None:
    assert validate(trainjob("torchtune-llama3.1-8b"), runtime("torchtune-llama3.1-8b")) == [
        "spec.runtimeRef.name: must have a supported pretrained model, invalid model configured: llama3_1/8B"
    ]
    assert validate(trainjob("torch-distributed"), runtime("torchtune-llama3.2-1b")) == [
        "spec.runtimeRef.name: must have a supported pretrained model, invalid model configured: "
    ]


def test_more_than_one_node_only_for_70b() -> None:
    assert validate(trainjob(numNodes=2), runtime()) == ["spec.trainer.numNodes: must be 1 for llama3_2/1B model"]


def test_qlora_is_not_supported_for_qwen() -> None:
    job = trainjob("torchtune-qwen2.5-1.5b", args=["model.quantize_base=True"])
    assert validate(job, runtime("torchtune-qwen2.5-1.5b", gpus=1)) == [
        "spec.runtimeRef.name: QLoRA is not supported for qwen2_5/1.5B model"
    ]


def test_multi_device_qlora_for_small_llama() -> None:
    job = trainjob("torchtune-llama3.2-3b", args=["model.quantize_base=True"])
    assert validate(job, runtime("torchtune-llama3.2-3b", gpus=2)) == [
        "spec.trainer.numProcPerNode: must be auto or 1 for llama3_2/3B model when using QLoRA",
        "spec.trainer.resourcesPerNode: must have gpu resource with value 1 for llama3_2/3B model when using QLoRA",
    ]
    assert validate(job, runtime("torchtune-llama3.2-3b", gpus=1)) == []


def test_validation_keeps_auto_on_cpu_only_nodes_unlike_the_ml_policy() -> None:
    # Upstream validation does not turn an unset numProcPerNode into the CPU count: with no GPU the job
    # is "multi-device" for the check even when the ML policy would pick a single process.
    job = trainjob(args=["model.quantize_base=True"], resourcesPerNode={"requests": {"cpu": "1"}})
    assert validate(job, runtime(gpus=None)) == [
        "spec.trainer.numProcPerNode: must be auto or 1 for llama3_2/1B model when using QLoRA",
        "spec.trainer.resourcesPerNode: must have gpu resource with value 1 for llama3_2/1B model when using QLoRA",
    ]


def test_lora_is_not_supported_on_more_than_one_node() -> None:
    for args in (["model.lora_attn_modules=[q_proj]"], ["model.quantize_base=True"]):
        job = trainjob("torchtune-llama3.3-70b", numNodes=2, args=args)
        assert validate(job, runtime("torchtune-llama3.3-70b")) == [
            "spec.trainer.numNodes: LoRA fine-tuning is not supported for multi-node training in TorchTune"
        ]


def test_runtime_managed_configs_are_forbidden_in_args() -> None:
    job = trainjob(args=["output_dir=/tmp/out", "epochs=1", "checkpointer.checkpoint_dir=/x", "tokenizer.path"])
    managed = "in trainer args; it is managed by the runtime"
    assert validate(job, runtime()) == [
        f'spec.trainer.args[0]: must not set immutable config "output_dir" {managed}',
        f'spec.trainer.args[2]: must not set immutable config "checkpointer.checkpoint_dir" {managed}',
        f'spec.trainer.args[3]: must not set immutable config "tokenizer.path" {managed}',
    ]


def test_torch_errors_come_before_torchtune_errors() -> None:
    job = trainjob(numNodes=2, env=[{"name": "PET_NODE_RANK", "value": "0"}, {"name": "PET_NNODES", "value": "1"}])
    assert validate(job, runtime()) == [
        "spec.trainer.env: must not have reserved envs, invalid envs configured: [PET_NNODES PET_NODE_RANK]",
        "spec.trainer.numNodes: must be 1 for llama3_2/1B model",
    ]


def test_torchtune_rules_apply_only_to_exactly_tune_run() -> None:
    assert validate(trainjob(command=["tune", "run", "x"], numNodes=2), runtime()) == []


def test_invalid_torchtune_job_is_not_built() -> None:
    p = run(trainjob(numNodes=2), runtime())
    assert [a for a in p.applies if isinstance(a, m.ApplyJobSet)] == []
    assert any("spec.trainer.numNodes: must be 1 for llama3_2/1B model" in w for w in p.warnings)
