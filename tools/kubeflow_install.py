"""Render the Kubeflow install (deploy/overlays/kubeflow) from Trainer's Go module, and assemble the Helm chart.

Why this exists: the overlay names Trainer v2.3.0's CRDs and shipped runtimes by kustomize remote references
into Trainer's repository at the release tag, so that nothing of Trainer's is copied into this repository and
``kubectl apply -k`` takes them from Trainer itself. Where that repository cannot be reached (the tests, an
air-gapped machine) the same folders are in Trainer's Go module, which the module proxy serves and the project
already reads (``tjpipe.local.crds``): this tool rewrites each remote reference to that folder and runs the real
kustomize, so both ways render the same objects.

The Helm chart is that same render, packaged: charts/trainjob-pipeline holds only the chart's frame (values,
the templates that emit the files); ``chart DIR`` writes the frame plus Trainer's CRDs (``crds/``, which Helm
installs before anything else and never deletes) and the rendered objects (``files/``) into DIR. One source of
truth, deploy/, for kustomize and Helm alike. The chart's ``fleet`` value picks among renders of deploy/ too:
``member`` swaps the objects deploy/overlays/fleet-member changes in the base for its versions and adds its
reviewer, ``hub`` adds deploy/overlays/fleet-hub's objects (the set-up Job's ``--member`` list from the value).

Usage::

    python tools/kubeflow_install.py kustomize            # the overlay's objects, as YAML on stdout
    python tools/kubeflow_install.py chart DIR            # the installable Helm chart, written into DIR
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from tjpipe.local.crds import TRAINER_MODULE, TRAINER_VERSION
from tjpipe.local.kustomize import kustomize_build
from tjpipe.local.toolchain import go_module_dir

REPO = Path(__file__).resolve().parents[1]
OVERLAY = REPO / "deploy" / "overlays" / "kubeflow"
ONE_PROCESS = REPO / "deploy" / "components" / "one-process"
HISTORY_SERVER = REPO / "deploy" / "components" / "history-server"
MONITORING = REPO / "deploy" / "components" / "monitoring"
# What the chart's trainJobStatus.enabled adds: the status server's Deployment, Service and identity.
STATUS_SERVER = REPO / "deploy" / "components" / "status-server"
# The monitoring component's objects by the chart value that turns them on (all off by default): the metrics
# Services only serve the ServiceMonitor, so they go with it.
MONITORING_FILES = {"ServiceMonitor": "servicemonitor", "Service": "servicemonitor", "PrometheusRule": "prometheusrule"}
MONITORING_DEFAULT_FILE = "dashboard"
CHART = REPO / "charts" / "trainjob-pipeline"
BASE = REPO / "deploy" / "base"
FLEET_HUB = REPO / "deploy" / "overlays" / "fleet-hub"
FLEET_MEMBER = REPO / "deploy" / "overlays" / "fleet-member"
# Where the hub's set-up Job lists its members in files/fleet/hub.yaml; the chart puts fleet.members there.
FLEET_MEMBERS_MARK = "FLEET-MEMBERS"
# The Secrets the fleet's objects name, by the chart value (fleet.secrets.<key>) that may rename each.
FLEET_SECRETS = {
    "member": "nats-fleet-member",
    "hubConfig": "fleet-hub-nats-config",
    "hubLeafTls": "fleet-hub-leaf-tls",
    "hubClientTls": "fleet-hub-client-tls",
    "admin": "fleet-admin-nats-creds",
    "reader": "fleet-reader-nats-creds",
    "clusters": "fleet-history-clusters",
}
# The image deploy/base names (its `images:` entry); the chart's values replace it.
PIPELINE_IMAGE = "trainjob-pipeline"

# kustomize's remote form for a folder of a git repository at a tag: <repository>//<folder>?ref=<tag>.
_TRAINER_REMOTE = re.compile(r"^https://github\.com/kubeflow/trainer//(?P<folder>[^?]+)\?ref=(?P<ref>[^&]+)$")
_KUSTOMIZATION_KEYS = frozenset({"apiVersion", "kind", "resources"})

Obj = dict[str, Any]


def trainer_folder(resource: str) -> str | None:
    """The folder of Trainer's repository a kustomize resource names, or None if it names none.

    A reference to another Trainer release is refused: the pipeline rebuilds exactly TRAINER_VERSION.
    """
    match = _TRAINER_REMOTE.match(resource)
    if match is None:
        return None
    if match["ref"] != TRAINER_VERSION:
        raise ValueError(f"{resource}: this pipeline matches Trainer {TRAINER_VERSION}, not {match['ref']}")
    return match["folder"]


def _local_kustomization(overlay: Path, scratch: Path, components: Sequence[Path] = ()) -> None:
    """Write into ``scratch`` a kustomization equal to ``overlay``'s, Trainer's folders read from its Go module.

    kustomize refuses absolute paths, so every resource becomes a path relative to ``scratch``; so does each
    of ``components`` (kustomize components, e.g. ``ONE_PROCESS``), which are added to it.
    """
    with (overlay / "kustomization.yaml").open() as handle:
        kustomization: Obj = yaml.safe_load(handle)
    unsupported = set(kustomization) - _KUSTOMIZATION_KEYS
    if unsupported:
        raise NotImplementedError(f"{overlay}: only resources are rewritten, not {sorted(unsupported)}")
    module = go_module_dir(TRAINER_MODULE, TRAINER_VERSION)
    resources: list[str] = []
    for resource in kustomization.get("resources") or []:
        folder = trainer_folder(resource)
        if folder is not None:
            target = module / folder
        elif "://" in resource:
            raise NotImplementedError(f"{overlay}: {resource} is neither local nor one of Trainer's folders")
        else:
            target = (overlay / resource).resolve()
        if not target.is_dir():
            raise FileNotFoundError(f"{overlay}: {resource} resolves to {target}, which is not a folder")
        resources.append(os.path.relpath(target, scratch))
    rewritten: Obj = {**kustomization, "resources": resources}
    if components:
        rewritten["components"] = [os.path.relpath(component, scratch) for component in components]
    (scratch / "kustomization.yaml").write_text(yaml.safe_dump(rewritten))


def render_overlay(
    overlay: Path = OVERLAY, *, components: Sequence[Path] = (), progress: Callable[[str], None] = print
) -> list[Obj]:
    """``kustomize build overlay``, with Trainer's remote folders taken from its Go module."""
    with tempfile.TemporaryDirectory(prefix="tjpipe-kubeflow-") as scratch:
        _local_kustomization(overlay, Path(scratch), components)
        return kustomize_build(Path(scratch), progress=progress)


def _is_trainer_crd(obj: Obj) -> bool:
    return obj["kind"] == "CustomResourceDefinition" and obj["spec"]["group"] == "trainer.kubeflow.org"


def _split_image(image: str) -> tuple[str, str]:
    """(repository, tag); a ':' before the last '/' belongs to a registry port."""
    colon = image.rfind(":")
    if colon > image.rfind("/"):
        return image[:colon], image[colon + 1 :]
    return image, ""


def _pipeline_image(objects: Sequence[Obj]) -> tuple[str, str]:
    images = {
        container["image"]
        for obj in objects
        if obj["kind"] in ("Deployment", "Job")
        for container in obj["spec"]["template"]["spec"]["containers"]
        if _split_image(container["image"])[0] == PIPELINE_IMAGE
    }
    if len(images) != 1:
        raise RuntimeError(f"expected one {PIPELINE_IMAGE} image in the render, found {sorted(images)}")
    repository, tag = _split_image(images.pop())
    if not tag:
        raise RuntimeError(f"the {PIPELINE_IMAGE} image has no tag")
    return repository, tag


def set_image(objects: Sequence[Obj], image: str) -> list[Obj]:
    """Every container that runs the pipeline's image runs ``image`` instead (what ``kustomize edit set image``
    does in an overlay of your own, for the render that cannot be one: Trainer's folders come from its module).
    """
    repository, tag = _split_image(image)
    if not repository or not tag:
        raise SystemExit(f"--image {image!r}: give REPOSITORY:TAG, as your registry holds the image")
    for obj in objects:
        if obj["kind"] not in ("Deployment", "StatefulSet", "Job"):
            continue
        pod = obj["spec"]["template"]["spec"]
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            if _split_image(container["image"])[0] == PIPELINE_IMAGE:
                container["image"] = image
    return list(objects)


def _dump(objects: Sequence[Obj]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False, width=1 << 16)


def assemble_chart(
    out: Path, *, overlay: Path = OVERLAY, components: Sequence[Path] = (), progress: Callable[[str], None] = print
) -> Path:
    """Write the installable chart into ``out`` (which must not exist or be empty); return ``out``."""
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty")
    objects = render_overlay(overlay, components=components, progress=progress)
    crds = [obj for obj in objects if _is_trainer_crd(obj)]
    runtimes = [obj for obj in objects if obj["kind"] == "ClusterTrainingRuntime"]
    pipeline = [obj for obj in objects if not _is_trainer_crd(obj) and obj["kind"] != "ClusterTrainingRuntime"]
    if len(crds) != 3 or not runtimes:
        raise RuntimeError(f"{overlay} rendered {len(crds)} Trainer CRDs and {len(runtimes)} runtimes")
    repository, tag = _pipeline_image(pipeline)
    monitoring = _monitoring_objects(overlay, components, pipeline, progress=progress)
    status_server = _added_objects(overlay, components, STATUS_SERVER, pipeline, progress=progress)
    pipeline, fleet_files = _fleet_files(pipeline, (repository, tag), progress=progress)
    shutil.copytree(CHART, out, dirs_exist_ok=True)
    (out / "crds").mkdir()
    for crd in crds:
        (out / "crds" / f"{crd['metadata']['name']}.yaml").write_text(_dump([crd]))
    files = out / "files"
    files.mkdir()
    (files / "pipeline.yaml").write_text(_dump(pipeline))
    (files / "trainer-runtimes.yaml").write_text(_dump(runtimes))
    (files / "monitoring").mkdir()
    for name, objs in monitoring.items():
        (files / "monitoring" / f"{name}.yaml").write_text(_dump(objs))
    (files / "fleet").mkdir()
    for name, text in fleet_files.items():
        (files / "fleet" / name).write_text(text)
    (files / "status-server.yaml").write_text(_dump(status_server))
    (files / "image.yaml").write_text(yaml.safe_dump({"repository": repository, "tag": tag}, default_style='"'))
    (files / "settings.yaml").write_text(
        yaml.safe_dump(_settings_lines(pipeline, files / "pipeline.yaml"), default_style='"', width=1 << 16)
    )
    return out


# The settings the chart's trainJobStatus values set, by value; the chart's `settings` value sets any other
# variable of the shared ConfigMap (templates/pipeline.yaml), and refuses these two.
TRAINJOB_STATUS_SETTINGS = {"enabled": "TJPIPE_TRAINJOB_STATUS", "serverURL": "TJPIPE_STATUS_SERVER_URL"}
SHARED_CONFIG = "tjpipe-config"
"""The ConfigMap every service reads its shared settings from (deploy/base's configMapGenerator)."""


def _settings_lines(pipeline: Sequence[Obj], rendered: Path) -> dict[str, str]:
    """Each variable of the shared ConfigMap by its rendered line in ``rendered`` (files/pipeline.yaml), which
    the chart's template replaces with a value's (``templates/pipeline.yaml``): each line must be there exactly
    once, or a value would be ignored or land in another object."""
    [config] = [
        obj
        for obj in pipeline
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"].startswith(f"{SHARED_CONFIG}-")
    ]
    text = rendered.read_text()
    lines: dict[str, str] = {}
    for name in config["data"]:
        found = re.findall(rf"^  {re.escape(name)}: .*$", text, flags=re.MULTILINE)
        if len(found) != 1:
            raise RuntimeError(f"expected one {name} line in the rendered {SHARED_CONFIG}, found {len(found)}")
        lines[name] = found[0]
    return lines


def _monitoring_objects(
    overlay: Path, components: Sequence[Path], without: Sequence[Obj], *, progress: Callable[[str], None]
) -> dict[str, list[Obj]]:
    """What deploy/components/monitoring adds to the render, by chart file (``MONITORING_FILES``).

    The overlay is rendered once more with the component; it may only add objects, which the chart then
    emits behind its ``monitoring.*.enabled`` values.
    """
    rendered = render_overlay(overlay, components=(*components, MONITORING), progress=progress)
    before = {_object_key(obj): obj for obj in without}
    added: dict[str, list[Obj]] = {}
    for obj in rendered:
        if _is_trainer_crd(obj) or obj["kind"] == "ClusterTrainingRuntime":
            continue
        key = _object_key(obj)
        if key in before:
            if before[key] != obj:
                raise RuntimeError(f"{MONITORING} changes {key}; it may only add objects")
            continue
        added.setdefault(MONITORING_FILES.get(obj["kind"], MONITORING_DEFAULT_FILE), []).append(obj)
    return added


def _added_objects(
    overlay: Path,
    components: Sequence[Path],
    component: Path,
    without: Sequence[Obj],
    *,
    progress: Callable[[str], None],
) -> list[Obj]:
    """What ``component`` adds to the render (rendered once more with it), which may only add objects: the chart
    emits them behind a value (deploy/components/status-server behind ``trainJobStatus.enabled``)."""
    rendered = render_overlay(overlay, components=(*components, component), progress=progress)
    before = {_object_key(obj): obj for obj in without}
    added: list[Obj] = []
    for obj in rendered:
        if _is_trainer_crd(obj) or obj["kind"] == "ClusterTrainingRuntime":
            continue
        key = _object_key(obj)
        if key not in before:
            added.append(obj)
        elif before[key] != obj:
            raise RuntimeError(f"{component} changes {key}; it may only add objects")
    return added


def _generated_key(obj: Obj) -> tuple[str, str, str]:
    """As ``_object_key``, a generated ConfigMap by its name without kustomize's content hash."""
    kind, namespace, name = _object_key(obj)
    return kind, namespace, name.rsplit("-", 1)[0] if kind == "ConfigMap" else name


def _fleet_files(
    pipeline: Sequence[Obj], image: tuple[str, str], *, progress: Callable[[str], None]
) -> tuple[list[Obj], dict[str, str]]:
    """The pipeline without the objects the fleet member overlay changes, and the chart's ``files/fleet``:

    - ``standalone.yaml``: those objects as the base has them (no fleet, or the hub);
    - ``member.yaml``: deploy/overlays/fleet-member's versions of them and what it adds;
    - ``hub.yaml``: deploy/overlays/fleet-hub's objects, the set-up Job's members replaced by a mark
      (``members.yaml`` says which line, and how far indented, the chart's list goes in);
    - ``secrets.yaml``: the Secret names they use, by value key.
    """
    base = {_generated_key(obj): obj for obj in kustomize_build(BASE, progress=progress)}
    member = kustomize_build(FLEET_MEMBER, progress=progress)
    member_keys = {_generated_key(obj) for obj in member}
    if set(base) - member_keys:
        raise RuntimeError(f"{FLEET_MEMBER} removes {sorted(set(base) - member_keys)}; it may change or add only")
    fleet_objects = [obj for obj in member if base.get(_generated_key(obj)) != obj]
    changed = {_generated_key(obj) for obj in fleet_objects} & set(base)
    standalone = [obj for obj in pipeline if _generated_key(obj) in changed]
    if len(standalone) != len(changed) or any(base[_generated_key(obj)] != obj for obj in standalone):
        raise RuntimeError(f"the pipeline's {sorted(changed)} are not the base's, which {FLEET_MEMBER} changes")

    hub = kustomize_build(FLEET_HUB, progress=progress)
    if _pipeline_image(hub) != image:
        raise RuntimeError(f"{FLEET_HUB} names the image {_pipeline_image(hub)}, the pipeline {image}")
    setups = [obj for obj in hub if obj["kind"] == "Job"]
    if len(setups) != 1:
        raise RuntimeError(f"{FLEET_HUB}: expected one set-up Job, found {len(setups)}")
    container = setups[0]["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    if args[:2] != ["fleet", "setup"] or args[2::2] != ["--member"] * len(args[2::2]):
        raise RuntimeError(f"{FLEET_HUB}: the set-up Job's arguments are not 'fleet setup --member ...': {args}")
    container["args"] = ["fleet", "setup", FLEET_MEMBERS_MARK]
    hub_text = _dump(hub)
    (line,) = [line for line in hub_text.splitlines() if line.strip() == f"- {FLEET_MEMBERS_MARK}"]

    text = _dump(pipeline)
    for name in FLEET_SECRETS.values():
        if f"secretName: {name}\n" in text:
            raise RuntimeError(f"the pipeline already names the Secret {name}")
    rest = [obj for obj in pipeline if _generated_key(obj) not in changed]
    return rest, {
        "standalone.yaml": _dump(standalone),
        "member.yaml": _dump(fleet_objects),
        "hub.yaml": hub_text,
        "members.yaml": yaml.safe_dump({"line": line, "indent": line[: line.index("-")]}, default_style='"'),
        "secrets.yaml": yaml.safe_dump(FLEET_SECRETS),
    }


def _object_key(obj: Obj) -> tuple[str, str, str]:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True)
    printed = commands.add_parser("kustomize", help="print deploy/overlays/kubeflow's objects as YAML")
    chart = commands.add_parser("chart", help="write the installable Helm chart into DIR")
    chart.add_argument("dir", type=Path)
    for command in (printed, chart):
        command.add_argument(
            "--one-process",
            action="store_true",
            help="the three stages as one 'tjpipe controller' Deployment (deploy/components/one-process)",
        )
        command.add_argument(
            "--history-server",
            action="store_true",
            help="with the history server's web UI and JSON API (deploy/components/history-server)",
        )
    printed.add_argument(
        "--status-server",
        action="store_true",
        help="with the status server training pods report progress to (deploy/components/status-server; "
        "the chart's trainJobStatus.enabled)",
    )
    printed.add_argument(
        "--image",
        metavar="REPOSITORY:TAG",
        help=f"the pipeline's image as your registry holds it (default: {PIPELINE_IMAGE} with deploy/'s tag)",
    )
    args = parser.parse_args(argv)
    wanted_components = [(ONE_PROCESS, args.one_process), (HISTORY_SERVER, args.history_server)]
    if args.command == "kustomize":
        wanted_components.append((STATUS_SERVER, args.status_server))
    components = tuple(component for component, wanted in wanted_components if wanted)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.command == "kustomize":
        objects = render_overlay(components=components, progress=progress)
        if args.status_server:
            # As the chart's trainJobStatus.enabled: the server, and the planner's gate that points pods at it.
            for obj in objects:
                if obj["kind"] == "ConfigMap" and obj["metadata"]["name"].startswith("tjpipe-config"):
                    obj["data"]["TJPIPE_TRAINJOB_STATUS"] = "true"
        sys.stdout.write(_dump(set_image(objects, args.image) if args.image else objects))
    else:
        print(assemble_chart(args.dir, components=components, progress=progress))
    return 0


if __name__ == "__main__":
    sys.exit(main())
