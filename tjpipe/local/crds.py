"""CRDs and sample ClusterTrainingRuntimes, read from the owning projects' Go modules at pinned versions.

Why from Go modules: the YAML belongs to Kubeflow Trainer, JobSet and scheduler-plugins; copying it into
this repository would fork it silently and blur licensing. Their published module versions are
immutable, checksummed by the Go toolchain and cached on disk after the first download, so reading them
from there is as reproducible as a vendored copy and keeps the repository holding only code we wrote.
The versions below are the ones Trainer v2.3.0's own go.mod requires, so the CRDs match what Trainer
was tested against.

Why a tiny kustomize in Python: Trainer ships its runtimes as kustomize bases plus an overlay that labels
them and pins image tags. We only need that overlay's two transforms (labels on metadata, image tags in
every container list), and implementing them here avoids a kustomize binary. Any kustomization feature
we do not implement raises instead of being ignored, so a future Trainer bump cannot silently produce
different objects.

Why server-side apply with a fixed field manager: installing is idempotent and re-running setup against
a cluster that already has the CRDs just takes ownership back; waiting for discovery (not only the
Established condition) is what makes the very next request for a new kind succeed.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import ApiClient
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError

from tjpipe.local import toolchain
from tjpipe.local.toolchain import generated_crds_dir, go_module_dir

TRAINER_MODULE = "github.com/kubeflow/trainer/v2"
TRAINER_VERSION = "v2.3.0"
JOBSET_MODULE = toolchain.JOBSET_MODULE
JOBSET_VERSION = f"v{toolchain.JOBSET_VERSION}"  # its manager is built from the same version
SCHEDULER_PLUGINS_MODULE = "sigs.k8s.io/scheduler-plugins"
SCHEDULER_PLUGINS_VERSION = "v0.35.4-devel"

SETUP_FIELD_MANAGER = "tjpipe-setup"
APPLY_PATCH_CONTENT_TYPE = "application/apply-patch+yaml"

_POLL_SECONDS = 0.1
_TRAINER_CRDS = "manifests/base/crds"
_RUNTIMES_OVERLAY = "manifests/overlays/runtimes"
# Shipped as a base of its own that the default overlay does not include; we render it with the overlay's
# transforms so it looks exactly as it would if the overlay listed it.
_EXTRA_RUNTIME_BASES = ("manifests/base/runtimes/data-cache",)
# What Trainer's data-cache overlay installs beside torch-distributed-with-cache: the cluster role of the
# cache initializer, and the ServiceAccount and RoleBinding its runtime names, per namespace.
_CACHE_CLUSTER_ROLE = "manifests/overlays/data-cache/cluster_role.yaml"
_CACHE_NAMESPACE_RBAC = "manifests/overlays/data-cache/namespace-rbac"
CACHE_INITIALIZER_NAMESPACE = "default"
"""Where Trainer's data-cache overlay puts the ServiceAccount; other namespaces get it with
``cache_initializer_namespace_objects``, as Trainer's overlay tells its users to."""


@dataclass(frozen=True)
class ManifestSource:
    """One YAML file inside a Go module; `only_names` keeps just those objects (empty keeps all)."""

    module: str
    version: str
    path: str
    only_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class GeneratedSource:
    """CRDs made by controller-gen from the API types in `package` of a module (see generated_crds_dir)."""

    module: str
    version: str
    package: str
    only_names: tuple[str, ...] = ()


# The volcano.sh/apis revision Trainer v2.3.0 pins; Volcano's CRD YAML lives only outside the module proxy.
VOLCANO_APIS_MODULE = "volcano.sh/apis"
VOLCANO_APIS_VERSION = "v1.13.1-0.20251028070205-46d20c0699e7"

# Extension point: add a source here and every caller of crd_manifests() gets it.
CRD_SOURCES: tuple[ManifestSource | GeneratedSource, ...] = (
    *(
        ManifestSource(TRAINER_MODULE, TRAINER_VERSION, f"{_TRAINER_CRDS}/trainer.kubeflow.org_{plural}.yaml")
        for plural in ("trainjobs", "trainingruntimes", "clustertrainingruntimes")
    ),
    ManifestSource(JOBSET_MODULE, JOBSET_VERSION, "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"),
    ManifestSource(
        SCHEDULER_PLUGINS_MODULE,
        SCHEDULER_PLUGINS_VERSION,
        "manifests/coscheduling/crd.yaml",
        only_names=("podgroups.scheduling.x-k8s.io",),
    ),
    GeneratedSource(
        VOLCANO_APIS_MODULE,
        VOLCANO_APIS_VERSION,
        "pkg/apis/scheduling/v1beta1",
        only_names=("podgroups.scheduling.volcano.sh",),
    ),
)


def crd_manifests(
    *, sources: Sequence[ManifestSource | GeneratedSource] = CRD_SOURCES, progress: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """The CustomResourceDefinitions named by `sources`, as parsed YAML."""
    manifests: list[dict[str, Any]] = []
    for source in sources:
        if isinstance(source, GeneratedSource):
            folder = generated_crds_dir(source.module, source.version, source.package, progress=progress)
            documents = [d for path in sorted(folder.glob("*.yaml")) for d in _load_yaml_documents(path)]
            where = f"{source.module}@{source.version}/{source.package}"
        else:
            documents = _load_yaml_documents(go_module_dir(source.module, source.version) / source.path)
            where = f"{source.module}@{source.version}/{source.path}"
        found = [
            document
            for document in documents
            if document.get("kind") == "CustomResourceDefinition"
            and (not source.only_names or document["metadata"]["name"] in source.only_names)
        ]
        if not found:
            raise RuntimeError(f"no CustomResourceDefinition found in {where}")
        manifests.extend(found)
    return manifests


def install_crds(api_client: ApiClient, manifests: Sequence[dict[str, Any]], *, timeout: float = 60) -> None:
    """Server-side apply the CRDs, then wait until each is Established and served by discovery."""
    with _dynamic_client(api_client) as client:
        for manifest in manifests:
            _send(
                client,
                "PATCH",
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{manifest['metadata']['name']}",
                body=manifest,
                content_type=APPLY_PATCH_CONTENT_TYPE,
                field_manager=SETUP_FIELD_MANAGER,
                force_conflicts=True,
            )
        # Discovery is cheap to poll and only lists a CRD's kinds once it is Established; the full CRD is
        # fetched once per CRD at the end to confirm the condition itself.
        deadline = time.monotonic() + timeout
        pending = {manifest["metadata"]["name"]: manifest for manifest in manifests}
        while pending:
            for name, manifest in list(pending.items()):
                if _crd_discoverable(client, manifest) and _crd_established(client, name):
                    del pending[name]
            if not pending:
                break
            if time.monotonic() >= deadline:
                names = ", ".join(sorted(pending))
                raise TimeoutError(f"CRDs not Established and discoverable after {timeout:.0f}s: {names}")
            time.sleep(_POLL_SECONDS)


def apply_objects(
    api_client: ApiClient, objects: Sequence[dict[str, Any]], *, field_manager: str, force: bool = True
) -> None:
    """Server-side apply arbitrary objects, finding each kind's resource path through discovery."""
    with _dynamic_client(api_client) as client:
        resources: dict[str, dict[str, tuple[str, bool]]] = {}
        for obj in objects:
            api_version, kind = obj["apiVersion"], obj["kind"]
            if api_version not in resources:
                resources[api_version] = _resources_by_kind(client, api_version)
            if kind not in resources[api_version]:
                raise LookupError(f"the server does not serve kind {kind} in {api_version}")
            plural, namespaced = resources[api_version][kind]
            metadata = obj["metadata"]
            base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
            if namespaced:
                namespace = metadata.get("namespace")
                if not namespace:
                    raise ValueError(f"{kind} {metadata['name']} is namespaced but has no metadata.namespace")
                path = f"{base}/namespaces/{namespace}/{plural}/{metadata['name']}"
            else:
                path = f"{base}/{plural}/{metadata['name']}"
            _send(
                client,
                "PATCH",
                path,
                body=obj,
                content_type=APPLY_PATCH_CONTENT_TYPE,
                field_manager=field_manager,
                force_conflicts=force,
            )


def shipped_runtimes() -> dict[str, dict[str, Any]]:
    """Every ClusterTrainingRuntime Trainer ships, as its runtimes overlay renders them, keyed by name."""
    root = go_module_dir(TRAINER_MODULE, TRAINER_VERSION)
    overlay_dir = root / _RUNTIMES_OVERLAY
    objects = _render_kustomization(overlay_dir)
    overlay = _load_kustomization(overlay_dir)
    for extra_base in _EXTRA_RUNTIME_BASES:
        objects.extend(_apply_kustomize_transforms(_render_kustomization(root / extra_base), overlay))
    runtimes: dict[str, dict[str, Any]] = {}
    for obj in objects:
        if obj.get("kind") != "ClusterTrainingRuntime":
            continue
        name = obj["metadata"]["name"]
        if name in runtimes:
            raise RuntimeError(f"Trainer {TRAINER_VERSION} ships two ClusterTrainingRuntimes named {name}")
        runtimes[name] = obj
    return runtimes


def cache_initializer_namespace_objects(namespace: str) -> list[dict[str, Any]]:
    """The ServiceAccount ``kubeflow-trainer-cache-initializer`` that torch-distributed-with-cache's dataset
    initializer runs as, and the RoleBinding to its ClusterRole, in ``namespace``."""
    objects = _render_kustomization(go_module_dir(TRAINER_MODULE, TRAINER_VERSION) / _CACHE_NAMESPACE_RBAC)
    for obj in objects:
        obj["metadata"]["namespace"] = namespace
    return objects


def runtime_prerequisites() -> list[dict[str, Any]]:
    """What Trainer's install provides that its shipped runtimes name: the cache initializer's ClusterRole,
    and its ServiceAccount and RoleBinding in ``CACHE_INITIALIZER_NAMESPACE``, as the data-cache overlay
    places them. (That overlay's LeaderWorkerSet controller serves the cache program itself, which never
    runs on a simulated cluster, so it is left out.)"""
    root = go_module_dir(TRAINER_MODULE, TRAINER_VERSION)
    return [
        *_load_yaml_documents(root / _CACHE_CLUSTER_ROLE),
        *cache_initializer_namespace_objects(CACHE_INITIALIZER_NAMESPACE),
    ]


# --- server access ------------------------------------------------------------------------------------


@contextmanager
def _dynamic_client(api_client: ApiClient) -> Iterator[DynamicClient]:
    # DynamicClient persists its discovery cache to a file; keep it private and short-lived so a later run
    # against a different apiserver on the same port never reads stale kinds.
    with tempfile.TemporaryDirectory(prefix="tjpipe-discovery-") as scratch:
        cache_file = os.path.join(scratch, "discovery.json")
        yield DynamicClient(api_client, cache_file=cache_file)  # type: ignore[no-untyped-call]


def _request(client: DynamicClient, method: str, path: str, **params: Any) -> dict[str, Any]:
    # Plain JSON: DynamicClient's ResourceInstance wrapper is ~10x slower on a 0.5 MB CRD.
    response = client.request(method, path, serialize=False, **params)
    result: dict[str, Any] = json.loads(response.data)
    return result


def _send(client: DynamicClient, method: str, path: str, **params: Any) -> None:
    """A request whose response body we do not need (parsing a 0.5 MB CRD back costs real time)."""
    client.request(method, path, serialize=False, **params)


def _crd_established(client: DynamicClient, name: str) -> bool:
    crd = _request(client, "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    conditions = crd.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def _crd_discoverable(client: DynamicClient, manifest: Mapping[str, Any]) -> bool:
    spec = manifest["spec"]
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        try:
            listing = _request(client, "GET", f"/apis/{spec['group']}/{version['name']}")
        except NotFoundError:
            return False
        if spec["names"]["plural"] not in {resource["name"] for resource in listing.get("resources") or []}:
            return False
    return True


def _resources_by_kind(client: DynamicClient, api_version: str) -> dict[str, tuple[str, bool]]:
    """kind -> (plural, namespaced) for the top-level resources of one group/version."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    try:
        listing = _request(client, "GET", base)
    except NotFoundError as error:
        raise LookupError(f"the server does not serve {api_version}") from error
    return {
        resource["kind"]: (resource["name"], bool(resource["namespaced"]))
        for resource in listing.get("resources") or []
        if "/" not in resource["name"]
    }


# --- the subset of kustomize Trainer's runtime manifests use -------------------------------------------

# libyaml parses the large CRD files ~20x faster than the pure-Python loader.
_YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_SUPPORTED_KUSTOMIZATION_KEYS = frozenset({"apiVersion", "kind", "resources", "labels", "images"})
_CONTAINER_LIST_KEYS = frozenset({"containers", "initContainers"})


def _load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    with path.open() as handle:
        return [document for document in yaml.load_all(handle, Loader=_YAML_LOADER) if document]


def _load_kustomization(directory: Path) -> dict[str, Any]:
    for file_name in ("kustomization.yaml", "kustomization.yml", "Kustomization"):
        candidate = directory / file_name
        if candidate.is_file():
            with candidate.open() as handle:
                kustomization: dict[str, Any] = yaml.load(handle, Loader=_YAML_LOADER) or {}
            unsupported = set(kustomization) - _SUPPORTED_KUSTOMIZATION_KEYS
            if unsupported:
                raise NotImplementedError(
                    f"{candidate} uses kustomize features we do not render: {sorted(unsupported)}"
                )
            return kustomization
    raise FileNotFoundError(f"no kustomization file in {directory}")


def _render_kustomization(directory: Path) -> list[dict[str, Any]]:
    kustomization = _load_kustomization(directory)
    objects: list[dict[str, Any]] = []
    for resource in kustomization.get("resources") or []:
        path = directory / resource
        if path.is_dir():
            objects.extend(_render_kustomization(path))
        else:
            objects.extend(_load_yaml_documents(path))
    return _apply_kustomize_transforms(objects, kustomization)


def _apply_kustomize_transforms(
    objects: Sequence[dict[str, Any]], kustomization: Mapping[str, Any]
) -> list[dict[str, Any]]:
    transformed = [copy.deepcopy(obj) for obj in objects]
    for label_entry in kustomization.get("labels") or []:
        unsupported = set(label_entry) - {"pairs", "includeSelectors", "includeTemplates"}
        if unsupported or label_entry.get("includeSelectors") or label_entry.get("includeTemplates"):
            raise NotImplementedError(f"only metadata labels are rendered, not {label_entry}")
        for obj in transformed:
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(label_entry.get("pairs") or {})
    for image_entry in kustomization.get("images") or []:
        for obj in transformed:
            _rewrite_images(obj, image_entry)
    return transformed


def _rewrite_images(node: Any, image_entry: Mapping[str, str]) -> None:
    """Like kustomize's image transformer: every `containers`/`initContainers` list at any depth."""
    if isinstance(node, list):
        for item in node:
            _rewrite_images(item, image_entry)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in _CONTAINER_LIST_KEYS and isinstance(value, list):
            for container in value:
                if isinstance(container, dict) and isinstance(container.get("image"), str):
                    container["image"] = _retag_image(container["image"], image_entry)
        _rewrite_images(value, image_entry)


def _retag_image(image: str, image_entry: Mapping[str, str]) -> str:
    name, tag, digest = _split_image(image)
    if name != image_entry["name"]:
        return image
    new_name = image_entry.get("newName") or name
    if image_entry.get("digest"):
        return f"{new_name}@{image_entry['digest']}"
    if image_entry.get("newTag"):
        return f"{new_name}:{image_entry['newTag']}"
    if digest:
        return f"{new_name}@{digest}"
    return f"{new_name}:{tag}" if tag else new_name


def _split_image(image: str) -> tuple[str, str, str]:
    """(name, tag, digest); a ':' before the last '/' belongs to a registry port, not a tag."""
    name, _, digest = image.partition("@")
    colon = name.rfind(":")
    if colon > name.rfind("/"):
        return name[:colon], name[colon + 1 :], digest
    return name, "", digest
