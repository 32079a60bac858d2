"""The one label this pipeline adds: on every ConfigMap and Secret it writes, so the watcher reads only those.

Trainer v2.3.0 labels none of its components, so nothing let a watch select them: the watcher listed and
watched every ConfigMap and every Secret of the cluster, other applications' data included, only to keep
the few a TrainJob controls. With this label its ConfigMap lists and watches carry a label selector and
the API server sends nothing else. It does not watch Secrets at all (a role that may list them reads their
data), but Secrets carry the label too, so an operator can tell the pipeline's apart. It is added in one
place, where the planner turns a component into an apply message, so no plugin can forget it.

Only ConfigMaps and Secrets carry it. A JobSet is read whole anyway, and its labels come from the runtime's
template, which may use this key for something else.

Objects Trainer created before this pipeline took over are unlabelled. ConfigMaps it applies on every plan
get the label with that plan; the runtime snapshot, created once, gets it from the applier the first time it
finds it without it. Trainer's MPI and Flux Secrets stay unlabelled: the applier may not read or patch them.
"""

from __future__ import annotations

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "trainjob-pipeline"
OWNED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
"""The label selector of the watcher's ConfigMap informers."""
LABELLED_KINDS = frozenset({"ConfigMap", "Secret"})
