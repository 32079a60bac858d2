"""deploy/overlays/fleet-hub and fleet-member: rendered by the real kustomize, with the nats.conf files their
servers run written by ``tjpipe fleet`` and checked by the real nats-server.

The overlays hold no NATS configuration of the fleet themselves: the hub's servers each run the file
``tjpipe fleet hub-config`` wrote, and a member's servers include what ``tjpipe fleet member-config`` wrote,
both from Secrets. So the checks here run the CLI as an operator would (``--mounted-tls`` naming where the
overlay mounts the leaf link's TLS Secret), put its files where the overlay's volumes put them, and ask
``nats-server -t`` whether the result is a configuration it runs: the hub in domain ``hub`` with a leaf
listener over mutual TLS, a member in its own domain with one leaf remote.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.dynamic.exceptions import NotFoundError

from tjpipe.cli import main
from tjpipe.local.helm import helm_template
from tjpipe.local.kustomize import kustomize_build
from tjpipe.local.natsd import nats_server_binary

from . import REPO, cli_env_names, unset_settings
from .test_kustomize import _client_with, _config_map, _dry_run_each, _named, _of_kind, _path, _progress

HUB = REPO / "deploy" / "overlays" / "fleet-hub"
MEMBER = REPO / "deploy" / "overlays" / "fleet-member"
BASE = REPO / "deploy" / "base"
HUB_NAMESPACE = "trainjob-pipeline-fleet"
MEMBERS = ("c1", "c2")
REVIEWER = "tjpipe-fleet-history-reviewer"

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def hub() -> list[Obj]:
    return kustomize_build(HUB, progress=_progress)


@pytest.fixture(scope="module")
def member() -> list[Obj]:
    return kustomize_build(MEMBER, progress=_progress)


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return kustomize_build(BASE, progress=_progress)


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fleet's folder as ``tjpipe fleet credentials`` makes it, for two members."""
    folder = tmp_path_factory.mktemp("fleet") / "fleet"
    members = [arg for cluster in MEMBERS for arg in ("--member", cluster)]
    assert main(["fleet", "credentials", "--dir", str(folder), *members, "--hub-host", "fleet-hub.example.net"]) == 0
    return folder


def _container(workload: Obj) -> Obj:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def _volumes(workload: Obj) -> dict[str, Obj]:
    return {volume["name"]: volume for volume in workload["spec"]["template"]["spec"]["volumes"]}


def _mounts(workload: Obj) -> dict[str, str]:
    """Mount path by volume name."""
    return {mount["name"]: mount["mountPath"] for mount in _container(workload)["volumeMounts"]}


def _secret_files(workload: Obj, volume: str) -> tuple[str, str, set[str]]:
    """(the Secret's name, where it is mounted, the file names it puts there)."""
    source = _volumes(workload)[volume]["secret"]
    return source["secretName"], _mounts(workload)[volume], {item["path"] for item in source.get("items", [])}


def _check_config(conf: Path) -> None:
    checked = subprocess.run([str(nats_server_binary()), "-c", str(conf), "-t"], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _hub_configs(fleet_dir: Path, out: Path, mounted_tls: str, client_tls: str) -> list[Path]:
    """``tjpipe fleet hub-config`` for each of the three servers, as the hub overlay's comment runs it."""
    (out / "route-password").write_text("a-route-password\n")
    routes = [arg for i in range(3) for arg in ("--route", f"fleet-hub-{i}.fleet-hub-headless:6222")]
    members = [arg for cluster in MEMBERS for arg in ("--member", cluster)]
    written = []
    for i in range(3):
        conf = out / f"fleet-hub-{i}.conf"
        args = ["fleet", "hub-config", "--dir", str(fleet_dir), *members, "--name", f"fleet-hub-{i}", *routes]
        args += ["--store-dir", "/data", "--route-password-file", str(out / "route-password")]
        args += ["--mounted-tls", mounted_tls, "--client-tls", client_tls, "--out", str(conf)]
        assert main(args) == 0
        written.append(conf)
    return written


# ----------------------------------------------------------------------------------------------------- hub


def test_the_hub_is_three_nats_servers_each_running_its_own_file_from_a_secret(hub: list[Obj]) -> None:
    statefulset = _named(hub, "StatefulSet", "fleet-hub")
    assert statefulset["metadata"]["namespace"] == HUB_NAMESPACE
    assert statefulset["spec"]["replicas"] == 3
    headless = _named(hub, "Service", statefulset["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    nats = _container(statefulset)
    config_secret, config_dir, _ = _secret_files(statefulset, "config")
    assert config_secret == "fleet-hub-nats-config"
    # Kubernetes puts the pod's name into the command: fleet-hub-0 runs fleet-hub-0.conf.
    assert nats["command"] == ["nats-server", "--config", f"{config_dir}/$(POD_NAME).conf"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in nats["env"]
    ports = {port["name"]: port["containerPort"] for port in nats["ports"]}
    assert ports == {"client": 4222, "cluster": 6222, "leafnodes": 7422, "monitor": 8222}
    leaf = _named(hub, "Service", "fleet-hub-leafnodes")
    assert [port["port"] for port in leaf["spec"]["ports"]] == [7422]
    # No ConfigMap carries any of it: the files hold the routes' password.
    assert _of_kind(hub, "ConfigMap") == []


def test_the_hubs_files_are_domain_hub_with_a_mutual_tls_leaf_listener_where_the_overlay_mounts_them(
    hub: list[Obj], fleet_dir: Path, tmp_path: Path
) -> None:
    statefulset = _named(hub, "StatefulSet", "fleet-hub")
    tls_secret, tls_dir, tls_files = _secret_files(statefulset, "leaf-tls")
    assert tls_secret == "fleet-hub-leaf-tls" and tls_files == {"ca.crt", "tls.crt", "tls.key"}
    client_secret, client_dir, client_files = _secret_files(statefulset, "client-tls")
    assert client_secret == "fleet-hub-client-tls" and client_files == {"ca.crt", "tls.crt", "tls.key"}
    confs = _hub_configs(fleet_dir, tmp_path, tls_dir, client_dir)
    for i, conf in enumerate(confs):
        text = conf.read_text()
        assert f'server_name: "fleet-hub-{i}"' in text
        assert 'domain: "hub"' in text and 'store_dir: "/data"' in text
        leafnodes = text[text.index("leafnodes {") :]
        assert 'listen: "0.0.0.0:7422"' in leafnodes and "verify: true" in leafnodes
        assert {f"{tls_dir}/{name}" for name in tls_files} == set(re.findall(r'_file: "([^"]+)"', leafnodes))
        # The client port (4222) over TLS too, with the client Secret's files.
        clients = text[text.index("\ntls {") : text.index("}", text.index("\ntls {"))]
        assert {f"{client_dir}/{name}" for name in client_files} == set(re.findall(r'_file: "([^"]+)"', clients))
    # What nats-server makes of it, with the TLS Secrets' files where the overlay mounts them.
    text = confs[0].read_text().replace('"/data"', f'"{tmp_path}/d"')
    for mount in (tls_dir, client_dir):
        mounted = tmp_path / Path(mount).name
        mounted.mkdir()
        shutil.copy(fleet_dir / "tls" / "ca.crt", mounted / "ca.crt")
        shutil.copy(fleet_dir / "tls" / "hub.crt", mounted / "tls.crt")
        shutil.copy(fleet_dir / "tls" / "hub.key", mounted / "tls.key")
        text = text.replace(mount, str(mounted))
    relocated = tmp_path / "relocated.conf"
    relocated.write_text(text)
    _check_config(relocated)


@pytest.mark.parametrize(
    ("kind", "name"),
    [("Job", "fleet-setup"), ("Deployment", "tjpipe-fleet-history-server"), ("Deployment", "tjpipe-fleet-monitor")],
)
def test_the_hubs_clients_check_its_client_port_with_the_ca_of_its_secret(hub: list[Obj], kind: str, name: str) -> None:
    workload = _named(hub, kind, name)
    env = {item["name"]: item["value"] for item in _container(workload)["env"]}
    secret, folder, files = _secret_files(workload, "nats-ca")
    # The CA only: not the server's key.
    assert (secret, files, env["NATS_TLS_CA"]) == ("fleet-hub-client-tls", {"ca.crt"}, f"{folder}/ca.crt")


def test_the_fleet_streams_job_runs_setup_as_fleet_admin_with_every_member(hub: list[Obj]) -> None:
    job = _named(hub, "Job", "fleet-setup")
    container = _container(job)
    args = container["args"]
    assert args[:2] == ["fleet", "setup"]
    assert [args[i + 1] for i, arg in enumerate(args) if arg == "--member"] == list(MEMBERS)
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["NATS_URL"] == "nats://fleet-hub:4222"
    secret, folder, _ = _secret_files(job, "nats-creds")
    assert (secret, env["NATS_CREDS"]) == ("fleet-admin-nats-creds", f"{folder}/nats.nk")
    # The admin seed goes into this Job only.
    others = [w for w in (*_of_kind(hub, "Deployment"), *_of_kind(hub, "StatefulSet"))]
    assert not [w for w in others if "fleet-admin-nats-creds" in str(w["spec"]["template"]["spec"]["volumes"])]


def test_the_fleet_monitor_reads_as_fleet_reader_and_serves_its_metrics_to_a_service(hub: list[Obj]) -> None:
    deployment = _named(hub, "Deployment", "tjpipe-fleet-monitor")
    container = _container(deployment)
    assert container["args"][:2] == ["fleet", "monitor"]
    port = container["args"][container["args"].index("--metrics-port") + 1]
    env = {item["name"]: item["value"] for item in container["env"]}
    reader, reader_dir, _ = _secret_files(deployment, "nats-creds")
    assert (reader, env["NATS_CREDS"]) == ("fleet-reader-nats-creds", f"{reader_dir}/nats.nk")
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    service = _named(hub, "Service", "tjpipe-fleet-monitor-metrics")
    assert service["metadata"]["labels"]["trainjob-pipeline/metrics"] == "true"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert [(p["name"], str(p["port"])) for p in service["spec"]["ports"]] == [("metrics", port)]


def test_the_fleet_history_server_reads_as_fleet_reader_with_the_clusters_file_from_a_secret(hub: list[Obj]) -> None:
    deployment = _named(hub, "Deployment", "tjpipe-fleet-history-server")
    container = _container(deployment)
    secret, folder, _ = _secret_files(deployment, "fleet-clusters")
    assert secret == "fleet-history-clusters"
    assert container["args"] == ["history-server", "--fleet-clusters", f"{folder}/clusters.yaml"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert set(env) <= cli_env_names()["history-server"], set(env) - cli_env_names()["history-server"]
    assert unset_settings("history-server", env, container["args"], in_cluster=True) == []
    reader, reader_dir, _ = _secret_files(deployment, "nats-creds")
    assert (reader, env["NATS_CREDS"]) == ("fleet-reader-nats-creds", f"{reader_dir}/nats.nk")
    assert env["NATS_URL"] == "nats://fleet-hub:4222"
    # It reviews with the members' credentials, never its own cluster's: no token of this cluster mounted.
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert not [kind for kind in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding") if _of_kind(hub, kind)]


# -------------------------------------------------------------------------------------------------- member


def _key(obj: Obj) -> tuple[str, str, str]:
    name = obj["metadata"]["name"]
    if obj["kind"] == "ConfigMap":  # generated: the name carries a hash of the content
        name = name.rsplit("-", 1)[0]
    return obj["kind"], obj["metadata"].get("namespace", ""), name


def test_a_member_is_the_base_with_its_nats_joined_to_the_hub_and_a_reviewer(
    base: list[Obj], member: list[Obj]
) -> None:
    before = {_key(obj): obj for obj in base}
    after = {_key(obj): obj for obj in member}
    added = sorted(key for key in after if key not in before)
    assert added == [
        ("ClusterRole", "", REVIEWER),
        ("ClusterRoleBinding", "", REVIEWER),
        ("ServiceAccount", "trainjob-pipeline", REVIEWER),
    ]
    assert sorted(key for key in before if key not in after) == []
    changed = sorted(key for key in before if before[key] != after[key])
    assert changed == [
        ("ConfigMap", "trainjob-pipeline", "nats-config"),
        ("NetworkPolicy", "trainjob-pipeline", "nats"),
        ("StatefulSet", "trainjob-pipeline", "nats"),
    ]
    # The servers gain one mount (the fleet Secret) and the generated config's new name; nothing else changes.
    old, new = before[("StatefulSet", "trainjob-pipeline", "nats")], after[("StatefulSet", "trainjob-pipeline", "nats")]
    assert set(_volumes(new)) - set(_volumes(old)) == {"fleet"}
    assert _container(new)["command"] == _container(old)["command"]
    # The only new way out: the hub's leaf port.
    old_egress = before[("NetworkPolicy", "trainjob-pipeline", "nats")]["spec"]["egress"]
    new_egress = after[("NetworkPolicy", "trainjob-pipeline", "nats")]["spec"]["egress"]
    assert new_egress[: len(old_egress)] == old_egress
    assert new_egress[len(old_egress) :] == [{"ports": [{"port": 7422, "protocol": "TCP"}]}]


def test_a_members_nats_runs_its_domain_and_one_leaf_remote_with_tls_from_the_cli(
    member: list[Obj], fleet_dir: Path, tmp_path: Path
) -> None:
    statefulset = _named(member, "StatefulSet", "nats")
    secret, folder, files = _secret_files(statefulset, "fleet")
    assert secret == "nats-fleet-member" and files == {"member.conf", "ca.crt", "tls.crt", "tls.key"}
    conf = _config_map(member, "nats-config")["data"]["nats.conf"]
    config_dir = _mounts(statefulset)["config"]
    include = re.findall(r"^include (\S+)$", conf, flags=re.MULTILINE)
    assert str((Path(config_dir) / include[0]).resolve()) == f"{folder}/member.conf"
    # Its own jetstream block would replace member.conf's (the domain): there is none.
    assert not re.search(r"^jetstream", conf, flags=re.MULTILINE)

    out = tmp_path / "member.conf"
    args = ["fleet", "member-config", "--dir", str(fleet_dir), "--cluster", "c1", "--store-dir", "/data"]
    # The base's store limits, as the overlay's comment passes them: member.conf's jetstream block is the whole.
    base_conf = (BASE / "nats" / "nats.conf").read_text()
    limits = dict(re.findall(r"^  (max_memory_store|max_file_store): (\S+)$", base_conf, flags=re.MULTILINE))
    assert set(limits) == {"max_memory_store", "max_file_store"}
    comment = (MEMBER / "kustomization.yaml").read_text()
    assert f"--max-memory-store {limits['max_memory_store']} --max-file-store {limits['max_file_store']}" in comment
    args += ["--max-memory-store", limits["max_memory_store"], "--max-file-store", limits["max_file_store"]]
    args += ["--hub", "fleet-hub.example.net:7422", "--mounted-tls", folder, "--out", str(out)]
    assert main(args) == 0
    text = out.read_text()
    assert 'domain: "c1"' in text
    assert all(f"  {key}: {value}\n" in text for key, value in limits.items())
    assert text.count("urls:") == 1 and '"nats-leaf://fleet-hub.example.net:7422"' in text
    assert {f"{folder}/{name}" for name in files - {"member.conf"}} == set(re.findall(r'_file: "([^"]+)"', text))

    # The pod's /etc/nats as the overlay's volumes make it, paths moved under tmp_path; nats-server checks it.
    root = tmp_path / "etc-nats"
    mounts = _mounts(statefulset)
    parent = str(Path(config_dir).parent)
    assert all(path.startswith(parent + "/") for name, path in mounts.items() if name != "data")
    for name in ("config", "auth", "tls", "fleet"):
        (root / Path(mounts[name]).name).mkdir(parents=True)
    (root / "config" / "nats.conf").write_text(conf.replace(parent, str(root)).replace("$POD_NAME", "nats-0"))
    (root / "auth" / "authorization.conf").write_text("authorization { users = [] }\n")
    tls = fleet_dir / "tls"
    for name, source in {"ca.crt": "ca.crt", "tls.crt": "hub.crt", "tls.key": "hub.key"}.items():
        shutil.copy(tls / source, root / "tls" / name)
    for name, source in {"ca.crt": "ca.crt", "tls.crt": "members/c1.crt", "tls.key": "members/c1.key"}.items():
        shutil.copy(tls / source, root / "fleet" / name)
    (root / "fleet" / "member.conf").write_text(text.replace(parent, str(root)).replace('"/data"', f'"{tmp_path}/d"'))
    _check_config(root / "config" / "nats.conf")


def test_the_members_reviewer_may_create_the_two_reviews_and_nothing_else(member: list[Obj]) -> None:
    role = _named(member, "ClusterRole", REVIEWER)
    assert role["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    ]
    binding = _named(member, "ClusterRoleBinding", REVIEWER)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": REVIEWER}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": REVIEWER, "namespace": "trainjob-pipeline"}]
    account = _named(member, "ServiceAccount", REVIEWER)
    assert account["automountServiceAccountToken"] is False
    # Bound to nothing else, and nothing else bound to it.
    others = [b for b in _of_kind(member, "ClusterRoleBinding") + _of_kind(member, "RoleBinding") if b != binding]
    assert not [b for b in others if b["roleRef"]["name"] == REVIEWER or REVIEWER in str(b["subjects"])]


# ----------------------------------------------------------------------------------------------- both


_SECRET_MATERIAL = re.compile(r"PRIVATE KEY|\bSU[A-Z2-7]{56}\b|password", re.IGNORECASE)


@pytest.mark.parametrize("overlay", ["hub", "member"])
def test_no_secret_material_is_rendered_only_references_to_secrets(
    overlay: str, request: pytest.FixtureRequest, fleet_dir: Path
) -> None:
    objects: list[Obj] = request.getfixturevalue(overlay)
    assert _of_kind(objects, "Secret") == []
    rendered = str(objects)
    assert not _SECRET_MATERIAL.search(rendered)
    # Not one of this fleet's seeds either (the pattern above would catch any, this is the proof it would).
    seeds = [p.read_text().strip() for p in fleet_dir.rglob("*.nk")]
    assert seeds and all(_SECRET_MATERIAL.search(seed) for seed in seeds)
    assert not [seed for seed in seeds if seed in rendered]


@pytest.fixture(scope="module")
def api(kube: Any, hub: list[Obj], base: list[Obj]) -> Iterator[tuple[Any, dict[str, dict[str, tuple[str, bool]]]]]:
    yield from _client_with(
        kube, [_named(hub, "Namespace", HUB_NAMESPACE), _named(base, "Namespace", "trainjob-pipeline")]
    )


@pytest.mark.cluster
@pytest.mark.parametrize("overlay", ["hub", "member"])
def test_the_api_server_accepts_every_object(
    overlay: str, request: pytest.FixtureRequest, api: tuple[Any, dict[str, dict[str, tuple[str, bool]]]]
) -> None:
    client, known = api
    objects: list[Obj] = [obj for obj in request.getfixturevalue(overlay) if obj["kind"] != "Namespace"]
    rejected, warnings = _dry_run_each(client, known, objects)
    assert rejected == []
    assert warnings == []
    with pytest.raises(NotFoundError):
        client.request("GET", _path(known, _of_kind(objects, "StatefulSet")[0]))


# ------------------------------------------------------------------------------------------- the chart


@pytest.fixture(scope="module")
def chart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from .test_kubeflow_install import RELEASE, tool

    return tool.assemble_chart(tmp_path_factory.mktemp("chart") / RELEASE, progress=_progress)  # type: ignore[no-any-return]


def _chart(chart_dir: Path, *values: str) -> list[Obj]:
    from .test_kubeflow_install import RELEASE, RELEASE_NAMESPACE

    extra = [arg for value in values for arg in ("--set-json" if "=[" in value else "--set", value)]
    return helm_template(chart_dir, release=RELEASE, namespace=RELEASE_NAMESPACE, extra_args=extra, progress=_progress)


@pytest.fixture(scope="module")
def kubeflow_overlay() -> list[Obj]:
    from .test_kubeflow_install import tool

    return tool.render_overlay(progress=_progress)  # type: ignore[no-any-return]


def test_the_chart_without_a_fleet_is_the_overlay_and_a_member_is_the_overlay_with_fleet_members_objects(
    chart_dir: Path, kubeflow_overlay: list[Obj], base: list[Obj], member: list[Obj]
) -> None:
    from .test_kubeflow_install import _by_key

    assert _by_key(_chart(chart_dir)) == _by_key(kubeflow_overlay)
    before = {_key(obj): obj for obj in base}
    fleet_objects = [obj for obj in member if before.get(_key(obj)) != obj]
    swapped = {_key(obj) for obj in fleet_objects}
    expected = [obj for obj in kubeflow_overlay if _key(obj) not in swapped] + fleet_objects
    rendered = _chart(chart_dir, "fleet.role=member", "fleet.clusterName=c1", "fleet.hubURL=hub.example:7422")
    assert _by_key(rendered) == _by_key(expected)


def test_the_chart_as_a_hub_adds_the_hub_overlays_objects_with_its_members(
    chart_dir: Path, kubeflow_overlay: list[Obj], hub: list[Obj]
) -> None:
    from .test_kubeflow_install import _by_key

    rendered = _chart(chart_dir, "fleet.role=hub", 'fleet.members=["c1","c2"]')
    assert _by_key(rendered) == _by_key(kubeflow_overlay + hub)
    three = _chart(chart_dir, "fleet.role=hub", 'fleet.members=["c1","c2","eu-3"]')
    args = _container(_named(three, "Job", "fleet-setup"))["args"]
    assert args == ["fleet", "setup", "--member", "c1", "--member", "c2", "--member", "eu-3"]


def test_the_charts_fleet_secrets_may_be_renamed_and_a_wrong_role_or_no_members_is_refused(chart_dir: Path) -> None:
    renamed = _chart(chart_dir, "fleet.role=member", "fleet.secrets.member=c1-leaf")
    assert _secret_files(_named(renamed, "StatefulSet", "nats"), "fleet")[0] == "c1-leaf"
    hub = _chart(chart_dir, "fleet.role=hub", 'fleet.members=["c1"]', "fleet.secrets.clusters=fleet-clusters-v2")
    deployment = _named(hub, "Deployment", "tjpipe-fleet-history-server")
    assert _secret_files(deployment, "fleet-clusters")[0] == "fleet-clusters-v2"
    with pytest.raises(RuntimeError, match=r"fleet\.role is \"leader\""):
        _chart(chart_dir, "fleet.role=leader")
    with pytest.raises(RuntimeError, match=r"needs fleet\.members"):
        _chart(chart_dir, "fleet.role=hub")


def test_a_store_limit_the_server_would_refuse_is_a_usage_error(
    fleet_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["fleet", "member-config", "--dir", str(fleet_dir), "--cluster", "c1", "--store-dir", "/data"]
    args += ["--hub", "h:7422", "--out", str(tmp_path / "member.conf")]
    for bad in ("8 GB", '8GB"\nauthorization {', "-1"):
        with pytest.raises(SystemExit) as exited:
            main([*args, "--max-file-store", bad])
        assert exited.value.code == 2
        assert "is not a size" in capsys.readouterr().err
    assert not (tmp_path / "member.conf").exists()
