"""JobSet ``jobset.x-k8s.io/v1alpha2`` (JobSet v0.12.0) as msgspec Structs.

Written by hand from the v0.12.0 Go types and CRD; field names, nesting and JSON names follow them
exactly.  Every field is optional and defaults to ``msgspec.UNSET`` (see ``contracts.kube``), so a
``JobSet`` built by the planner is also the server-side apply configuration it sends.
"""

from __future__ import annotations

import msgspec

from contracts.kube import Condition, JobTemplateSpec, KubeStruct, ObjectMeta, PersistentVolumeClaim

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_API_VERSION = f"{JOBSET_GROUP}/{JOBSET_VERSION}"
JOBSET_KIND = "JobSet"

# Labels and annotations the JobSet controller puts on Jobs and Pods.
LABEL_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
LABEL_JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
LABEL_REPLICATED_JOB_NAME = "jobset.sigs.k8s.io/replicatedjob-name"
LABEL_REPLICATED_JOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
LABEL_GLOBAL_REPLICAS = "jobset.sigs.k8s.io/global-replicas"
LABEL_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
LABEL_JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
LABEL_JOB_KEY = "jobset.sigs.k8s.io/job-key"
LABEL_COORDINATOR = "jobset.sigs.k8s.io/coordinator"
LABEL_GROUP_NAME = "jobset.sigs.k8s.io/group-name"
LABEL_GROUP_REPLICAS = "jobset.sigs.k8s.io/group-replicas"
LABEL_JOB_GROUP_INDEX = "jobset.sigs.k8s.io/job-group-index"
ANNOTATION_EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
ANNOTATION_NODE_SELECTOR_STRATEGY = "alpha.jobset.sigs.k8s.io/node-selector"
ANNOTATION_NAMESPACED_JOB = "alpha.jobset.sigs.k8s.io/namespaced-job"
TAINT_NO_SCHEDULE = "alpha.jobset.sigs.k8s.io/no-schedule"
ANNOTATION_IN_PLACE_RESTART_ATTEMPT = "jobset.sigs.k8s.io/in-place-restart-attempt"
ANNOTATION_DISABLE_IN_PLACE_RESTART = "jobset.sigs.k8s.io/disable-in-place-restart"

# spec.managedBy value of the built-in JobSet controller.
JOBSET_CONTROLLER_NAME = "jobset.sigs.k8s.io/jobset-controller"

# status.conditions[].type
CONDITION_COMPLETED = "Completed"
CONDITION_FAILED = "Failed"
CONDITION_SUSPENDED = "Suspended"
CONDITION_RESTARTING = "RestartingJobSet"
CONDITION_STARTUP_POLICY_IN_PROGRESS = "StartupPolicyInProgress"
CONDITION_STARTUP_POLICY_COMPLETED = "StartupPolicyCompleted"

# spec.replicatedJobs[].dependsOn[].status
DEPENDS_ON_READY = "Ready"
DEPENDS_ON_COMPLETE = "Complete"

# spec.successPolicy.operator
OPERATOR_ALL = "All"
OPERATOR_ANY = "Any"

# spec.failurePolicy.rules[].action
ACTION_FAIL_JOBSET = "FailJobSet"
ACTION_RESTART_JOBSET = "RestartJobSet"
ACTION_RESTART_JOBSET_AND_IGNORE_MAX_RESTARTS = "RestartJobSetAndIgnoreMaxRestarts"
ACTION_RESTART_JOB = "RestartJob"
ACTION_RESTART_JOB_AND_IGNORE_MAX_RESTARTS = "RestartJobAndIgnoreMaxRestarts"

# spec.failurePolicy.restartStrategy
RESTART_STRATEGY_RECREATE = "Recreate"
RESTART_STRATEGY_BLOCKING_RECREATE = "BlockingRecreate"
RESTART_STRATEGY_IN_PLACE_RESTART = "InPlaceRestart"

# spec.startupPolicy.startupPolicyOrder
STARTUP_ANY_ORDER = "AnyOrder"
STARTUP_IN_ORDER = "InOrder"

# spec.volumeClaimPolicies[].retentionPolicy.whenDeleted
RETENTION_POLICY_DELETE = "Delete"
RETENTION_POLICY_RETAIN = "Retain"


# Declarations only, mirroring the upstream Go types field by field.
class DependsOn(KubeStruct, frozen=True, kw_only=True):
    name: str | msgspec.UnsetType = msgspec.UNSET
    status: str | msgspec.UnsetType = msgspec.UNSET
    """``Ready`` or ``Complete``."""


class ReplicatedJob(KubeStruct, frozen=True, kw_only=True):
    name: str | msgspec.UnsetType = msgspec.UNSET
    group_name: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="groupName")
    template: JobTemplateSpec | msgspec.UnsetType = msgspec.UNSET
    replicas: int | msgspec.UnsetType = msgspec.UNSET
    depends_on: list[DependsOn] | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="dependsOn")


class Network(KubeStruct, frozen=True, kw_only=True):
    enable_dns_hostnames: bool | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="enableDNSHostnames")
    subdomain: str | msgspec.UnsetType = msgspec.UNSET
    publish_not_ready_addresses: bool | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="publishNotReadyAddresses"
    )


class SuccessPolicy(KubeStruct, frozen=True, kw_only=True):
    operator: str | msgspec.UnsetType = msgspec.UNSET
    """``All`` or ``Any``."""
    target_replicated_jobs: list[str] | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="targetReplicatedJobs"
    )


class FailurePolicyRule(KubeStruct, frozen=True, kw_only=True):
    name: str | msgspec.UnsetType = msgspec.UNSET
    action: str | msgspec.UnsetType = msgspec.UNSET
    on_job_failure_reasons: list[str] | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="onJobFailureReasons"
    )
    on_job_failure_message_patterns: list[str] | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="onJobFailureMessagePatterns"
    )
    target_replicated_jobs: list[str] | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="targetReplicatedJobs"
    )


class FailurePolicy(KubeStruct, frozen=True, kw_only=True):
    max_restarts: int | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="maxRestarts")
    restart_strategy: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="restartStrategy")
    rules: list[FailurePolicyRule] | msgspec.UnsetType = msgspec.UNSET


class StartupPolicy(KubeStruct, frozen=True, kw_only=True):
    startup_policy_order: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="startupPolicyOrder")


class Coordinator(KubeStruct, frozen=True, kw_only=True):
    replicated_job: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="replicatedJob")
    job_index: int | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="jobIndex")
    pod_index: int | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="podIndex")


class VolumeRetentionPolicy(KubeStruct, frozen=True, kw_only=True):
    when_deleted: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="whenDeleted")
    """``Delete`` or ``Retain``."""


class VolumeClaimPolicy(KubeStruct, frozen=True, kw_only=True):
    templates: list[PersistentVolumeClaim] | msgspec.UnsetType = msgspec.UNSET
    retention_policy: VolumeRetentionPolicy | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="retentionPolicy"
    )


class JobSetSpec(KubeStruct, frozen=True, kw_only=True):
    replicated_jobs: list[ReplicatedJob] | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="replicatedJobs"
    )
    network: Network | msgspec.UnsetType = msgspec.UNSET
    success_policy: SuccessPolicy | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="successPolicy")
    failure_policy: FailurePolicy | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="failurePolicy")
    startup_policy: StartupPolicy | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="startupPolicy")
    suspend: bool | msgspec.UnsetType = msgspec.UNSET
    coordinator: Coordinator | msgspec.UnsetType = msgspec.UNSET
    managed_by: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="managedBy")
    ttl_seconds_after_finished: int | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="ttlSecondsAfterFinished"
    )
    volume_claim_policies: list[VolumeClaimPolicy] | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="volumeClaimPolicies"
    )


class ReplicatedJobStatus(KubeStruct, frozen=True, kw_only=True):
    name: str | msgspec.UnsetType = msgspec.UNSET
    ready: int | msgspec.UnsetType = msgspec.UNSET
    succeeded: int | msgspec.UnsetType = msgspec.UNSET
    failed: int | msgspec.UnsetType = msgspec.UNSET
    active: int | msgspec.UnsetType = msgspec.UNSET
    suspended: int | msgspec.UnsetType = msgspec.UNSET
    job_restarts: list[int] | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="jobRestarts")
    job_restarts_count_towards_max: list[int] | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="jobRestartsCountTowardsMax"
    )


class JobSetStatus(KubeStruct, frozen=True, kw_only=True):
    conditions: list[Condition] | msgspec.UnsetType = msgspec.UNSET
    restarts: int | msgspec.UnsetType = msgspec.UNSET
    restarts_count_towards_max: int | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="restartsCountTowardsMax"
    )
    terminal_state: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="terminalState")
    replicated_jobs_status: list[ReplicatedJobStatus] | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="replicatedJobsStatus"
    )
    previous_in_place_restart_attempt: int | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="previousInPlaceRestartAttempt"
    )
    current_in_place_restart_attempt: int | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="currentInPlaceRestartAttempt"
    )


class JobSet(KubeStruct, frozen=True, kw_only=True):
    api_version: str | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="apiVersion")
    kind: str | msgspec.UnsetType = msgspec.UNSET
    metadata: ObjectMeta | msgspec.UnsetType = msgspec.UNSET
    spec: JobSetSpec | msgspec.UnsetType = msgspec.UNSET
    status: JobSetStatus | msgspec.UnsetType = msgspec.UNSET
