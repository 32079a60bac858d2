"""Kubeflow Trainer ``trainer.kubeflow.org/v1alpha1`` (Trainer v2.3.0) as msgspec Structs, plus constants.

Written by hand from the v2.3.0 Go types and CRDs; field names, nesting and JSON names follow them
exactly (Go's inline ``MLPolicySource`` / ``PodGroupPolicySource`` members are flattened into
``MLPolicy`` / ``PodGroupPolicy``).  Every field is optional and defaults to ``msgspec.UNSET``.

``TrainingRuntime`` and ``ClusterTrainingRuntime`` share ``TrainingRuntimeSpec`` and have the same shape,
and ``kind`` is an ordinary field on both, so either class decodes either kind losslessly.  ``Runtime``
is their union for type annotations; msgspec cannot decode that union directly (it would need ``kind``
as a tag, and a tag is always encoded and never ``UNSET``), so use ``runtime_from_builtins`` /
``decode_runtime``, which dispatch on ``kind``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

import msgspec

from contracts.jobset import JobSetSpec
from contracts.kube import (
    Affinity,
    Condition,
    EnvVar,
    KubeStruct,
    LocalObjectReference,
    ObjectMeta,
    PodSchedulingGate,
    PodSecurityContext,
    ResourceRequirements,
    SecurityContext,
    Toleration,
    Volume,
    VolumeMount,
)
from contracts.scheduling import NetworkTopologySpec

# ------------------------------------------------------------------------------------ API identity

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
TRAINJOB_KIND = "TrainJob"
TRAINING_RUNTIME_KIND = "TrainingRuntime"
CLUSTER_TRAINING_RUNTIME_KIND = "ClusterTrainingRuntime"

# spec.runtimeRef defaults
DEFAULT_RUNTIME_API_GROUP = GROUP
DEFAULT_RUNTIME_KIND = CLUSTER_TRAINING_RUNTIME_KIND

# spec.managedBy values
MANAGED_BY_TRAINJOB_CONTROLLER = "trainer.kubeflow.org/trainjob-controller"
MANAGED_BY_MULTIKUEUE = "kueue.x-k8s.io/multikueue"

# server-side apply field owners
FIELD_OWNER = "trainer"
STATUS_FIELD_OWNER = "trainer-status"

# ------------------------------------------------------------------------------------- conditions

CONDITION_SUSPENDED = "Suspended"
CONDITION_COMPLETE = "Complete"
CONDITION_FAILED = "Failed"

REASON_SUSPENDED = "Suspended"
REASON_RESUMED = "Resumed"
REASON_RUNTIME_NOT_SUPPORTED = "TrainingRuntimeNotSupported"
REASON_DEADLINE_EXCEEDED = "DeadlineExceeded"

MESSAGE_SUSPENDED = "TrainJob is suspended"
MESSAGE_RESUMED = "TrainJob is resumed"
MESSAGE_DEADLINE_EXCEEDED = "TrainJob exceeded its active deadline"

EVENT_RECORDER = "trainer-trainjob-controller"
EVENT_REASON_RESOURCES_CREATION_FAILED = "TrainJobResourcesCreationFailed"

# ------------------------------------------------------------------------- labels and annotations

LABEL_TRAINJOB_ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_DATASET_INITIALIZER = "dataset-initializer"
ANCESTOR_MODEL_INITIALIZER = "model-initializer"
ANCESTOR_TRAINER = "trainer"

LABEL_SUPPORT = "trainer.kubeflow.org/support"
SUPPORT_DEPRECATED = "deprecated"

LABEL_WEBHOOK_VALIDATION = "trainer.kubeflow.org/webhook-validation"
WEBHOOK_VALIDATION_DISABLED = "disabled"

FINALIZER_RESOURCE_IN_USE = "trainer.kubeflow.org/resource-in-use"

# ------------------------------------------------------------------ replicated jobs and containers

NODE = "node"
"""Name of the trainer replicated job and of the trainer container."""
LAUNCHER = "launcher"
"""Name of the MPI launcher replicated job."""
DATASET_INITIALIZER = "dataset-initializer"
"""Name of the dataset initializer replicated job and container."""
MODEL_INITIALIZER = "model-initializer"
"""Name of the model initializer replicated job and container."""
INITIALIZER_VOLUME = "initializer"
"""Volume (and volumeMount) the initializers share with the trainer."""
DATASET_MOUNT_PATH = "/workspace/dataset"
MODEL_MOUNT_PATH = "/workspace/model"
ENV_STORAGE_URI = "STORAGE_URI"

CONTAINER_TRAINER_PORT = 29500
DEFAULT_JOBSET_REPLICAS = 1

JOB_COMPLETION_INDEX_FIELD_PATH = "metadata.annotations['batch.kubernetes.io/job-completion-index']"

RUNTIME_SNAPSHOT_SUFFIX = "-runtime-snapshot"
RUNTIME_SNAPSHOT_KEY = "runtime"

# ------------------------------------------------------------------------------------------ torch

TORCH_ENV_NUM_NODES = "PET_NNODES"
TORCH_ENV_NUM_PROC_PER_NODE = "PET_NPROC_PER_NODE"
TORCH_ENV_NODE_RANK = "PET_NODE_RANK"
TORCH_ENV_MASTER_ADDR = "PET_MASTER_ADDR"
TORCH_ENV_MASTER_PORT = "PET_MASTER_PORT"
TORCH_RESERVED_ENV_NAMES = frozenset(
    {
        TORCH_ENV_NUM_NODES,
        TORCH_ENV_NUM_PROC_PER_NODE,
        TORCH_ENV_NODE_RANK,
        TORCH_ENV_MASTER_ADDR,
        TORCH_ENV_MASTER_PORT,
    }
)

TORCHTUNE_ENTRYPOINT = ("tune", "run")
TORCHTUNE_ARG_RDZV_ENDPOINT = "--rdzv_endpoint"
TORCHTUNE_ARG_CONFIG = "--config"
TORCHTUNE_FULL_FINETUNE_SINGLE_DEVICE = "full_finetune_single_device"
TORCHTUNE_FULL_FINETUNE_DISTRIBUTED = "full_finetune_distributed"
TORCHTUNE_LORA_FINETUNE_SINGLE_DEVICE = "lora_finetune_single_device"
TORCHTUNE_LORA_FINETUNE_DISTRIBUTED = "lora_finetune_distributed"
TORCHTUNE_SUFFIX_FULL_SINGLE_DEVICE = "_full_single_device"
TORCHTUNE_SUFFIX_FULL_MULTI_DEVICES = "_full"
TORCHTUNE_SUFFIX_FULL_MULTI_NODES = "_full_multinode"
TORCHTUNE_SUFFIX_LORA_SINGLE_DEVICE = "_lora_single_device"
TORCHTUNE_SUFFIX_QLORA_SINGLE_DEVICE = "_qlora_single_device"
TORCHTUNE_SUFFIX_LORA_DISTRIBUTED = "_lora"
TORCHTUNE_SUFFIX_QLORA_DISTRIBUTED = "_qlora"
TORCHTUNE_LORA_ATTN_MODULES = "model.lora_attn_modules"
TORCHTUNE_QUANTIZE_BASE = "model.quantize_base"
TORCHTUNE_USE_DORA = "model.use_dora"
TORCHTUNE_MODEL_OUTPUT_DIR = "output_dir"
TORCHTUNE_TOKENIZER_PATH = "tokenizer.path"
TORCHTUNE_TOKENIZER_MERGES_FILE = "tokenizer.merges_file"
TORCHTUNE_CHECKPOINT_DIR = "checkpointer.checkpoint_dir"
TORCHTUNE_IMMUTABLE_CONFIGS = frozenset(
    {
        TORCHTUNE_MODEL_OUTPUT_DIR,
        TORCHTUNE_TOKENIZER_PATH,
        TORCHTUNE_CHECKPOINT_DIR,
        TORCHTUNE_TOKENIZER_MERGES_FILE,
    }
)
TORCHTUNE_MODEL_LLAMA3_2_1B = "llama3_2/1B"
TORCHTUNE_MODEL_LLAMA3_2_3B = "llama3_2/3B"
TORCHTUNE_MODEL_LLAMA3_3_70B = "llama3_3/70B"
TORCHTUNE_MODEL_QWEN2_5_1_5B = "qwen2_5/1.5B"
TORCHTUNE_SUPPORTED_MODELS = frozenset(
    {
        TORCHTUNE_MODEL_LLAMA3_2_1B,
        TORCHTUNE_MODEL_LLAMA3_2_3B,
        TORCHTUNE_MODEL_LLAMA3_3_70B,
        TORCHTUNE_MODEL_QWEN2_5_1_5B,
    }
)

# -------------------------------------------------------------------------------------------- MPI

MPI_IMPLEMENTATION_OPENMPI = "OpenMPI"
MPI_IMPLEMENTATION_INTEL = "Intel"
MPI_IMPLEMENTATION_MPICH = "MPICH"
MPI_SSH_AUTH_SECRET_SUFFIX = "-mpi-ssh-auth"
MPI_SSH_AUTH_VOLUME = "mpi-ssh-auth"
MPI_SSH_PRIVATE_KEY_FILE = "id_rsa"
MPI_SSH_PUBLIC_KEY_FILE = "id_rsa.pub"
MPI_SSH_AUTHORIZED_KEYS = "authorized_keys"
MPI_SSH_PUBLIC_KEY = "ssh-publickey"
MPI_SSH_PRIVATE_KEY = "ssh-privatekey"
MPI_SSH_AUTH_DEFAULT_MODE = 0o400
MPI_SSH_PRIVATE_KEY_FILE_MODE = 0o640
MPI_SSH_PUBLIC_KEY_FILE_MODE = 0o644
MPI_HOSTFILE_DIR = "/etc/mpi"
MPI_HOSTFILE_NAME = "hostfile"
MPI_HOSTFILE_CONFIGMAP_SUFFIX = "-mpi-hostfile"
MPI_HOSTFILE_VOLUME = "mpi-hostfile"
OPENMPI_ENV_HOSTFILE = "OMPI_MCA_orte_default_hostfile"
OPENMPI_ENV_RSH_ARGS = "OMPI_MCA_plm_rsh_args"
OPENMPI_RSH_ARGS_DEFAULT = "-o ConnectionAttempts=10"
OPENMPI_ENV_KEEP_FQDN_HOSTNAMES = "OMPI_MCA_orte_keep_fqdn_hostnames"
OPENMPI_ENV_DEFAULT_SLOTS = "OMPI_MCA_orte_set_default_slots"
MPI_RESERVED_ENV_NAMES = frozenset(
    {OPENMPI_ENV_HOSTFILE, OPENMPI_ENV_RSH_ARGS, OPENMPI_ENV_KEEP_FQDN_HOSTNAMES, OPENMPI_ENV_DEFAULT_SLOTS}
)

# ---------------------------------------------------------------------------------- JAX, XGBoost

JAX_ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
JAX_ENV_PROCESS_ID = "JAX_PROCESS_ID"
JAX_ENV_COORDINATOR_ADDRESS = "JAX_COORDINATOR_ADDRESS"

XGBOOST_ENV_TRACKER_URI = "DMLC_TRACKER_URI"
XGBOOST_ENV_TRACKER_PORT = "DMLC_TRACKER_PORT"
XGBOOST_ENV_TASK_ID = "DMLC_TASK_ID"
XGBOOST_ENV_NUM_WORKER = "DMLC_NUM_WORKER"
XGBOOST_RESERVED_ENV_NAMES = frozenset(
    {XGBOOST_ENV_TRACKER_URI, XGBOOST_ENV_TRACKER_PORT, XGBOOST_ENV_TASK_ID, XGBOOST_ENV_NUM_WORKER}
)

# ------------------------------------------------------------------------------------------- Flux

FLUX_INSTALLER_CONTAINER = "flux-installer"
FLUX_NETWORK_DEVICE = "eth0"
FLUX_QUEUE_POLICY = "fcfs"
FLUX_CONFIG_MOUNT_PATH = "/etc/flux-config"
FLUX_INSTALL_VOLUME = "flux-install"
FLUX_INSTALL_PATH = "/mnt/flux"
FLUX_CURVE_VOLUME = "flux-curve"
FLUX_CURVE_PATH = "/curve"
FLUX_MEMORY_VOLUME = "shared-memory"
FLUX_MEMORY_PATH = "/dev/shm"
FLUX_SPACK_VOLUME = "spack-install"
FLUX_SPACK_PATH = "/opt/software"
FLUX_ENV_VIEW_IMAGE = "FLUX_VIEW_IMAGE"
FLUX_ENV_NETWORK_DEVICE = "FLUX_NETWORK_DEVICE"
FLUX_ENV_QUEUE_POLICY = "FLUX_QUEUE_POLICY"

# ------------------------------------------------------------------------- TrainJob status server

STATUS_ENV_SERVER_URL = "KUBEFLOW_TRAINER_SERVER_URL"
STATUS_ENV_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
STATUS_ENV_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"
STATUS_MOUNT_PATH = "/var/run/secrets/kubeflow/trainer"
STATUS_TOKEN_VOLUME = "kubeflow-trainer-token"
STATUS_TOKEN_EXPIRATION_SECONDS = 3600
STATUS_TOKEN_FILE = "token"
STATUS_CA_CERT_FILE = "ca.crt"
STATUS_CA_CERT_KEY = "ca.crt"
"""The key of the CA in the ``<trainjob>-tls-config`` ConfigMap (and in the serving certificate's Secret)."""
STATUS_TLS_CONFIGMAP_SUFFIX = "-tls-config"
STATUS_SERVER_PORT = 10443
"""Trainer's default status-server port (``statusServer.port``)."""


def trainjob_status_path(namespace: str, name: str) -> str:
    """The status server's one route, for one TrainJob (Trainer's ``statusserver.StatusUrl``)."""
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/trainjobs/{name}/status"


def trainjob_status_audience(namespace: str, name: str) -> str:
    """The audience a TrainJob's pods' projected token carries (Trainer's ``statusserver.TokenAudience``)."""
    return f"{GROUP}/{VERSION}/namespaces/{namespace}/trainjobs/{name}/status"


# ======================================================================================== TrainJob


# Declarations only, mirroring the upstream Go types field by field.
class RuntimeRef(KubeStruct, frozen=True, kw_only=True):
    name: str | msgspec.UnsetType = msgspec.UNSET
    api_group: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="apiGroup")
    kind: str | msgspec.UnsetType = msgspec.UNSET


class DatasetInitializer(KubeStruct, frozen=True, kw_only=True):
    storage_uri: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="storageUri")
    env: list[EnvVar] | msgspec.UnsetType = msgspec.UNSET
    secret_ref: LocalObjectReference | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="secretRef")


class ModelInitializer(KubeStruct, frozen=True, kw_only=True):
    storage_uri: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="storageUri")
    env: list[EnvVar] | msgspec.UnsetType = msgspec.UNSET
    secret_ref: LocalObjectReference | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="secretRef")


class Initializer(KubeStruct, frozen=True, kw_only=True):
    dataset: DatasetInitializer | msgspec.UnsetType = msgspec.UNSET
    model: ModelInitializer | msgspec.UnsetType = msgspec.UNSET


class Trainer(KubeStruct, frozen=True, kw_only=True):
    image: str | msgspec.UnsetType = msgspec.UNSET
    command: list[str] | msgspec.UnsetType = msgspec.UNSET
    args: list[str] | msgspec.UnsetType = msgspec.UNSET
    env: list[EnvVar] | msgspec.UnsetType = msgspec.UNSET
    num_nodes: int | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="numNodes")
    resources_per_node: ResourceRequirements | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="resourcesPerNode"
    )
    num_proc_per_node: int | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="numProcPerNode")
    """An int32 at v2.3.0 (not int-or-string); Torch's ``auto`` is what an unset value means."""


class ContainerPatch(KubeStruct, frozen=True, kw_only=True):
    name: str | msgspec.UnsetType = msgspec.UNSET
    env: list[EnvVar] | msgspec.UnsetType = msgspec.UNSET
    volume_mounts: list[VolumeMount] | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="volumeMounts")
    security_context: SecurityContext | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="securityContext")


class PodSpecPatch(KubeStruct, frozen=True, kw_only=True):
    service_account_name: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="serviceAccountName")
    volumes: list[Volume] | msgspec.UnsetType = msgspec.UNSET
    init_containers: list[ContainerPatch] | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="initContainers"
    )
    containers: list[ContainerPatch] | msgspec.UnsetType = msgspec.UNSET
    image_pull_secrets: list[LocalObjectReference] | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="imagePullSecrets"
    )
    security_context: PodSecurityContext | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="securityContext"
    )
    node_selector: dict[str, str] | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="nodeSelector")
    affinity: Affinity | msgspec.UnsetType = msgspec.UNSET
    tolerations: list[Toleration] | msgspec.UnsetType = msgspec.UNSET
    scheduling_gates: list[PodSchedulingGate] | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="schedulingGates"
    )
    termination_grace_period_seconds: int | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="terminationGracePeriodSeconds"
    )


class PodTemplatePatch(KubeStruct, frozen=True, kw_only=True):
    metadata: ObjectMeta | msgspec.UnsetType = msgspec.UNSET
    spec: PodSpecPatch | msgspec.UnsetType = msgspec.UNSET


class JobSpecPatch(KubeStruct, frozen=True, kw_only=True):
    template: PodTemplatePatch | msgspec.UnsetType = msgspec.UNSET


class JobTemplatePatch(KubeStruct, frozen=True, kw_only=True):
    metadata: ObjectMeta | msgspec.UnsetType = msgspec.UNSET
    spec: JobSpecPatch | msgspec.UnsetType = msgspec.UNSET


class ReplicatedJobPatch(KubeStruct, frozen=True, kw_only=True):
    name: str | msgspec.UnsetType = msgspec.UNSET
    template: JobTemplatePatch | msgspec.UnsetType = msgspec.UNSET


class JobSetSpecPatch(KubeStruct, frozen=True, kw_only=True):
    replicated_jobs: list[ReplicatedJobPatch] | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="replicatedJobs"
    )


class JobSetTemplatePatch(KubeStruct, frozen=True, kw_only=True):
    metadata: ObjectMeta | msgspec.UnsetType = msgspec.UNSET
    spec: JobSetSpecPatch | msgspec.UnsetType = msgspec.UNSET


class TrainingRuntimeSpecPatch(KubeStruct, frozen=True, kw_only=True):
    template: JobSetTemplatePatch | msgspec.UnsetType = msgspec.UNSET


class RuntimePatch(KubeStruct, frozen=True, kw_only=True):
    manager: str | msgspec.UnsetType = msgspec.UNSET
    time: str | msgspec.UnsetType = msgspec.UNSET
    training_runtime_spec: TrainingRuntimeSpecPatch | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="trainingRuntimeSpec"
    )


class TrainJobSpec(KubeStruct, frozen=True, kw_only=True):
    runtime_ref: RuntimeRef | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="runtimeRef")
    initializer: Initializer | msgspec.UnsetType = msgspec.UNSET
    trainer: Trainer | msgspec.UnsetType = msgspec.UNSET
    runtime_patches: list[RuntimePatch] | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="runtimePatches"
    )
    suspend: bool | msgspec.UnsetType = msgspec.UNSET
    active_deadline_seconds: int | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="activeDeadlineSeconds"
    )
    managed_by: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="managedBy")


class JobStatus(KubeStruct, frozen=True, kw_only=True):
    """Status of one replicated job, as copied from the JobSet's ``replicatedJobsStatus``."""

    name: str | msgspec.UnsetType = msgspec.UNSET
    ready: int | msgspec.UnsetType = msgspec.UNSET
    succeeded: int | msgspec.UnsetType = msgspec.UNSET
    failed: int | msgspec.UnsetType = msgspec.UNSET
    active: int | msgspec.UnsetType = msgspec.UNSET
    suspended: int | msgspec.UnsetType = msgspec.UNSET


class Metric(KubeStruct, frozen=True, kw_only=True):
    name: str | msgspec.UnsetType = msgspec.UNSET
    value: str | msgspec.UnsetType = msgspec.UNSET


class TrainerStatus(KubeStruct, frozen=True, kw_only=True):
    progress_percentage: int | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="progressPercentage")
    estimated_remaining_seconds: int | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="estimatedRemainingSeconds"
    )
    metrics: list[Metric] | msgspec.UnsetType = msgspec.UNSET
    last_updated_time: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="lastUpdatedTime")


class TrainJobStatus(KubeStruct, frozen=True, kw_only=True):
    conditions: list[Condition] | msgspec.UnsetType = msgspec.UNSET
    jobs_status: list[JobStatus] | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="jobsStatus")
    trainer_status: TrainerStatus | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="trainerStatus")


class TrainJob(KubeStruct, frozen=True, kw_only=True):
    api_version: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="apiVersion")
    kind: str | msgspec.UnsetType = msgspec.UNSET
    metadata: ObjectMeta | msgspec.UnsetType = msgspec.UNSET
    spec: TrainJobSpec | msgspec.UnsetType = msgspec.UNSET
    status: TrainJobStatus | msgspec.UnsetType = msgspec.UNSET


class UpdateTrainJobStatusRequest(KubeStruct, frozen=True, kw_only=True):
    """Body the training code sends to Trainer's status server."""

    trainer_status: TrainerStatus | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="trainerStatus")


# ================================================================================= training runtimes


class EnvInjectionTarget(KubeStruct, frozen=True, kw_only=True):
    job_name: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="jobName")
    container_names: list[str] | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="containerNames")


class EnvInjection(KubeStruct, frozen=True, kw_only=True):
    targets: list[EnvInjectionTarget] | msgspec.UnsetType = msgspec.UNSET


class TorchMLPolicySource(KubeStruct, frozen=True, kw_only=True):
    """At v2.3.0 the torch policy has no ``numProcPerNode`` and no ``elasticPolicy``."""

    env_injection: EnvInjection | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="envInjection")


class MPIMLPolicySource(KubeStruct, frozen=True, kw_only=True):
    num_proc_per_node: int | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="numProcPerNode")
    mpi_implementation: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="mpiImplementation")
    ssh_auth_mount_path: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="sshAuthMountPath")
    run_launcher_as_node: bool | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="runLauncherAsNode")


class FluxMLPolicySource(KubeStruct, frozen=True, kw_only=True):
    num_proc_per_node: int | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="numProcPerNode")


class JAXMLPolicySource(KubeStruct, frozen=True, kw_only=True):
    """Empty at v2.3.0: its presence selects the JAX plugin."""


class XGBoostMLPolicySource(KubeStruct, frozen=True, kw_only=True):
    """Empty at v2.3.0: its presence selects the XGBoost plugin."""


class MLPolicy(KubeStruct, frozen=True, kw_only=True):
    num_nodes: int | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="numNodes")
    torch: TorchMLPolicySource | msgspec.UnsetType = msgspec.UNSET
    mpi: MPIMLPolicySource | msgspec.UnsetType = msgspec.UNSET
    flux: FluxMLPolicySource | msgspec.UnsetType = msgspec.UNSET
    jax: JAXMLPolicySource | msgspec.UnsetType = msgspec.UNSET
    xgboost: XGBoostMLPolicySource | msgspec.UnsetType = msgspec.UNSET


class CoschedulingPodGroupPolicySource(KubeStruct, frozen=True, kw_only=True):
    schedule_timeout_seconds: int | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="scheduleTimeoutSeconds"
    )


class VolcanoPodGroupPolicySource(KubeStruct, frozen=True, kw_only=True):
    network_topology: NetworkTopologySpec | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="networkTopology"
    )


class PodGroupPolicy(KubeStruct, frozen=True, kw_only=True):
    coscheduling: CoschedulingPodGroupPolicySource | msgspec.UnsetType = msgspec.UNSET
    volcano: VolcanoPodGroupPolicySource | msgspec.UnsetType = msgspec.UNSET


class JobSetTemplateSpec(KubeStruct, frozen=True, kw_only=True):
    metadata: ObjectMeta | msgspec.UnsetType = msgspec.UNSET
    spec: JobSetSpec | msgspec.UnsetType = msgspec.UNSET


class TrainingRuntimeSpec(KubeStruct, frozen=True, kw_only=True):
    ml_policy: MLPolicy | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="mlPolicy")
    pod_group_policy: PodGroupPolicy | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="podGroupPolicy")
    template: JobSetTemplateSpec | msgspec.UnsetType = msgspec.UNSET


class TrainingRuntime(KubeStruct, frozen=True, kw_only=True):
    """Namespaced runtime; also decodes a ``ClusterTrainingRuntime`` losslessly (``kind`` is kept)."""

    api_version: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="apiVersion")
    kind: str | msgspec.UnsetType = msgspec.UNSET
    metadata: ObjectMeta | msgspec.UnsetType = msgspec.UNSET
    spec: TrainingRuntimeSpec | msgspec.UnsetType = msgspec.UNSET


class ClusterTrainingRuntime(KubeStruct, frozen=True, kw_only=True):
    """Cluster-scoped runtime; same shape as ``TrainingRuntime``."""

    api_version: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="apiVersion")
    kind: str | msgspec.UnsetType = msgspec.UNSET
    metadata: ObjectMeta | msgspec.UnsetType = msgspec.UNSET
    spec: TrainingRuntimeSpec | msgspec.UnsetType = msgspec.UNSET


Runtime: TypeAlias = TrainingRuntime | ClusterTrainingRuntime

RUNTIME_TYPES: Mapping[str, type[TrainingRuntime] | type[ClusterTrainingRuntime]] = {
    TRAINING_RUNTIME_KIND: TrainingRuntime,
    CLUSTER_TRAINING_RUNTIME_KIND: ClusterTrainingRuntime,
}


class _KindOnly(msgspec.Struct, frozen=True):
    kind: str = ""


_kind_decoder = msgspec.json.Decoder(_KindOnly)


def _runtime_type(kind: str) -> type[TrainingRuntime] | type[ClusterTrainingRuntime]:
    try:
        return RUNTIME_TYPES[kind]
    except KeyError:
        raise msgspec.ValidationError(
            f"expected kind {TRAINING_RUNTIME_KIND!r} or {CLUSTER_TRAINING_RUNTIME_KIND!r}, got {kind!r}"
        ) from None


def runtime_from_builtins(obj: Mapping[str, Any]) -> Runtime:
    """Convert a decoded JSON/YAML object to the runtime class its ``kind`` names."""
    kind = obj.get("kind", "")
    return msgspec.convert(obj, _runtime_type(kind if isinstance(kind, str) else ""))


def decode_runtime(data: bytes | str) -> Runtime:
    """Decode a JSON document to the runtime class its ``kind`` names."""
    return msgspec.json.decode(data, type=_runtime_type(_kind_decoder.decode(data).kind))
