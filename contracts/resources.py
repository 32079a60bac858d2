"""REST names of the kinds this pipeline reads or writes.

Discovery would find these at run time, but the set is small and fixed by the CRDs the pipeline is built
for; naming them here saves a discovery round trip per process and makes a missing CRD an explicit 404
on first use, which the applier classifies as permanent, instead of a startup hang.
"""

from __future__ import annotations

import msgspec


class Resource(msgspec.Struct, frozen=True, kw_only=True):
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def path(self, *, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        group, _, version = self.api_version.rpartition("/")
        base = f"/apis/{group}/{version}" if group else f"/api/{version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base


TRAINJOB = Resource(api_version="trainer.kubeflow.org/v1alpha1", kind="TrainJob", plural="trainjobs")
TRAINING_RUNTIME = Resource(
    api_version="trainer.kubeflow.org/v1alpha1", kind="TrainingRuntime", plural="trainingruntimes"
)
CLUSTER_TRAINING_RUNTIME = Resource(
    api_version="trainer.kubeflow.org/v1alpha1",
    kind="ClusterTrainingRuntime",
    plural="clustertrainingruntimes",
    namespaced=False,
)
JOBSET = Resource(api_version="jobset.x-k8s.io/v1alpha2", kind="JobSet", plural="jobsets")
POD_GROUP = Resource(api_version="scheduling.x-k8s.io/v1alpha1", kind="PodGroup", plural="podgroups")
VOLCANO_POD_GROUP = Resource(api_version="scheduling.volcano.sh/v1beta1", kind="PodGroup", plural="podgroups")
CONFIG_MAP = Resource(api_version="v1", kind="ConfigMap", plural="configmaps")
SECRET = Resource(api_version="v1", kind="Secret", plural="secrets")
EVENT = Resource(api_version="v1", kind="Event", plural="events")
NAMESPACE = Resource(api_version="v1", kind="Namespace", plural="namespaces", namespaced=False)
PRIORITY_CLASS = Resource(
    api_version="scheduling.k8s.io/v1", kind="PriorityClass", plural="priorityclasses", namespaced=False
)

KNOWN: tuple[Resource, ...] = (
    TRAINJOB,
    TRAINING_RUNTIME,
    CLUSTER_TRAINING_RUNTIME,
    JOBSET,
    POD_GROUP,
    VOLCANO_POD_GROUP,
    CONFIG_MAP,
    SECRET,
    EVENT,
    NAMESPACE,
    PRIORITY_CLASS,
)
_BY_GVK = {(r.api_version, r.kind): r for r in KNOWN}


def resource_for(api_version: str, kind: str) -> Resource:
    try:
        return _BY_GVK[(api_version, kind)]
    except KeyError:
        raise LookupError(f"no REST mapping for {kind} in {api_version}") from None
