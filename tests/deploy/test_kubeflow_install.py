"""The Kubeflow install path: deploy/overlays/kubeflow and the Helm chart assembled from it.

Both are rendered with the real tools (kustomize and helm, built from their Go modules), Trainer's folders
taken from Trainer's Go module at the release tag (tools/kubeflow_install.py), and then offered to the local
API server as server-side applies with ``dryRun=All``. The checks: Trainer's CRDs and shipped runtimes are
exactly Trainer's own; Trainer's controller and webhooks are not there; the pipeline, its NATS and the SDK's
version ConfigMap are; the applier may set blockOwnerDeletion on TrainJob owners; the chart renders the very
objects the overlay does.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tjpipe.local.crds import (
    APPLY_PATCH_CONTENT_TYPE,
    TRAINER_MODULE,
    TRAINER_VERSION,
    _resources_by_kind,
)
from tjpipe.local.helm import helm_template, run_helm
from tjpipe.local.kustomize import kustomize_build
from tjpipe.local.toolchain import go_module_dir

from . import REPO
from .test_kustomize import _client_with, _dry_run_each, _named, _of_kind, _path, _progress

RELEASE = "trainjob-pipeline"
# Helm keeps its release record here (Kubeflow's namespace); the chart's objects name their own namespaces.
RELEASE_NAMESPACE = "kubeflow-system"
PIPELINE_NAMESPACE = "trainjob-pipeline"
SERVICES = ("watcher", "planner", "applier", "webhook")

Obj = dict[str, Any]


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kubeflow_install", REPO / "tools" / "kubeflow_install.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = _load_tool()


def _key(obj: Obj) -> tuple[str, str, str, str]:
    return (obj["apiVersion"], obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def _by_key(objects: list[Obj]) -> dict[tuple[str, str, str, str], Obj]:
    keyed = {_key(obj): obj for obj in objects}
    assert len(keyed) == len(objects), "two objects with the same kind, namespace and name"
    return keyed


@pytest.fixture(scope="module")
def overlay() -> list[Obj]:
    return tool.render_overlay(progress=_progress)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def chart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tool.assemble_chart(tmp_path_factory.mktemp("chart") / RELEASE, progress=_progress)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def chart(chart_dir: Path) -> list[Obj]:
    return helm_template(chart_dir, release=RELEASE, namespace=RELEASE_NAMESPACE, progress=_progress)


@pytest.fixture(scope="module")
def trainer_crds() -> list[Obj]:
    """Trainer's own CRD files at the release tag, from its Go module."""
    folder = go_module_dir(TRAINER_MODULE, TRAINER_VERSION) / "manifests" / "base" / "crds"
    return kustomize_build(folder, progress=_progress)


@pytest.fixture(scope="module")
def trainer_runtimes() -> list[Obj]:
    """Trainer's shipped runtimes as its runtimes overlay renders them (what Trainer's kustomize install applies)."""
    folder = go_module_dir(TRAINER_MODULE, TRAINER_VERSION) / "manifests" / "overlays" / "runtimes"
    return kustomize_build(folder, progress=_progress)


# ------------------------------------------------------------------------------------- the overlay


def test_the_overlay_takes_trainers_folders_from_trainers_repository_at_the_release() -> None:
    """The checked-in overlay names Trainer's folders remotely (nothing copied); each exists in the module."""
    kustomization = yaml.safe_load((tool.OVERLAY / "kustomization.yaml").read_text())
    remote = [r for r in kustomization["resources"] if "://" in r]
    assert [tool.trainer_folder(r) for r in remote] == ["manifests/base/crds", "manifests/overlays/runtimes"]
    module = go_module_dir(TRAINER_MODULE, TRAINER_VERSION)
    assert all((module / tool.trainer_folder(r) / "kustomization.yaml").is_file() for r in remote)
    # Nothing of Trainer's manager, webhook or RBAC folders, and none of the JobSet it bundles.
    assert {r for r in kustomization["resources"] if "://" not in r} == {"../../base", "../../kubeflow-trainer-public"}
    with pytest.raises(ValueError, match=r"v2\.3\.0"):
        tool.trainer_folder("https://github.com/kubeflow/trainer//manifests/base/crds?ref=v2.2.0")


def _check_install(objects: list[Obj], trainer_crds: list[Obj], trainer_runtimes: list[Obj]) -> None:
    # Trainer's CRDs and shipped runtimes, exactly as Trainer's release has them.
    assert sorted(_of_kind(objects, "CustomResourceDefinition"), key=_key) == sorted(trainer_crds, key=_key)
    assert len(trainer_runtimes) >= 8
    assert sorted(_of_kind(objects, "ClusterTrainingRuntime"), key=_key) == sorted(trainer_runtimes, key=_key)
    # Nothing of Trainer's controller manager: no Deployment but the pipeline's, no Trainer image anywhere.
    deployments = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in _of_kind(objects, "Deployment")}
    assert deployments == {(PIPELINE_NAMESPACE, f"tjpipe-{service}") for service in SERVICES}
    images = {
        container["image"]
        for obj in objects
        if obj["kind"] in ("Deployment", "StatefulSet", "Job")
        for container in obj["spec"]["template"]["spec"]["containers"]
    }
    assert not [image for image in images if "kubeflow/trainer" in image]
    # Nor its webhooks: the pipeline's own validating webhook is the only admission webhook.
    assert not _of_kind(objects, "MutatingWebhookConfiguration")
    [webhooks] = _of_kind(objects, "ValidatingWebhookConfiguration")
    assert webhooks["metadata"]["name"] == "tjpipe-validator.trainer.kubeflow.org"
    assert {w["clientConfig"]["service"]["namespace"] for w in webhooks["webhooks"]} == {PIPELINE_NAMESPACE}
    # The pipeline's NATS, and the ConfigMap the Kubeflow SDK reads.
    assert _named(objects, "StatefulSet", "nats")["metadata"]["namespace"] == PIPELINE_NAMESPACE
    public = _named(objects, "ConfigMap", "kubeflow-trainer-public")
    assert public["metadata"]["namespace"] == "kubeflow-system"
    assert public["data"] == {"kubeflow_trainer_version": TRAINER_VERSION}
    # blockOwnerDeletion on a TrainJob owner needs update on trainjobs/finalizers (OwnerReferencesPermission-
    # Enforcement); the applier, which writes every owned object, holds it.
    applier = _named(objects, "ClusterRole", "tjpipe-applier")
    assert any(
        "trainer.kubeflow.org" in rule["apiGroups"]
        and "trainjobs/finalizers" in rule["resources"]
        and "update" in rule["verbs"]
        for rule in applier["rules"]
    )
    binding = _named(objects, "ClusterRoleBinding", "tjpipe-applier")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "tjpipe-applier", "namespace": PIPELINE_NAMESPACE}
    ]
    # The admission policies that confine the applier come along, with their list of excluded namespaces.
    assert {p["metadata"]["name"] for p in _of_kind(objects, "ValidatingAdmissionPolicy")} == {
        "tjpipe-trainjob-components",
        "tjpipe-excluded-namespaces",
    }
    excluded = _named(objects, "ValidatingAdmissionPolicy", "tjpipe-excluded-namespaces")["spec"]["variables"][0]
    assert f"'{PIPELINE_NAMESPACE}'" in excluded["expression"]


def test_the_overlay_keeps_trainers_crds_and_runtimes_and_replaces_its_controller(
    overlay: list[Obj], trainer_crds: list[Obj], trainer_runtimes: list[Obj]
) -> None:
    _check_install(overlay, trainer_crds, trainer_runtimes)


def test_the_overlay_is_the_base_plus_trainers_objects_and_the_version_config_map(overlay: list[Obj]) -> None:
    """Everything else is deploy/base unchanged: one source of truth for the pipeline's objects."""
    base = kustomize_build(REPO / "deploy" / "base", progress=_progress)
    public = kustomize_build(REPO / "deploy" / "kubeflow-trainer-public", progress=_progress)
    rest = [o for o in overlay if o["kind"] not in ("CustomResourceDefinition", "ClusterTrainingRuntime")]
    assert _by_key(rest) == _by_key(base + public)


# --------------------------------------------------------------------------------------- the chart


def test_the_chart_renders_the_overlays_objects(
    chart: list[Obj], overlay: list[Obj], trainer_crds: list[Obj], trainer_runtimes: list[Obj]
) -> None:
    assert _by_key(chart) == _by_key(overlay)
    _check_install(chart, trainer_crds, trainer_runtimes)


def test_the_chart_sets_the_image_and_can_leave_the_runtimes_to_trainer(chart_dir: Path, chart: list[Obj]) -> None:
    rendered = helm_template(
        chart_dir,
        release=RELEASE,
        namespace=RELEASE_NAMESPACE,
        extra_args=[
            "--set",
            "image.repository=registry.example:5000/ml/tjpipe",
            "--set",
            "image.tag=1.2",
            "--set",
            "trainerRuntimes.install=false",
        ],
        progress=_progress,
    )
    assert not _of_kind(rendered, "ClusterTrainingRuntime")
    expected = [o for o in chart if o["kind"] != "ClusterTrainingRuntime"]
    assert sorted(_by_key(rendered)) == sorted(_by_key(expected))
    images: dict[str, str] = {}
    for obj in rendered:
        if obj["kind"] in ("Deployment", "StatefulSet", "Job"):
            for container in obj["spec"]["template"]["spec"]["containers"]:
                images[f"{obj['kind']} {obj['metadata']['name']}"] = container["image"]
    assert images.pop("StatefulSet nats").startswith("nats:")
    assert set(images.values()) == {"registry.example:5000/ml/tjpipe:1.2"}
    assert len(images) == 5  # four services and the bus set-up Job


def _pipeline_config(objects: list[Obj]) -> dict[str, str]:
    (config,) = [o for o in _of_kind(objects, "ConfigMap") if o["metadata"]["name"].startswith("tjpipe-config-")]
    data: dict[str, str] = config["data"]
    return data


def test_trainjob_status_is_off_by_default_and_a_value_turns_it_on(chart_dir: Path, chart: list[Obj]) -> None:
    """Trainer's alpha gate stays off unless asked for; on, the planner is told the server's URL (its Service
    by default, or the value) and reads the CA its Deployment mounts from the status server's TLS Secret."""
    default = _pipeline_config(chart)
    assert default["TJPIPE_TRAINJOB_STATUS"] == "false"
    assert default["TJPIPE_STATUS_SERVER_URL"] == "https://tjpipe-status-server.trainjob-pipeline.svc:10443"
    on = helm_template(
        chart_dir,
        release=RELEASE,
        namespace=RELEASE_NAMESPACE,
        extra_args=["--set", "trainJobStatus.enabled=true"],
        progress=_progress,
    )
    assert _pipeline_config(on)["TJPIPE_TRAINJOB_STATUS"] == "true"
    assert _pipeline_config(on)["TJPIPE_STATUS_SERVER_URL"] == default["TJPIPE_STATUS_SERVER_URL"]
    elsewhere = helm_template(
        chart_dir,
        release=RELEASE,
        namespace=RELEASE_NAMESPACE,
        extra_args=[
            "--set",
            "trainJobStatus.enabled=true",
            "--set",
            "trainJobStatus.serverURL=https://status.example:8443",
        ],
        progress=_progress,
    )
    assert _pipeline_config(elsewhere)["TJPIPE_STATUS_SERVER_URL"] == "https://status.example:8443"
    # Only the setting changed and the status server came (tests/deploy/test_status_server_deploy.py): every
    # other object renders as with the defaults.
    assert {k: v for k, v in _by_key(on).items() if k[1] != "ConfigMap" and k[3] != "tjpipe-status-server"} == {
        k: v for k, v in _by_key(chart).items() if k[1] != "ConfigMap"
    }
    planner = _named(chart, "Deployment", "tjpipe-planner")["spec"]["template"]["spec"]
    (volume,) = [v for v in planner["volumes"] if v["name"] == "status-server-ca"]
    assert volume["secret"] == {
        "secretName": "tjpipe-status-server-tls",
        "optional": True,
        "defaultMode": 0o440,
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    (mount,) = [m for m in planner["containers"][0]["volumeMounts"] if m["name"] == "status-server-ca"]
    assert Path(default["TJPIPE_STATUS_SERVER_CA"]).parent == Path(mount["mountPath"])


def _chart_with(chart_dir: Path, *values: str) -> list[Obj]:
    extra = [arg for value in values for arg in ("--set", value)]
    return helm_template(chart_dir, release=RELEASE, namespace=RELEASE_NAMESPACE, extra_args=extra, progress=_progress)


def test_a_settings_value_sets_its_variable_in_the_shared_config_map_and_nothing_else(
    chart_dir: Path, chart: list[Obj]
) -> None:
    """values.yaml's ``settings``: any variable of tjpipe-config by its name, as a string whatever its type."""
    changed = {"TJPIPE_APPLY_CONCURRENCY": "32", "TJPIPE_LOG_LEVEL": "debug", "TJPIPE_WORK_SWEEP_SECONDS": "7.5"}
    rendered = _chart_with(chart_dir, *(f"settings.{name}={value}" for name, value in changed.items()))
    config, default = _pipeline_config(rendered), _pipeline_config(chart)
    assert {name: config[name] for name in changed} == changed
    assert {k: v for k, v in config.items() if k not in changed} == {
        k: v for k, v in default.items() if k not in changed
    }

    def others(objects: list[Obj]) -> dict[tuple[str, str, str, str], Obj]:
        return {k: v for k, v in _by_key(objects).items() if not k[3].startswith("tjpipe-config-")}

    assert others(rendered) == others(chart)
    # With the TrainJobStatus values too, each value lands on its own line.
    both = _pipeline_config(_chart_with(chart_dir, "trainJobStatus.enabled=true", "settings.TJPIPE_CLUSTER_ID=eu-1"))
    assert (both["TJPIPE_TRAINJOB_STATUS"], both["TJPIPE_CLUSTER_ID"]) == ("true", "eu-1")


def test_a_settings_value_no_service_reads_or_one_a_trainjob_status_value_sets_is_refused(chart_dir: Path) -> None:
    with pytest.raises(RuntimeError, match=r"settings\.TJPIPE_APPLY_CONCURENCY: not a variable of the ConfigMap"):
        _chart_with(chart_dir, "settings.TJPIPE_APPLY_CONCURENCY=32")
    for name in tool.TRAINJOB_STATUS_SETTINGS.values():
        with pytest.raises(RuntimeError, match=rf"settings\.{name}: set it with the trainJobStatus values"):
            _chart_with(chart_dir, f"settings.{name}=x")


def test_the_assembled_chart_lints_and_packages(chart_dir: Path, tmp_path: Path) -> None:
    """What publishing it takes: `helm lint --strict` finds nothing, `helm package` makes the archive."""
    assert "0 chart(s) failed" in run_helm("lint", "--strict", str(chart_dir), progress=_progress)
    run_helm("package", str(chart_dir), "--destination", str(tmp_path), progress=_progress)
    assert [p.name for p in tmp_path.iterdir()] == [f"{RELEASE}-0.1.0.tgz"]


def test_the_chart_as_checked_in_says_how_to_assemble_it(tmp_path: Path) -> None:
    frame = tmp_path / RELEASE
    shutil.copytree(tool.CHART, frame)
    with pytest.raises(RuntimeError, match=r"python tools/kubeflow_install.py chart DIR"):
        helm_template(frame, release=RELEASE, namespace=RELEASE_NAMESPACE, progress=_progress)


# ------------------------------------------------------------------------------------ the API server


@pytest.fixture(scope="module")
def api(kube: Any, overlay: list[Obj]) -> Iterator[tuple[Any, dict[str, dict[str, tuple[str, bool]]]]]:
    """A dynamic client; the two namespaces exist for real (namespaced dry runs need them; the pipeline's with
    its PodSecurity labels), Trainer's CRDs are installed by the session's ``kube`` fixture (a dry-run
    ClusterTrainingRuntime needs its CRD served)."""
    yield from _client_with(
        kube,
        [
            _named(overlay, "Namespace", PIPELINE_NAMESPACE),
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kubeflow-system"}},
        ],
    )


# As test_kustomize.py's test of the same name, but over this install's renders instead of deploy/.
@pytest.mark.cluster
@pytest.mark.parametrize("render", ["overlay", "chart"])
def test_the_api_server_accepts_every_object(
    render: str, request: pytest.FixtureRequest, api: tuple[Any, dict[str, dict[str, tuple[str, bool]]]]
) -> None:
    client, known = api
    objects: list[Obj] = request.getfixturevalue(render)
    rejected, warnings = _dry_run_each(client, known, objects)
    assert rejected == []
    assert warnings == []


def _trainer_public_objects() -> list[Obj]:
    """Trainer's own kubeflow-trainer-public ConfigMap, Role and RoleBinding, as its manager overlay makes them."""
    module = go_module_dir(TRAINER_MODULE, TRAINER_VERSION) / "manifests"
    overlay = yaml.safe_load((module / "overlays" / "manager" / "kustomization.yaml").read_text())
    [generator] = [g for g in overlay["configMapGenerator"] if g["name"] == "kubeflow-trainer-public"]
    data = dict(literal.split("=", 1) for literal in generator["literals"])
    objects: list[Obj] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data}
    ]
    for name in ("public_configmap_role.yaml", "public_configmap_role_binding.yaml"):
        objects += yaml.safe_load_all((module / "base" / "rbac" / name).read_text())
    for obj in objects:
        obj["metadata"]["namespace"] = overlay["namespace"]
    return objects


@pytest.mark.cluster
def test_over_trainers_install_only_the_public_roles_verbs_conflict(
    overlay: list[Obj], api: tuple[Any, dict[str, dict[str, tuple[str, bool]]]]
) -> None:
    """What README's takeover says about --force-conflicts: where Trainer's install applied the version ConfigMap
    and its Role (kubectl's field manager), this install's apply, unforced, conflicts only on the Role's rules
    (this pipeline grants `get`; Trainer also grants list and watch). The CRDs and runtimes are Trainer's own
    objects, equal field for field (tests above), so they cannot conflict."""
    client, known = api

    def server_side_apply(obj: Obj, manager: str, **params: Any) -> None:
        if obj["apiVersion"] not in known:
            known[obj["apiVersion"]] = _resources_by_kind(client, obj["apiVersion"])
        client.request(
            "PATCH",
            _path(known, obj),
            body=obj,
            content_type=APPLY_PATCH_CONTENT_TYPE,
            field_manager=manager,
            serialize=False,
            **params,
        )

    for obj in _trainer_public_objects():  # as Trainer's install applies them (`kubectl apply --server-side`)
        server_side_apply(obj, "kubectl", force_conflicts=True)
    conflicts: dict[str, int] = {}
    for obj in overlay:
        if obj["metadata"].get("namespace") == "kubeflow-system":
            try:
                server_side_apply(obj, "tjpipe-takeover-test", dry_run="All")
            except Exception as error:
                conflicts[f"{obj['kind']} {obj['metadata']['name']}"] = getattr(error, "status", 0)
    assert conflicts == {"Role kubeflow-trainer-public": 409}
