"""The embedded local stack: NATS, a Kubernetes API, the three services, and an optional demo TrainJob.

One object serves ``tjpipe up`` and the end-to-end tests, so the tests exercise exactly what a user runs.
The stack runs its own servers unless it is told, explicitly, to adopt existing ones (``choose_backends``):
most Kubernetes users export ``KUBECONFIG`` for their real cluster, and a demo that followed it would write
a TrainJob there and start a second ``trainer`` field manager next to Trainer's. Its own servers are the
project's binaries on loopback, or testcontainers where asked for and a Docker engine answers. Everything
the stack starts is a process group with a pid file in the state folder, so ``tjpipe down`` from another
shell finds and ends exactly those processes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tjpipe.credentials import (
    ADMIN,
    DLQ_OPERATOR,
    IDENTITIES,
    LOG_KEEPER,
    READER,
    SERVICE_IDENTITY,
    Credentials,
    generate_credentials,
    server_authorization,
    write_authorization,
)
from tjpipe.keys.signing import KeyFolder
from tjpipe.local import crds
from tjpipe.local.cluster import Simulation
from tjpipe.local.identities import ServiceKubeconfigs, install_identities
from tjpipe.local.kubeapi import LocalKube, new_api_client, start_kube
from tjpipe.local.natsd import LocalNats, start_nats
from tjpipe.local.procs import (
    NOT_INHERITED,
    ManagedProcess,
    free_port,
    http_ok,
    spawn,
    stop_from_pid_files,
    wait_until,
)
from tjpipe.settings import STAGES

SERVICES = STAGES
DEMO_NAMESPACE = "tjpipe-demo"
DEMO_TRAINJOB = "mnist"
DEMO_RUNTIME = "torch-distributed"
DEMO_MPI_TRAINJOB = "deepspeed"
DEMO_MPI_RUNTIME = "deepspeed-distributed"
_SIGNING_ENV = (
    "TJPIPE_SIGNING_KEY",
    "TJPIPE_TRUSTED_EVENT_KEYS",
    "TJPIPE_TRUSTED_PLAN_KEYS",
    *(f"TJPIPE_{stage.upper()}_{what}" for stage in SERVICES for what in ("SIGNING_KEY", "NATS_CREDS")),
)
"""Set per service by the stack, never inherited: a service gets only the key material it needs."""
CONTROLLER = "controller"
"""``tjpipe controller``: the three services in one process, each stage with its own identity and keys."""


# One property per path, so each caller names the path it means.
@dataclass(frozen=True)
class StatePaths:
    root: Path

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def env_file(self) -> Path:
        return self.root / "env"

    @property
    def nats_store(self) -> Path:
        return self.root / "nats"

    @property
    def kube_work(self) -> Path:
        return self.root / "kube"

    @property
    def creds(self) -> Path:
        """One NATS nkey seed per identity (``tjpipe.credentials``), mode 0600 in a 0700 folder."""
        return self.root / "creds"

    @property
    def keys(self) -> Path:
        """The stages' signing keys and the keyrings that trust them (``tjpipe.keys.signing``)."""
        return self.root / "keys"

    @property
    def kube_identities(self) -> Path:
        """A kubeconfig and ServiceAccount token per service (``tjpipe.local.identities``), mode 0600."""
        return self.root / "kube-identities"

    def foreign_entries(self) -> list[str]:
        """What the state folder holds that no start of the stack makes (``purge_state`` refuses those)."""
        if not self.root.is_dir():
            return []
        return sorted(entry.name for entry in self.root.iterdir() if entry.name not in _STATE_ENTRIES)


_STATE_ENTRIES = frozenset(
    {
        "logs",
        "kubeconfig",
        "env",
        "nats",
        "nats.conf",
        "kube",
        "creds",
        "keys",
        "webhook-tls",
        "status-server-tls",
        "standin",
        "nats-auth.conf",
        "kube-identities",
    }
)
"""Every name ``Stack`` writes at the top of its state folder."""


def purge_state(paths: StatePaths) -> bool:
    """Delete the state folder of a stopped stack, so that the next start begins from nothing; False if there
    was none. The caller checked ``foreign_entries`` first."""
    import shutil

    if not paths.root.exists():
        return False
    shutil.rmtree(paths.root)
    return True


def docker_available() -> bool:
    """Whether a Docker engine answers (not just a client binary being installed)."""
    try:
        import docker

        docker.from_env(timeout=2).ping()
    except Exception:
        return False
    return True


@dataclass(frozen=True)
class AdoptedCluster:
    kubeconfig: Path
    server: str
    context: str


@dataclass(frozen=True)
class Backends:
    """Which existing servers the stack adopts; None means it runs its own."""

    nats_url: str | None = None
    cluster: AdoptedCluster | None = None

    def describe(self) -> list[str]:
        """What the stack is about to write to, one line per backend, for printing before it does."""
        nats = (
            f"NATS: the EXISTING server(s) {self.nats_url}"
            if self.nats_url
            else "NATS: its own nats-server on 127.0.0.1 (started now)"
        )
        if self.cluster is not None:
            kube = (
                f"Kubernetes: the EXISTING cluster at {self.cluster.server}, context {self.cluster.context!r} "
                f"(kubeconfig {self.cluster.kubeconfig})"
            )
        else:
            kube = "Kubernetes: its own etcd and kube-apiserver on 127.0.0.1 (started now)"
        return [nats, kube]


def choose_backends(
    *,
    nats_url: str | None = None,
    kubeconfig: Path | None = None,
    use_env: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Backends:
    """The servers ``tjpipe up`` writes to: those named explicitly, else (``use_env``) ``NATS_URL`` and
    ``KUBECONFIG``, else its own. The environment alone never makes the stack adopt anything."""
    env = os.environ if environ is None else environ
    if use_env:
        nats_url = nats_url or env.get("NATS_URL") or None
        if kubeconfig is None and env.get("KUBECONFIG"):
            files = [f for f in env["KUBECONFIG"].split(os.pathsep) if f]
            if len(files) != 1:
                raise ValueError(f"KUBECONFIG names {len(files)} files; name one with --kubeconfig")
            kubeconfig = Path(files[0]).expanduser()
    cluster = None
    if kubeconfig is not None:
        server, context = describe_kubeconfig(kubeconfig)
        cluster = AdoptedCluster(kubeconfig=kubeconfig.resolve(), server=server, context=context)
    return Backends(nats_url=nats_url, cluster=cluster)


def describe_kubeconfig(path: Path) -> tuple[str, str]:
    """The API server URL and the name of the current context of a kubeconfig file, read without contacting it."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read kubeconfig {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError(f"kubeconfig {path} is not a mapping")
    context_name = doc.get("current-context") or ""
    contexts = {c.get("name"): c.get("context") or {} for c in doc.get("contexts") or [] if isinstance(c, dict)}
    clusters = {c.get("name"): c.get("cluster") or {} for c in doc.get("clusters") or [] if isinstance(c, dict)}
    if context_name not in contexts:
        raise ValueError(f"kubeconfig {path} has no current context {context_name!r}")
    server = clusters.get(contexts[context_name].get("cluster"), {}).get("server")
    if not server:
        raise ValueError(f"kubeconfig {path}: context {context_name!r} names no cluster with a server")
    return str(server), str(context_name)


@dataclass
class Stack:
    paths: StatePaths
    progress: Callable[[str], None]
    service_args: Sequence[str] = ()
    nats_url: str = ""
    kubeconfig: Path | None = None
    local_nats: LocalNats | None = None
    local_kube: LocalKube | None = None
    services: list[ManagedProcess] = field(default_factory=list)
    metrics_ports: dict[str, int] = field(default_factory=dict)
    credentials: Credentials | None = None
    """The NATS identities' seeds; None only for an adopted server that was given none (anonymous)."""
    webhook_url: str = ""
    """Where ``tjpipe webhook`` listens once ``start_webhook`` registered it; empty otherwise."""
    nats_adopted: bool = False
    """The NATS server is an existing one: only then do the NATS_TLS_* files of the environment apply."""
    simulate: bool = False
    """Run the simulated cluster (``tjpipe.local.cluster``) on the stack's own apiserver: controllers, a
    scheduler, JobSet's manager and kwok nodes. Off: the control plane only. Never on an adopted cluster."""
    sim_nodes: int = 4
    pod_run_seconds: float = 5.0
    one_process: bool = False
    """Run the three stages as one ``tjpipe controller`` process instead of three services."""
    simulation: Simulation | None = None
    real_node: bool = False
    """Give the cluster one real node (``tjpipe.local.realnode``: kubelet, containerd, CNI, kube-proxy, CoreDNS)
    in place of kwok's simulated ones; the controllers, scheduler and JobSet's manager run as with ``simulate``."""
    node: Any = None
    """The ``RealNode`` once ``start_real_node`` started it."""
    service_kubeconfigs: ServiceKubeconfigs | None = None
    """Each service's own ServiceAccount kubeconfig, on the stack's own apiserver; None: the one kubeconfig."""
    history_url: str = ""
    """Where ``tjpipe history-server`` serves once ``start_history_server`` started it; empty otherwise."""
    status_server_url: str = ""
    """``https://127.0.0.1:PORT`` of ``tjpipe status-server`` once ``start_status_server`` started it; empty otherwise.
    The planner then runs with Trainer's TrainJobStatus gate on, telling the pods this URL and CA."""
    _containers: list[Any] = field(default_factory=list)

    # ---------------------------------------------------------------------------------- infrastructure

    def start_infrastructure(
        self,
        *,
        install_crds: bool | None = None,
        nats_url: str | None = None,
        kubeconfig: Path | None = None,
        credentials: Credentials | None = None,
        use_env: bool = False,
    ) -> None:
        """Start the backends, or adopt the ones named: ``nats_url``/``kubeconfig``, or with ``use_env``
        (and only then) ``NATS_URL``/``KUBECONFIG`` (see ``choose_backends``).

        A server the stack starts gets freshly made credentials (``<state>/creds``) and runs with them
        only. An adopted NATS server needs ``credentials`` or ``TJPIPE_NATS_CREDS_DIR`` naming a folder of
        seeds it trusts. Either way the admin identity then sets the bus up.
        """
        self.paths.root.mkdir(parents=True, exist_ok=True)
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        backends = choose_backends(nats_url=nats_url, kubeconfig=kubeconfig, use_env=use_env)
        existing_nats = backends.nats_url
        existing_kube = str(backends.cluster.kubeconfig) if backends.cluster else None
        self.nats_adopted = bool(existing_nats)
        use_containers = (not existing_nats or not existing_kube) and os.environ.get(
            "TJPIPE_BACKEND"
        ) == "testcontainers"
        if use_containers and not docker_available():
            raise RuntimeError("TJPIPE_BACKEND=testcontainers needs a running Docker engine; none answered")

        if existing_nats:
            self.nats_url = existing_nats
            given = credentials or _credentials_from_env()
            self.credentials = given
            self.progress(
                f"NATS: adopting the existing server(s) {existing_nats}"
                + (f" with the identities in {given.root}" if given else " without credentials (anonymous)")
            )
        else:
            self.credentials = generate_credentials(self.paths.creds)
            self.progress(f"NATS: credentials for {', '.join(IDENTITIES)} in {self.paths.creds} (mode 0600)")
            if use_containers:
                self.nats_url = self._nats_container()
            else:
                self.progress("NATS: starting nats-server with JetStream on 127.0.0.1, authorization on")
                self.local_nats = start_nats(
                    store_dir=self.paths.nats_store,
                    log_dir=self.paths.logs,
                    authorization=server_authorization(self.credentials),
                )
                self.nats_url = self.local_nats.url
                self.progress(f"NATS: ready at {self.nats_url}")
        self.setup_bus()

        if existing_kube:
            self.kubeconfig = Path(existing_kube)
            assert backends.cluster is not None
            self.progress(
                f"Kubernetes: adopting the existing cluster at {backends.cluster.server}, "
                f"context {backends.cluster.context!r} (kubeconfig {existing_kube})"
            )
        elif use_containers:
            self.kubeconfig = self._k3s_container()
        else:
            if self.real_node:
                from tjpipe.local import realnode

                realnode.preflight()  # one sentence, before anything starts, where this machine cannot run a node
                self.progress(
                    f"Kubernetes: starting etcd on 127.0.0.1 and kube-apiserver on the real node's bridge "
                    f"({realnode.BRIDGE}, {realnode.NODE_IP}: this machine and its pods only)"
                )
                self.local_kube = realnode.start_control_plane(
                    work_dir=self.paths.kube_work,
                    log_dir=self.paths.logs,
                    kubeconfig_path=self.paths.kubeconfig,
                    progress=self.progress,
                )
            else:
                self.progress("Kubernetes: starting etcd and kube-apiserver on 127.0.0.1")
                self.local_kube = start_kube(
                    work_dir=self.paths.kube_work,
                    log_dir=self.paths.logs,
                    kubeconfig_path=self.paths.kubeconfig,
                    progress=self.progress,
                    service_account_admission=self.simulate,  # the simulated cluster makes default ServiceAccounts
                )
            self.kubeconfig = self.local_kube.kubeconfig
            self.progress(f"Kubernetes: ready at {self.local_kube.server}")
            self.remove_stale_registrations()

        if install_crds if install_crds is not None else not existing_kube:
            started = time.monotonic()
            manifests = crds.crd_manifests(progress=self.progress)
            crds.install_crds(new_api_client(self.kubeconfig), manifests)
            names = ", ".join(m["metadata"]["name"] for m in manifests)
            self.progress(f"CRDs installed from the owning Go modules in {time.monotonic() - started:.1f}s: {names}")
            self.install_runtimes()
        if self.local_kube is not None:
            # An adopted cluster is the user's: its identities are deploy/'s to make, not the stack's.
            self.use_own_identities()
        if self.simulate and self.local_kube is not None:
            self.start_simulation()
        if self.real_node and self.local_kube is not None:
            self.start_real_node()
        self.keys.ensure()
        self.write_env()

    def use_own_identities(self) -> None:
        """Run the services as the pipeline's own ServiceAccounts (``tjpipe.local.identities``), not as admin.

        ``tjpipe up`` does this on its own apiserver; tests call it for an adopted local test apiserver.
        """
        kubeconfig = self._require_kubeconfig()
        self.service_kubeconfigs = install_identities(
            new_api_client(kubeconfig), admin_kubeconfig=kubeconfig, folder=self.paths.kube_identities
        )
        self.progress(
            "Kubernetes: the services run as their own ServiceAccounts (deploy/base/rbac.yaml, applier-policy.yaml)"
        )

    def processes_registering(self) -> set[str]:
        """The processes this stack runs that register objects on its apiserver (``tjpipe.local.registrations``):
        the webhook always, the simulated cluster's when it is simulated."""
        from tjpipe.local import admission_webhook, cluster, realnode

        return {
            admission_webhook.PROCESS_NAME,
            *(cluster.PROCESSES if self.simulate else ()),
            *((realnode.KUBELET,) if self.real_node else ()),
        }

    def remove_stale_registrations(self) -> None:
        """Remove what an earlier start of the stack on the same state registered for processes this one does
        not run (a full stack's JobSet webhooks, StorageClass and nodes, when only the control plane runs)."""
        from tjpipe.local.registrations import remove_registrations

        with new_api_client(self._require_kubeconfig()) as client:
            removed = remove_registrations(client, running=self.processes_registering())
        if removed:
            self.progress(f"Kubernetes: removed what processes not running now had registered: {', '.join(removed)}")

    def start_simulation(self) -> None:
        """Controllers, scheduler, JobSet's manager and simulated nodes on the stack's own apiserver."""
        from tjpipe.local.cluster import start_simulation

        assert self.local_kube is not None
        nodes = "no simulated node: the real one follows" if self.real_node else f"kwok with {self.sim_nodes} nodes"
        self.progress(
            f"Kubernetes: starting the simulated cluster (kube-controller-manager, kube-scheduler, JobSet manager, "
            f"{nodes})"
        )
        self.simulation = start_simulation(
            self.local_kube,
            work_dir=self.paths.kube_work / "simulation",
            log_dir=self.paths.logs,
            progress=self.progress,
            nodes=0 if self.real_node else self.sim_nodes,
            pod_run_seconds=self.pod_run_seconds,
        )

    def start_real_node(self) -> None:
        """The real node (``tjpipe.local.realnode``) on the stack's own apiserver, started with its users."""
        from tjpipe.local.realnode import start_real_node

        assert self.local_kube is not None
        self.progress("Kubernetes: starting a real node (containerd, runc, CNI, kubelet, kube-proxy, CoreDNS)")
        self.node = start_real_node(
            self.local_kube, work_dir=self.paths.kube_work / "node", log_dir=self.paths.logs, progress=self.progress
        )

    def setup_bus(self) -> None:
        """Create or update the streams, per-partition consumers and KV buckets, as the admin identity."""
        setup_bus_as_admin(self.nats_url, self.credentials, tls_from_env=self.nats_adopted)
        self.progress("NATS: bus set up as admin (streams, partition consumers, KV buckets)")

    def nats_connect_options(self, identity: str) -> dict[str, Any]:
        """``plumbing.bus.connect`` keyword arguments for connecting as ``identity`` (TLS files from NATS_TLS_*)."""
        return nats_connect_options(self.credentials, identity, tls_from_env=self.nats_adopted)

    async def connect(self, identity: str = ADMIN, *, name: str | None = None) -> Any:
        """A NATS connection as ``identity`` (default admin), for tools and tests."""
        from plumbing import bus

        return await bus.connect(
            self.nats_url, name=name or f"tjpipe-{identity}", **self.nats_connect_options(identity)
        )

    def _nats_container(self) -> str:
        from testcontainers.nats import NatsContainer

        assert self.credentials is not None
        config = write_authorization(self.credentials, self.paths.root / "nats-auth.conf")
        container = (
            NatsContainer(image="nats:2.11-alpine")
            .with_volume_mapping(str(config), "/etc/nats/auth.conf", "ro")
            .with_command("-js -c /etc/nats/auth.conf")
        )
        container.start()
        self._containers.append(container)
        url = str(container.nats_uri())
        self.progress(f"NATS: container ready at {url}")
        return url

    def _k3s_container(self) -> Path:
        from testcontainers.k3s import K3SContainer

        container = K3SContainer()
        container.start()
        self._containers.append(container)
        self.paths.kubeconfig.write_text(container.config_yaml())
        self.progress("Kubernetes: k3s container ready")
        return self.paths.kubeconfig

    def write_env(self) -> None:
        lines = [f"export NATS_URL={shlex.quote(self.nats_url)}"]
        if self.credentials is not None:
            # The CLI reads as the read-only identity; `tjpipe dlq retry` needs the dlq-operator's.
            lines.append(f"export NATS_CREDS={shlex.quote(str(self.credentials.seed_file(READER).resolve()))}")
            dlq = shlex.quote(str(self.credentials.seed_file(DLQ_OPERATOR).resolve()))
            lines.append(f"# for 'tjpipe dlq retry': NATS_CREDS={dlq} tjpipe dlq retry SEQ")
        if self.kubeconfig is not None:
            lines.append(f"export KUBECONFIG={shlex.quote(str(self.kubeconfig.resolve()))}")
        # So that `tjpipe replay` and `tjpipe plan` plan as this stack's planner does (TrainJobStatus on).
        lines += [f"export {name}={shlex.quote(value)}" for name, value in self.trainjob_status_env().items()]
        self.paths.env_file.write_text("\n".join(lines) + "\n")

    def trainjob_status_env(self) -> dict[str, str]:
        """The planner's TrainJobStatus settings once the status server runs: on, with its loopback URL and CA."""
        if not self.status_server_url:
            return {}
        return {
            "TJPIPE_TRAINJOB_STATUS": "true",
            "TJPIPE_STATUS_SERVER_URL": self.status_server_url,
            "TJPIPE_STATUS_SERVER_CA": str((self.paths.root / "status-server-tls" / "ca.crt").resolve()),
        }

    # ----------------------------------------------------------------------------------------- services

    @property
    def keys(self) -> KeyFolder:
        return KeyFolder(self.paths.keys)

    def sign_headers(self, subject: str, payload: bytes, *, stage: str | None = None) -> dict[str, str]:
        """The signature a genuine message on ``subject`` carries, for tools and tests that publish one."""
        return self.keys.sign_headers(subject, payload, stage=stage)

    def service_env(self, service: str) -> dict[str, str]:
        # The stack's NATS_URL, NATS_CREDS and KUBECONFIG, never the user's (spawn leaves those out); the
        # user's NATS_TLS_* files only for an adopted NATS server, since the stack's own has no TLS.
        env = {k: v for k, v in os.environ.items() if k not in _SIGNING_ENV and k not in NOT_INHERITED}
        if self.nats_adopted:
            env.update({k: v for k, v in os.environ.items() if k.startswith("NATS_TLS_")})
        env["NATS_URL"] = self.nats_url
        if service == CONTROLLER:
            env.update(self._controller_env())
        else:
            env.update(self.keys.service_env(service))
        if self.credentials is not None and service in SERVICE_IDENTITY:
            # Its own identity only; never the admin's, never another stage's. The webhook has none.
            env["NATS_CREDS"] = str(self.credentials.seed_file(SERVICE_IDENTITY[service]).resolve())
        if self.service_kubeconfigs is not None:
            own = self.service_kubeconfigs.for_service(service)
            if own is not None:  # the planner talks to no API server and gets no kubeconfig
                env["KUBECONFIG"] = str(own.resolve())
        elif self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig.resolve())
        if service in ("planner", CONTROLLER):
            env |= self.trainjob_status_env()
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _controller_env(self) -> dict[str, str]:
        """Each stage's identity and keys under its own names: what the three services' environments hold."""
        env: dict[str, str] = {}
        for stage in SERVICES:
            for name, value in self.keys.service_env(stage).items():
                own = f"TJPIPE_{stage.upper()}_SIGNING_KEY" if name == "TJPIPE_SIGNING_KEY" else name
                env[own] = value
            if self.credentials is not None:
                env[f"TJPIPE_{stage.upper()}_NATS_CREDS"] = str(
                    self.credentials.seed_file(SERVICE_IDENTITY[stage]).resolve()
                )
        return env

    def start_service(self, service: str, *, name: str | None = None, extra: Sequence[str] = ()) -> ManagedProcess:
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "tjpipe",
            service,
            "--log-format",
            "json",
            "--metrics-port",
            str(port),
            "--replica-id",
            name or service,
            *self.service_args,
            *extra,
        ]
        process = spawn(name=name or service, argv=argv, log_dir=self.paths.logs, env=self.service_env(service))
        self.services.append(process)
        self.metrics_ports[name or service] = port
        return process

    def start_services(self) -> None:
        for service in (CONTROLLER,) if self.one_process else SERVICES:
            process = self.start_service(service)
            port = self.metrics_ports[service]
            self.progress(f"started {service} (pid {process.pid}, metrics :{port}/metrics, log {process.log_path})")

    def start_webhook(self) -> ManagedProcess:
        """``tjpipe webhook`` on loopback with a fresh CA, registered on the apiserver (failurePolicy Fail),
        and the SDK's ``kubeflow-trainer-public`` ConfigMap; returns once the apiserver calls the webhook."""
        from tjpipe.keys.pki import write_serving_pki
        from tjpipe.local import admission_webhook

        cert_dir = self.paths.root / "webhook-tls"
        ca_pem = write_serving_pki(cert_dir, ca_name="tjpipe-webhook-ca", common_name="tjpipe-webhook")
        port = free_port()
        process = self.start_service(
            "webhook",
            extra=[
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--tls-cert",
                str(cert_dir / "tls.crt"),
                "--tls-key",
                str(cert_dir / "tls.key"),
            ],
        )
        health = f"http://127.0.0.1:{self.metrics_ports['webhook']}/readyz"
        wait_until(lambda: http_ok(health), timeout=30, what=f"tjpipe webhook {health}", process=process)
        self.webhook_url = f"https://127.0.0.1:{port}"
        with new_api_client(self._require_kubeconfig()) as client:
            admission_webhook.register(client, url=self.webhook_url, ca_bundle=ca_pem, process=process)
            crds.apply_objects(client, admission_webhook.trainer_public_objects(), field_manager="tjpipe-up")
        self.progress(
            f"started webhook (pid {process.pid}, {self.webhook_url}, log {process.log_path}); "
            f"ValidatingWebhookConfiguration {admission_webhook.CONFIGURATION_NAME} registered, failurePolicy Fail; "
            f"ConfigMap {admission_webhook.PUBLIC_NAMESPACE}/{admission_webhook.PUBLIC_CONFIGMAP} "
            f"says {admission_webhook.TRAINER_VERSION}"
        )
        return process

    def start_status_server(self) -> ManagedProcess:
        """``tjpipe status-server`` on loopback with a CA of its own, as its own NATS identity and ServiceAccount;
        returns once it is ready. Started before the planner, which then tells the pods its URL and CA: on this
        stack no pod runs, and the demo's stand-in reports from the host, so the URL is the loopback one."""
        from tjpipe.keys.pki import write_serving_pki

        cert_dir = self.paths.root / "status-server-tls"
        # On the real node the pods reach it on the node's bridge address, which exists on this machine only.
        host = "127.0.0.1"
        if self.real_node:
            from tjpipe.local.realnode import NODE_IP

            host = NODE_IP
        write_serving_pki(
            cert_dir,
            ca_name="tjpipe-status-server-ca",
            common_name="tjpipe-status-server",
            ip_addresses=[host] if host != "127.0.0.1" else [],
        )
        port = free_port()
        process = self.start_service(
            "status-server",
            extra=[
                "--host", host, "--port", str(port),
                "--tls-cert", str(cert_dir / "tls.crt"), "--tls-key", str(cert_dir / "tls.key"),
            ],
        )  # fmt: skip
        health = f"http://127.0.0.1:{self.metrics_ports['status-server']}/readyz"
        wait_until(lambda: http_ok(health), timeout=60, what=f"tjpipe status-server {health}", process=process)
        self.status_server_url = f"https://{host}:{port}"
        self.write_env()
        self.progress(
            f"started status-server (pid {process.pid}, {self.status_server_url}, log {process.log_path}); "
            "TrainJobStatus on: trainer pods are told its URL and CA"
        )
        return process

    def start_history_server(self, *, port: int | None = None) -> ManagedProcess:
        """``tjpipe history-server`` on loopback as the read-only ``reader`` identity, counting refused
        publishes from the services' metrics; returns once it has read the streams."""
        listen = port or free_port()
        argv = [
            sys.executable,
            "-m",
            "tjpipe",
            "history-server",
            "--listen",
            f"127.0.0.1:{listen}",
            "--log-format",
            "json",
            *(f"--scrape=http://127.0.0.1:{p}/metrics" for n, p in self.metrics_ports.items() if n != "webhook"),
        ]
        env = self.service_env("history-server")
        if self.credentials is not None:
            env["NATS_CREDS"] = str(self.credentials.seed_file(READER).resolve())
            # Keeps pods' logs in the logs bucket as log-keeper (the real node's pods have some).
            env["TJPIPE_HISTORY_LOGS_CREDS"] = str(self.credentials.seed_file(LOG_KEEPER).resolve())
        process = spawn(name="history-server", argv=argv, log_dir=self.paths.logs, env=env)
        self.services.append(process)
        url = f"http://127.0.0.1:{listen}"
        wait_until(
            lambda: http_ok(f"{url}/readyz"), timeout=60, what=f"tjpipe history-server {url}/readyz", process=process
        )
        self.history_url = url
        self.progress(f"started history-server (pid {process.pid}, {url}, log {process.log_path})")
        return process

    @property
    def login_token(self) -> str:
        """A bearer token of the stack's own apiserver's admin user, for the history server's login; empty on
        an adopted cluster, whose tokens are its owner's to hand out."""
        return self.local_kube.token if self.local_kube is not None else ""

    def unregister_webhook(self) -> None:
        """Remove the webhook configuration: with failurePolicy Fail, a stopped webhook would refuse every
        TrainJob on a cluster that outlives the stack."""
        from kubernetes.client import AdmissionregistrationV1Api

        from tjpipe.local import admission_webhook

        if not self.webhook_url or self.kubeconfig is None:
            return
        try:
            with new_api_client(self.kubeconfig) as client:
                AdmissionregistrationV1Api(client).delete_validating_webhook_configuration(
                    admission_webhook.CONFIGURATION_NAME
                )
        except Exception as exc:  # the apiserver may be gone already; nothing then calls the webhook
            self.progress(f"could not remove {admission_webhook.CONFIGURATION_NAME}: {exc}")
        self.webhook_url = ""

    # --------------------------------------------------------------------------------------------- demo

    def install_runtime(self, name: str) -> None:
        runtime = crds.shipped_runtimes()[name]
        crds.apply_objects(new_api_client(self._require_kubeconfig()), [runtime], field_manager="tjpipe-demo")

    def install_runtimes(self) -> None:
        """Every ClusterTrainingRuntime Trainer v2.3.0 ships, and what its install provides for them (the cache
        initializer's ServiceAccount and RBAC): what a cluster with Trainer installed offers its users."""
        runtimes = crds.shipped_runtimes()
        prerequisites = crds.runtime_prerequisites()
        with new_api_client(self._require_kubeconfig()) as client:
            crds.apply_objects(client, [*prerequisites, *runtimes.values()], field_manager=crds.SETUP_FIELD_MANAGER)
        self.progress(
            f"installed Trainer {crds.TRAINER_VERSION}'s {len(runtimes)} ClusterTrainingRuntimes "
            f"({', '.join(sorted(runtimes))}), the cache initializer's ClusterRole, and its ServiceAccount and "
            f"RoleBinding in namespace {crds.CACHE_INITIALIZER_NAMESPACE}"
        )

    def create_demo(self) -> tuple[str, str]:
        """Install ``torch-distributed`` and a TrainJob shaped like Trainer's MNIST example."""
        self.install_runtime(DEMO_RUNTIME)
        self.progress(f"installed ClusterTrainingRuntime {DEMO_RUNTIME} (Trainer v2.3.0 sample)")
        client = new_api_client(self._require_kubeconfig())
        self._remove_last_demo(client, DEMO_TRAINJOB)
        trainjob = real_node_demo_trainjob() if self.real_node else demo_trainjob()
        crds.apply_objects(
            client,
            [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DEMO_NAMESPACE}}, trainjob],
            field_manager="tjpipe-demo",
        )
        self.progress(f"created TrainJob {DEMO_NAMESPACE}/{DEMO_TRAINJOB}")
        return DEMO_NAMESPACE, DEMO_TRAINJOB

    def create_mpi_demo(self) -> tuple[str, str]:
        """Install ``deepspeed-distributed`` and a two-node TrainJob on it: an MPI runtime, so the TrainJob also
        owns a hostfile ConfigMap and an SSH-key Secret (what the demo's clean-up step shows being removed)."""
        self.install_runtime(DEMO_MPI_RUNTIME)
        self.progress(f"installed ClusterTrainingRuntime {DEMO_MPI_RUNTIME} (Trainer v2.3.0 sample)")
        client = new_api_client(self._require_kubeconfig())
        self._remove_last_demo(client, DEMO_MPI_TRAINJOB)
        crds.apply_objects(client, [mpi_demo_trainjob()], field_manager="tjpipe-demo")
        self.progress(f"created TrainJob {DEMO_NAMESPACE}/{DEMO_MPI_TRAINJOB}")
        return DEMO_NAMESPACE, DEMO_MPI_TRAINJOB

    def _remove_last_demo(self, client: Any, name: str) -> None:
        """A demo TrainJob of an earlier run (one started with ``--detach`` keeps its TrainJobs) is deleted, with
        everything it owns, before this run creates its own: the demo must show a lifecycle, not an old result."""
        if remove_trainjob(
            client,
            DEMO_NAMESPACE,
            name,
            garbage_collector=self.simulation is not None or self.local_kube is None,
            timeout=DEMO_CLEANUP_SECONDS,
        ):
            self.progress(f"removed the last run's TrainJob {DEMO_NAMESPACE}/{name} and what it owned")

    def _require_kubeconfig(self) -> Path:
        if self.kubeconfig is None:
            raise RuntimeError("the Kubernetes backend is not started")
        return self.kubeconfig

    # --------------------------------------------------------------------------------------------- stop

    def stop(self) -> None:
        if self.local_kube is None:
            self.unregister_webhook()  # a local apiserver goes away with its configuration
        for process in reversed(self.services):
            process.stop()
        self.services.clear()
        if self.node is not None:
            self.node.stop()
            self.node = None
        if self.simulation is not None:
            self.simulation.stop()
            self.simulation = None
        if self.local_kube is not None:
            self.local_kube.stop()
            self.local_kube = None
            if self.real_node:
                from tjpipe.local.realnode import teardown_network

                teardown_network()  # the bridge the apiserver listened on (the node's stop removed it already)
        if self.local_nats is not None:
            self.local_nats.stop()
            self.local_nats = None
        for container in self._containers:
            container.stop()
        self._containers.clear()


def nats_connect_options(
    credentials: Credentials | None, identity: str, *, tls_from_env: bool = True
) -> dict[str, Any]:
    """``plumbing.bus.connect`` keyword arguments for ``identity``; TLS files from NATS_TLS_CA/_CERT/_KEY
    unless ``tls_from_env`` is off (a server of the stack's own, which has no TLS)."""
    from plumbing.bus import TlsFiles

    env: Mapping[str, str] = os.environ if tls_from_env else {}
    tls = TlsFiles.from_options(env.get("NATS_TLS_CA"), env.get("NATS_TLS_CERT"), env.get("NATS_TLS_KEY"))
    creds = str(credentials.seed_file(identity)) if credentials is not None else None
    return {"creds": creds, "tls": tls}


def setup_bus_as_admin(
    nats_url: str,
    credentials: Credentials | None,
    *,
    environ: Mapping[str, str] | None = None,
    tls_from_env: bool = True,
) -> None:
    """``plumbing.bus_setup.setup_bus`` as the admin identity, from sync code (its own thread and event loop, so a
    caller already inside an event loop, such as an async fixture, can use it too)."""
    from contracts import streams
    from plumbing import bus, bus_setup

    env = os.environ if environ is None else environ

    async def run() -> None:
        options = nats_connect_options(credentials, ADMIN, tls_from_env=tls_from_env)
        nc = await bus.connect(nats_url, name="tjpipe-bus-setup", **options)
        try:
            await bus_setup.setup_bus(
                nc.jetstream(),
                streams.configured_streams(env),
                replicas=streams.stream_replicas(env),
                buckets=streams.configured_buckets(env),
            )
        finally:
            await nc.close()

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, run()).result()


def _credentials_from_env() -> Credentials | None:
    folder = os.environ.get("TJPIPE_NATS_CREDS_DIR")
    return Credentials(Path(folder)) if folder else None


def _demo_trainjob(name: str, runtime: str, *, nodes: int, per_node: dict[str, str], **trainer: Any) -> dict[str, Any]:
    """A demo TrainJob: ``nodes`` nodes, each requesting (and limited to) ``per_node``; ``trainer``'s other fields."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": DEMO_NAMESPACE},
        "spec": {
            "runtimeRef": {"name": runtime},
            "trainer": {
                "numNodes": nodes,
                "resourcesPerNode": {"requests": dict(per_node), "limits": dict(per_node)},
                **trainer,
            },
        },
    }


DEMO_CLEANUP_SECONDS = 120.0
"""How long the demo waits for the last run's TrainJob and what it owned to be gone."""


def remove_trainjob(client: Any, namespace: str, name: str, *, garbage_collector: bool, timeout: float) -> bool:
    """Delete TrainJob ``namespace/name`` and everything it owns, and wait until all of it is gone; False if there
    was no such TrainJob. With a garbage collector, a foreground deletion: the TrainJob disappears only after its
    JobSet, the JobSet's Jobs and their pods did. Without one (a control plane alone), the objects it owns
    directly (JobSets, ConfigMaps, Secrets) are deleted by name, since nothing else would."""
    from kubernetes.client import CoreV1Api, CustomObjectsApi, V1DeleteOptions, V1Preconditions
    from kubernetes.client.exceptions import ApiException

    custom, core = CustomObjectsApi(client), CoreV1Api(client)
    group, version = "trainer.kubeflow.org", "v1alpha1"
    try:
        trainjob: Any = custom.get_namespaced_custom_object(group, version, namespace, "trainjobs", name)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    uid = trainjob["metadata"]["uid"]
    policy = "Foreground" if garbage_collector else "Background"
    with_gc = V1DeleteOptions(propagation_policy=policy, preconditions=V1Preconditions(uid=uid))
    try:
        custom.delete_namespaced_custom_object(group, version, namespace, "trainjobs", name, body=with_gc)
    except ApiException as error:
        if error.status not in (404, 409):  # gone already, or a newer one of the name: not ours to delete
            raise
    leftovers: list[Callable[[], Any]] = []
    if not garbage_collector:

        def owned(metadata: Any) -> bool:
            refs = metadata.get("ownerReferences") if isinstance(metadata, dict) else metadata.owner_references
            return any((r.get("uid") if isinstance(r, dict) else r.uid) == uid for r in refs or [])

        jobsets: Any = custom.list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets")
        for item in jobsets["items"]:
            if owned(item["metadata"]):
                leftovers.append(
                    functools.partial(
                        custom.delete_namespaced_custom_object,
                        "jobset.x-k8s.io",
                        "v1alpha2",
                        namespace,
                        "jobsets",
                        item["metadata"]["name"],
                    )
                )
        for lister, deleter in (
            (core.list_namespaced_config_map, core.delete_namespaced_config_map),
            (core.list_namespaced_secret, core.delete_namespaced_secret),
        ):
            listed: Any = lister(namespace)
            for item in listed.items:
                if owned(item.metadata):
                    leftovers.append(functools.partial(deleter, item.metadata.name, namespace))
        for delete in leftovers:
            try:
                delete()
            except ApiException as error:
                if error.status != 404:
                    raise

    def gone() -> bool:
        try:
            current: Any = custom.get_namespaced_custom_object(group, version, namespace, "trainjobs", name)
        except ApiException as error:
            if error.status == 404:
                return True
            raise
        return bool(current["metadata"]["uid"] != uid)

    wait_until(gone, timeout=timeout, what=f"TrainJob {namespace}/{name} of the last run to be deleted")
    return True


def demo_trainjob() -> dict[str, Any]:
    return _demo_trainjob(
        DEMO_TRAINJOB,
        DEMO_RUNTIME,
        nodes=4,
        per_node={"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"},
        command=["torchrun"],
        args=["/workspace/mnist.py", "--epochs", "1", "--backend", "nccl"],
    )


def real_node_demo_trainjob() -> dict[str, Any]:
    """The demo TrainJob on the real node: the demo's training image (``images/trainer-demo``), which trains a
    tiny model and reports its progress from the pod, sized for a laptop."""
    from tjpipe.local.realnode import TRAINING_IMAGE

    return _demo_trainjob(
        DEMO_TRAINJOB,
        DEMO_RUNTIME,
        nodes=1,
        per_node={"cpu": "500m", "memory": "512Mi"},
        image=TRAINING_IMAGE,
        command=["python3", "/opt/train/train.py"],
    )


def mpi_demo_trainjob() -> dict[str, Any]:
    return _demo_trainjob(
        DEMO_MPI_TRAINJOB, DEMO_MPI_RUNTIME, nodes=2, per_node={"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2"}
    )


def stop_detached(paths: StatePaths) -> list[str]:
    """Stop what ``tjpipe up --detach`` left running; a real node's containers, mounts and network go too."""
    node_dir = paths.kube_work / "node"
    if not node_dir.exists():  # made first thing by a real node's start (its apiserver's client certificate)
        return stop_from_pid_files(paths.logs)
    from tjpipe.local import realnode
    from tjpipe.local.toolchain import node_binaries_paths

    if (node_dir / "containerd.toml").exists():
        realnode.remove_all_pods(node_dir)  # while containerd still runs
    stopped = stop_from_pid_files(paths.logs)
    realnode.forget_host_dirs(node_dir)
    realnode.teardown_network(node_binaries_paths().kube_proxy)
    return stopped
