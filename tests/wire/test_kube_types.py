"""Wire types: lossless round trips, UNSET semantics, generator freshness and CRD schema coverage.

Upstream manifests and CRDs are read from the Go module cache (``go env GOMODCACHE``); a module
that is not there is fetched with ``go mod download``.  Without Go those tests are skipped.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from tjpipe.contracts import jobset as js
from tjpipe.contracts import kube, scheduling, trainer

REPO = Path(__file__).resolve().parents[2]
GENERATOR = REPO / "tools" / "gen_kube_types.py"

TRAINER_MODULE = ("github.com/kubeflow/trainer/v2", "v2.3.0")
JOBSET_MODULE = ("sigs.k8s.io/jobset", "v0.12.0")
SCHEDULER_PLUGINS_MODULE = ("sigs.k8s.io/scheduler-plugins", "v0.35.4-devel")

WIRE_MODULES = (kube, js, trainer, scheduling)


# ------------------------------------------------------------------------------------------ helpers


class _Loader(yaml.SafeLoader):
    """YAML 1.1 safe loader that keeps timestamps as strings, as a JSON round trip would."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _load_all(path: Path) -> list[Any]:
    with path.open(encoding="utf-8") as fh:
        return [doc for doc in yaml.load_all(fh, Loader=_Loader) if doc is not None]


def _escape_module_path(path: str) -> str:
    return "".join(f"!{c.lower()}" if c.isupper() else c for c in path)


@functools.cache
def _module_dir(module: str, version: str) -> Path | None:
    go = shutil.which("go")
    if go is None:
        return None
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    try:
        modcache = subprocess.run(
            [go, "env", "GOMODCACHE"], check=True, capture_output=True, text=True, timeout=60, env=env
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    candidate = Path(modcache) / f"{_escape_module_path(module)}@{version}"
    if candidate.is_dir():
        return candidate
    with tempfile.TemporaryDirectory() as tmp:
        try:
            out = subprocess.run(
                [go, "mod", "download", "-json", f"{module}@{version}"],
                check=True,
                capture_output=True,
                text=True,
                timeout=600,
                cwd=tmp,
                env=env,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return None
    directory = json.loads(out).get("Dir")
    return Path(directory) if directory and Path(directory).is_dir() else None


def module_dir(module: tuple[str, str]) -> Path:
    directory = _module_dir(*module)
    if directory is None:
        reason = "Go toolchain not found" if shutil.which("go") is None else "module not available"
        pytest.skip(f"{reason}: cannot locate {module[0]}@{module[1]} in the Go module cache")
    return directory


def _canonical(obj: Any) -> str:
    """JSON text with sorted keys: unlike ``==`` it tells 1 from 1.0 from true."""
    return json.dumps(obj, sort_keys=True)


def assert_lossless(doc: dict[str, Any], cls: type[msgspec.Struct]) -> msgspec.Struct:
    obj = msgspec.convert(doc, cls)
    assert _canonical(msgspec.to_builtins(obj)) == _canonical(doc)
    via_json = msgspec.json.decode(msgspec.json.encode(doc), type=cls)
    assert via_json == obj
    assert _canonical(json.loads(msgspec.json.encode(via_json))) == _canonical(doc)
    return obj


def _drop_nulls(value: Any) -> Any:
    """What the API server's pruning does to nulls in non-nullable CRD fields."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _struct_classes() -> Iterator[type[kube.KubeStruct]]:
    for module in WIRE_MODULES:
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, kube.KubeStruct) and value.__module__ == module.__name__:
                yield value


def _load_generator() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("gen_kube_types", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_kube_types", module)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------- upstream round trips

KNOWN_KINDS: dict[str, type[msgspec.Struct]] = {
    "TrainJob": trainer.TrainJob,
    "TrainingRuntime": trainer.TrainingRuntime,
    "ClusterTrainingRuntime": trainer.ClusterTrainingRuntime,
    "JobSet": js.JobSet,
}


def _runtime_manifests() -> list[Path]:
    root = module_dir(TRAINER_MODULE) / "manifests" / "base" / "runtimes"
    return sorted(p for p in root.rglob("*.yaml") if p.name != "kustomization.yaml")


def test_shipped_runtimes_round_trip() -> None:
    paths = _runtime_manifests()
    assert len(paths) >= 9, paths
    seen = 0
    for path in paths:
        for doc in _load_all(path):
            assert doc["kind"] == "ClusterTrainingRuntime", path
            runtime = assert_lossless(doc, trainer.ClusterTrainingRuntime)
            assert isinstance(runtime, trainer.ClusterTrainingRuntime)
            assert isinstance(runtime.spec, trainer.TrainingRuntimeSpec)
            assert isinstance(runtime.spec.template, trainer.JobSetTemplateSpec)
            # Both runtime kinds share one shape, so either class holds either kind losslessly.
            assert_lossless(doc, trainer.TrainingRuntime)
            assert isinstance(trainer.runtime_from_builtins(doc), trainer.ClusterTrainingRuntime)
            assert isinstance(trainer.decode_runtime(json.dumps(doc)), trainer.ClusterTrainingRuntime)
            seen += 1
    assert seen >= 9


def test_examples_round_trip() -> None:
    root = module_dir(TRAINER_MODULE) / "examples"
    counts: dict[str, int] = {}
    for path in sorted(root.rglob("*.y*ml")):
        text = path.read_text(encoding="utf-8")
        if "kind: TrainJob" not in text and "TrainingRuntime" not in text:
            continue
        for doc in _load_all(path):
            cls = KNOWN_KINDS.get(doc.get("kind", "")) if isinstance(doc, dict) else None
            if cls is None:
                continue
            assert_lossless(doc, cls)
            counts[doc["kind"]] = counts.get(doc["kind"], 0) + 1
    assert counts.get("TrainJob", 0) >= 8, counts


def test_jobset_samples_round_trip() -> None:
    root = module_dir(JOBSET_MODULE)
    found = 0
    for sub in ("config/samples", "examples", "site/static/examples"):
        for path in sorted((root / sub).rglob("*.yaml")) if (root / sub).is_dir() else []:
            for doc in _load_all(path):
                if isinstance(doc, dict) and doc.get("kind") == js.JOBSET_KIND:
                    # The v0.12.0 sample has ``spec:`` with no value; the API server prunes such nulls.
                    assert_lossless(_drop_nulls(doc), js.JobSet)
                    found += 1
    assert found >= 1


# ---------------------------------------------------------------------------------- UNSET semantics


@pytest.mark.parametrize("cls", list(_struct_classes()), ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_every_field_is_optional_and_unset(cls: type[kube.KubeStruct]) -> None:
    config = cls.__struct_config__
    assert config.frozen and config.omit_defaults and not config.forbid_unknown_fields
    assert config.tag is None
    assert cls.__match_args__ == (), "fields must be keyword-only"
    for field in msgspec.structs.fields(cls):
        assert field.default is msgspec.UNSET, f"{cls.__name__}.{field.name}"
        assert msgspec.UnsetType in typing.get_args(field.type), f"{cls.__name__}.{field.name}"
    empty = cls()
    assert msgspec.json.encode(empty) == b"{}"
    assert msgspec.to_builtins(empty) == {}


def test_one_nested_field_encodes_exactly_that_path() -> None:
    job = js.JobSet(
        spec=js.JobSetSpec(
            replicated_jobs=[
                js.ReplicatedJob(
                    name="node",
                    template=kube.JobTemplateSpec(
                        spec=kube.JobSpec(
                            template=kube.PodTemplateSpec(
                                spec=kube.PodSpec(containers=[kube.Container(name="node", image="busybox")])
                            )
                        )
                    ),
                )
            ]
        )
    )
    assert msgspec.to_builtins(job) == {
        "spec": {
            "replicatedJobs": [
                {
                    "name": "node",
                    "template": {
                        "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "busybox"}]}}}
                    },
                }
            ]
        }
    }
    status = trainer.TrainJob(status=trainer.TrainJobStatus(jobs_status=[trainer.JobStatus(name="node", active=0)]))
    assert msgspec.json.encode(status) == b'{"status":{"jobsStatus":[{"name":"node","active":0}]}}'
    meta = kube.ObjectMeta(labels={})
    assert msgspec.to_builtins(meta) == {"labels": {}}, "an explicitly empty value is set, not UNSET"
    assert msgspec.to_builtins(trainer.MLPolicy(torch=trainer.TorchMLPolicySource())) == {"torch": {}}


def test_forward_references_resolve_on_decode() -> None:
    raw = {
        "metadata": {"labels": {"a": "b"}, "creationTimestamp": "2024-01-01T00:00:00Z"},
        "spec": {
            "containers": [
                {
                    "name": "node",
                    "ports": [{"containerPort": 29500}],
                    "livenessProbe": {"httpGet": {"port": "http", "path": "/"}},
                    "readinessProbe": {"tcpSocket": {"port": 2222}},
                    "resources": {"limits": {"nvidia.com/gpu": 2, "cpu": "500m"}},
                    "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "lifecycle": {"preStop": {"exec": {"command": ["sleep", "1"]}}},
                }
            ],
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
        },
    }
    pod = msgspec.json.decode(json.dumps(raw), type=kube.PodTemplateSpec)
    assert isinstance(pod.spec, kube.PodSpec)
    assert isinstance(pod.spec.containers, list)
    container = pod.spec.containers[0]
    assert isinstance(container.lifecycle, kube.Lifecycle)
    assert isinstance(container.lifecycle.pre_stop, kube.LifecycleHandler)
    assert isinstance(container.lifecycle.pre_stop.exec, kube.ExecAction)
    assert isinstance(container.resources, kube.ResourceRequirements)
    assert container.resources.limits == {"nvidia.com/gpu": 2, "cpu": "500m"}
    assert isinstance(container.liveness_probe, kube.Probe)
    assert isinstance(container.liveness_probe.http_get, kube.HTTPGetAction)
    assert container.liveness_probe.http_get.port == "http"
    assert _canonical(msgspec.to_builtins(pod)) == _canonical(raw)


def test_unknown_fields_are_ignored() -> None:
    meta = msgspec.convert({"name": "x", "someFutureField": {"a": 1}}, kube.ObjectMeta)
    assert meta == kube.ObjectMeta(name="x")


def test_secret_bytes_are_base64_on_the_wire() -> None:
    secret = kube.Secret(data={"k": b"\x00\x01"}, string_data={"s": "v"})
    assert msgspec.to_builtins(secret) == {"data": {"k": "AAE="}, "stringData": {"s": "v"}}
    assert msgspec.json.decode(msgspec.json.encode(secret), type=kube.Secret) == secret


def test_runtime_dispatch_on_kind() -> None:
    doc = {"apiVersion": trainer.API_VERSION, "kind": "TrainingRuntime", "metadata": {"name": "r"}}
    assert isinstance(trainer.runtime_from_builtins(doc), trainer.TrainingRuntime)
    assert isinstance(trainer.decode_runtime(json.dumps(doc).encode()), trainer.TrainingRuntime)
    with pytest.raises(msgspec.ValidationError):
        trainer.runtime_from_builtins({**doc, "kind": "JobSet"})
    with pytest.raises(msgspec.ValidationError):
        trainer.decode_runtime(b"{}")


def test_constants() -> None:
    assert js.JOBSET_API_VERSION == "jobset.x-k8s.io/v1alpha2"
    assert js.JOBSET_KIND == "JobSet"
    assert trainer.API_VERSION == "trainer.kubeflow.org/v1alpha1"
    assert scheduling.COSCHEDULING_API_VERSION == "scheduling.x-k8s.io/v1alpha1"
    assert scheduling.VOLCANO_API_VERSION == "scheduling.volcano.sh/v1beta1"
    assert trainer.CONTAINER_TRAINER_PORT == 29500


def test_trainer_constants_match_upstream() -> None:
    source = (module_dir(TRAINER_MODULE) / "pkg" / "constants" / "constants.go").read_text(encoding="utf-8")
    for value in (
        trainer.LABEL_TRAINJOB_ANCESTOR,
        trainer.LABEL_SUPPORT,
        trainer.TORCH_ENV_NUM_PROC_PER_NODE,
        trainer.MPI_SSH_AUTH_SECRET_SUFFIX,
        trainer.OPENMPI_RSH_ARGS_DEFAULT,
        trainer.XGBOOST_ENV_NUM_WORKER,
        trainer.TORCHTUNE_MODEL_QWEN2_5_1_5B,
        trainer.MESSAGE_DEADLINE_EXCEEDED,
    ):
        assert f'"{value}"' in source, value


# ------------------------------------------------------------------------------------ the generator


def test_generator_is_deterministic_and_committed_file_is_fresh(tmp_path: Path) -> None:
    gen = _load_generator()
    first = gen.generate()
    assert gen.generate() == first
    out = tmp_path / "kube.py"
    assert gen.main(["--output", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == first
    committed = (REPO / "contracts" / "kube.py").read_text(encoding="utf-8")
    assert committed == first, "contracts/kube.py is stale: run tools/gen_kube_types.py"
    assert gen.main(["--check"]) == 0


def test_generated_file_is_ruff_formatted() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists() and shutil.which(ruff) is None:
        pytest.skip("ruff not installed")
    result = subprocess.run(
        [ruff, "format", "--check", "--line-length", "110", str(REPO / "contracts" / "kube.py")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_generator_naming_rules() -> None:
    gen = _load_generator()
    assert gen.class_name_for("V1PodSpec") == "PodSpec"
    assert gen.class_name_for("CoreV1ResourceClaim") == "ResourceClaim"
    assert gen.class_name_for("V1alpha3TopologyConstraint") == "TopologyConstraint"
    assert gen.python_name_for("_exec") == "exec"
    assert gen.python_name_for("_from") == "from_"
    assert gen.python_name_for("_continue") == "continue_"
    assert gen.python_name_for("api_version") == "api_version"
    with pytest.raises(gen.GenerationError, match="collision"):
        gen.collect_models(("V1PodSpec", "AuthenticationV1TokenRequest", "StorageV1TokenRequest"))


# ------------------------------------------------------------------------------ schema completeness


def _members(tp: Any) -> tuple[Any, ...]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return tuple(a for a in typing.get_args(tp) if a is not msgspec.UnsetType)
    return (tp,)


def _accepts(tp: Any, *wanted: type) -> bool:
    members = _members(tp)
    return Any in members or all(w in members for w in wanted)


def _struct_fields(cls: type[msgspec.Struct]) -> dict[str, msgspec.structs.FieldInfo]:
    return {f.encode_name: f for f in msgspec.structs.fields(cls)}


def check_schema(schema: dict[str, Any], tp: Any, path: str, problems: list[str]) -> None:
    """Every property the schema allows must be a field of a type that holds its values."""
    members = _members(tp)
    if Any in members:
        return
    if schema.get("x-kubernetes-int-or-string"):
        if not _accepts(tp, int, str):
            problems.append(f"{path}: int-or-string but typed {tp}")
        return
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        problems.append(f"{path}: preserves unknown fields but typed {tp}")
        return
    kind = schema.get("type")
    if len(members) != 1:
        problems.append(f"{path}: schema type {kind} but typed {tp}")
        return
    (only,) = members
    origin = typing.get_origin(only)
    if kind == "object":
        if "properties" in schema:
            if not (isinstance(only, type) and issubclass(only, msgspec.Struct)):
                problems.append(f"{path}: object with properties but typed {tp}")
                return
            fields = _struct_fields(only)
            for name, sub in schema["properties"].items():
                if name not in fields:
                    problems.append(f"{path}.{name}: missing on {only.__module__}.{only.__name__}")
                    continue
                check_schema(sub, fields[name].type, f"{path}.{name}", problems)
            if only.__module__ != kube.__name__:
                for name in fields:
                    if name not in schema["properties"]:
                        problems.append(f"{path}.{name}: field of {only.__name__} is not in the schema")
        elif isinstance(schema.get("additionalProperties"), dict):
            if origin is not dict:
                problems.append(f"{path}: map but typed {tp}")
                return
            check_schema(schema["additionalProperties"], typing.get_args(only)[1], f"{path}{{}}", problems)
        elif not (isinstance(only, type) and issubclass(only, msgspec.Struct)) and origin is not dict:
            problems.append(f"{path}: object but typed {tp}")
    elif kind == "array":
        if origin is not list:
            problems.append(f"{path}: array but typed {tp}")
            return
        check_schema(schema.get("items", {}), typing.get_args(only)[0], f"{path}[]", problems)
    elif kind == "string":
        wanted = (str, bytes) if schema.get("format") == "byte" else (str,)
        if only not in wanted:
            problems.append(f"{path}: string but typed {tp}")
    elif kind == "integer":
        if only is not int:
            problems.append(f"{path}: integer but typed {tp}")
    elif kind == "boolean":
        if only is not bool:
            problems.append(f"{path}: boolean but typed {tp}")
    elif kind == "number":
        if only is not float:
            problems.append(f"{path}: number but typed {tp}")
    else:
        problems.append(f"{path}: unhandled schema {sorted(schema)}")


def _crd_schema(path: Path, version: str) -> dict[str, Any]:
    (crd,) = _load_all(path)
    for served in crd["spec"]["versions"]:
        if served["name"] == version:
            schema: dict[str, Any] = served["schema"]["openAPIV3Schema"]
            return schema
    raise AssertionError(f"{path} has no version {version}")


CRDS: list[tuple[tuple[str, str], str, str, type[msgspec.Struct]]] = [
    (JOBSET_MODULE, "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml", "v1alpha2", js.JobSet),
    (TRAINER_MODULE, "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml", "v1alpha1", trainer.TrainJob),
    (
        TRAINER_MODULE,
        "manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml",
        "v1alpha1",
        trainer.ClusterTrainingRuntime,
    ),
    (
        TRAINER_MODULE,
        "manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml",
        "v1alpha1",
        trainer.TrainingRuntime,
    ),
    (SCHEDULER_PLUGINS_MODULE, "manifests/coscheduling/crd.yaml", "v1alpha1", scheduling.PodGroup),
]


@pytest.mark.parametrize(("module", "crd", "version", "cls"), CRDS, ids=[c[3].__name__ for c in CRDS])
def test_crd_schema_is_covered(module: tuple[str, str], crd: str, version: str, cls: type[msgspec.Struct]) -> None:
    schema = _crd_schema(module_dir(module) / crd, version)
    problems: list[str] = []
    check_schema(schema, cls, cls.__name__, problems)
    assert not problems, "\n".join(problems)
