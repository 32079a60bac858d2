"""Containers a fault test starts for itself: a JetStream cluster, etcd and kube-apiserver, the services.

Why containers and not processes on loopback (tests/scale does that): a process can be killed or frozen,
but only a network can be split. Each server here has its own address on a bridge network the test
creates, so ``docker network disconnect`` cuts one NATS server off from its peers and its clients at once,
the way a partition does, and ``docker stop``/``kill`` stop a member the way an orchestrator or a crash
does. Every image is one the compose stack runs (built offline by scripts/compose-images.sh), so what is
tested is what is deployed.

Why everything on the test's own network: nothing here reaches beyond this machine, and nothing another
run (or a stack started by hand) owns is touched. Every container and the network carry the run's label
and name prefix, and :meth:`Rig.close` removes them all, also after a failure. The test itself reads
through ports published on 127.0.0.1 only; the servers do not advertise their addresses to clients
(``no_advertise``), so a client on the host never tries an address only the bridge knows.

Why no TLS on this bus: every connection is still authenticated (nkeys, one identity per service, the
project's permissions) and the routes carry a password; the bus's TLS is tested by tests/compose, on the
compose stack's own server. Kube is the compose stack's apiserver image with its usual flags
(``tjpipe.local.kubeapi``), without the simulated cluster: nothing here needs pods to run.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import phase_times
from compose.support import image_builder

from tjpipe.credentials import Credentials, generate_credentials, server_authorization
from tjpipe.keys.signing import KeyFolder
from tjpipe.local import compose, crds, kubeapi
from tjpipe.local.kubeapi import LocalKube, new_api_client
from tjpipe.local.natsd import member_config

RUN_LABEL = "tjpipe.test.run"
NATS_CLIENT_PORT, NATS_MONITOR_PORT, NATS_ROUTE_PORT = 4222, 8222, 6222
APISERVER_ALIAS = compose.APISERVER_HOST
SERVICE_USER = compose.SERVICE_USER
IMAGES = (compose.NATS_IMAGE, compose.ETCD_IMAGE, compose.APISERVER_IMAGE, compose.PROJECT_IMAGE)
"""What a rig runs; scripts/compose-images.sh builds them all (and more)."""
SERVICE_ROLES = ("watcher", "planner", "applier")
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def say(line: str) -> None:
    print(f"[containers {time.strftime('%H:%M:%S')}] {line}", flush=True)


def docker(*args: str, timeout: float = 60, check: bool = True) -> str:
    """The docker CLI's stdout; its stderr in the error when it fails."""
    completed = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and completed.returncode != 0:
        raise AssertionError(
            f"docker {' '.join(args[:4])} … failed ({completed.returncode}): {completed.stderr[-2000:]}"
        )
    return completed.stdout


def ensure_images() -> None:
    """Build the images a rig runs with the project's offline builder (tools/compose_images.py): each is
    rebuilt only when what it is made from changed, so a warm run takes seconds."""
    builder = image_builder()
    started = time.monotonic()
    builder.build_base()
    for binary in builder.binary_images():
        if binary.name in IMAGES:
            builder.build_binary_image(binary)
    builder.build_nats_image()
    builder.build_runtime_image()
    took = time.monotonic() - started
    phase_times.inside("container images (built or found)", took)
    say(f"images ready in {took:.0f}s")


def _own(path: Path, uid: int) -> None:
    """Hand ``path`` (recursively) to the services' user: the images run as it and mount these read-only."""
    for target in [path, *path.rglob("*")]:
        os.chown(target, uid, uid)


# ------------------------------------------------------------------------------------------- containers


@dataclass
class Container:
    """One container of the rig: its name on the docker CLI and its alias on the rig's network."""

    name: str
    alias: str
    network: str

    def stop(self, timeout: int = 10) -> None:
        docker("stop", "--time", str(timeout), self.name, timeout=timeout + 30)

    def kill(self) -> None:
        docker("kill", self.name)

    def start(self) -> None:
        docker("start", self.name)

    def disconnect(self) -> None:
        docker("network", "disconnect", self.network, self.name)

    def connect(self) -> None:
        docker("network", "connect", "--alias", self.alias, self.network, self.name)

    def running(self) -> bool:
        return docker("inspect", "--format", "{{.State.Running}}", self.name, check=False).strip() == "true"

    def exit_code(self) -> int:
        return int(docker("inspect", "--format", "{{.State.ExitCode}}", self.name).strip())

    def port(self, container_port: int) -> int:
        """The host port (on 127.0.0.1) Docker published ``container_port`` on."""
        out = docker("port", self.name, f"{container_port}/tcp").split()
        assert out, f"{self.name} publishes no port {container_port}"
        return int(out[0].rsplit(":", 1)[1])

    def logs(self, tail: int = 40) -> str:
        completed = subprocess.run(
            ["docker", "logs", "--tail", str(tail), self.name], capture_output=True, text=True, timeout=30, check=False
        )
        return completed.stdout + completed.stderr


# ----------------------------------------------------------------------------------------------- the rig


@dataclass
class Rig:
    """Everything one test module starts, on one network of its own; :meth:`close` removes all of it."""

    root: Path
    run: str = field(default_factory=lambda: f"tjfault{secrets.token_hex(3)}")
    containers: dict[str, Container] = field(default_factory=dict)
    network: str = ""
    creds: Credentials | None = None
    keys: KeyFolder | None = None
    kube: LocalKube | None = None
    nats_names: list[str] = field(default_factory=list)
    killed: set[str] = field(default_factory=set)
    """Services a test killed on purpose (their aliases): not counted as exited by :meth:`exited_services`."""
    _host_ports: dict[str, tuple[int, int]] = field(default_factory=dict)

    # ---------------------------------------------------------------------------------------- plumbing

    def open(self) -> Rig:
        self.network = f"{self.run}-net"
        docker("network", "create", "--label", f"{RUN_LABEL}={self.run}", self.network)
        self.creds = generate_credentials(self.root / "creds")
        self.keys = KeyFolder(self.root / "keys").ensure()
        return self

    def run_container(
        self,
        alias: str,
        image: str,
        *args: str,
        env: dict[str, str] | None = None,
        mounts: Iterable[tuple[Path, str]] = (),
        publish: Sequence[int] = (),
        entrypoint: str | None = None,
        hardened: bool = False,
        detach: bool = True,
        timeout: float = 60,
    ) -> Container:
        """``docker run`` on the rig's network as ``<run>-<alias>``, reachable there as ``alias``;
        ``hardened`` runs it as compose runs the services (read-only, no capabilities, /tmp in memory)."""
        name = f"{self.run}-{alias}"
        argv = ["run", "--name", name, "--network", self.network, "--network-alias", alias]
        argv += ["--label", f"{RUN_LABEL}={self.run}", "--hostname", alias]
        argv += ["-d"] if detach else ["--rm"]
        for key, value in (env or {}).items():
            argv += ["-e", f"{key}={value}"]
        for source, target in mounts:
            argv += ["-v", f"{source}:{target}:ro"]
        for port in publish:
            argv += ["-p", f"127.0.0.1::{port}"]
        if entrypoint is not None:
            argv += ["--entrypoint", entrypoint]
        if hardened:
            argv += ["--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true"]
        docker(*argv, image, *args, timeout=timeout)
        container = Container(name=name, alias=alias, network=self.network)
        if detach:
            self.containers[alias] = container
        return container

    def close(self) -> None:
        label = f"label={RUN_LABEL}={self.run}"
        ids = docker("ps", "-a", "-q", "--filter", label, check=False).split()
        if ids:
            docker("rm", "-f", "-v", *ids, timeout=120, check=False)
        if self.network:
            docker("network", "rm", self.network, check=False)

    def leftovers(self) -> dict[str, list[str]]:
        label = f"label={RUN_LABEL}={self.run}"
        return {
            "containers": docker("ps", "-a", "-q", "--filter", label).split(),
            "networks": docker("network", "ls", "-q", "--filter", label).split(),
        }

    def logs(self, tail: int = 15) -> str:
        return "\n".join(f"--- {c.name} ---\n{c.logs(tail)}" for c in self.containers.values())

    # ----------------------------------------------------------------------------------------- NATS

    def start_nats(self, size: int = 3, *, timeout: float = 60) -> None:
        """``size`` JetStream servers in one cluster, with the project's client authorization and
        password-authenticated routes; returns once they agree on a meta leader and see each other current."""
        assert self.creds is not None
        self.nats_names = [f"nats-{i}" for i in range(size)]
        route_password = secrets.token_urlsafe(24)
        authorization = server_authorization(self.creds)
        for name in self.nats_names:
            folder = self.root / name
            folder.mkdir(parents=True, exist_ok=True)
            config = member_config(
                name=name,
                client_listen=f"0.0.0.0:{NATS_CLIENT_PORT}",
                monitor_listen=f"0.0.0.0:{NATS_MONITOR_PORT}",
                cluster_listen=f"0.0.0.0:{NATS_ROUTE_PORT}",
                store_dir="/data",
                route_hosts=[f"{other}:{NATS_ROUTE_PORT}" for other in self.nats_names if other != name],
                route_password=route_password,
                advertise=False,
            )
            (folder / "nats.conf").write_text(config + authorization)
            (folder / "nats.conf").chmod(0o600)
            self.run_container(
                name,
                compose.NATS_IMAGE,
                "-c",
                "/etc/nats/nats.conf",
                env={"GOGC": "50"},
                mounts=[(folder, "/etc/nats")],
                publish=(NATS_CLIENT_PORT, NATS_MONITOR_PORT),
            )
        for name in self.nats_names:
            self.refresh_ports(name)
        self.wait_nats_ready(timeout=timeout)

    def refresh_ports(self, name: str, *, timeout: float = 30) -> None:
        """Read member ``name``'s published ports again: Docker publishes them anew (on other host ports)
        when a container starts again or joins the network again."""
        container = self.containers[name]
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._host_ports[name] = (container.port(NATS_CLIENT_PORT), container.port(NATS_MONITOR_PORT))
                return
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def bring_back(self, name: str, how: Callable[[], None]) -> None:
        """Heal member ``name`` with ``how`` (its container's start or connect) and find its ports again."""
        how()
        self.refresh_ports(name)

    @property
    def inside_url(self) -> str:
        """NATS_URL for the services: every member by its alias on the rig's network."""
        return ",".join(f"nats://{name}:{NATS_CLIENT_PORT}" for name in self.nats_names)

    def host_url(self, *, without: Iterable[str] = ()) -> str:
        """The members' published client ports, for the test's own reads (leaving out ``without``)."""
        skip = set(without)
        return ",".join(f"nats://127.0.0.1:{self._host_ports[n][0]}" for n in self.nats_names if n not in skip)

    def jsz(self, name: str) -> dict[str, Any]:
        """Member ``name``'s /jsz; empty when it does not answer (stopped, or cut off)."""
        try:
            with _DIRECT.open(f"http://127.0.0.1:{self._host_ports[name][1]}/jsz", timeout=2) as response:
                body = json.loads(response.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError, OSError):
            return {}
        return body if isinstance(body, dict) else {}

    def nats_ready(self, names: Iterable[str] | None = None) -> bool:
        """The named members (default: all) answer, agree on a meta leader, and it sees them all current."""
        wanted = list(names or self.nats_names)
        reports = {n: self.jsz(n) for n in wanted}
        leaders = {str((r.get("meta_cluster") or {}).get("leader") or "") for r in reports.values()}
        if any(not r for r in reports.values()) or len(leaders) != 1:
            return False
        leader = leaders.pop()
        if leader not in wanted:
            return False
        replicas = (reports[leader].get("meta_cluster") or {}).get("replicas") or []
        current = {str(p.get("name")) for p in replicas if p.get("current") and not p.get("offline")}
        return all(n in current for n in wanted if n != leader)

    def wait_nats_ready(self, names: Iterable[str] | None = None, *, timeout: float = 60) -> float:
        """Seconds until :meth:`nats_ready`; fails with the members' logs after ``timeout``."""
        started = time.monotonic()
        wanted = list(names or self.nats_names)
        while not self.nats_ready(wanted):
            if time.monotonic() - started > timeout:
                raise AssertionError(
                    f"NATS members {wanted} not one cluster after {timeout:.0f}s:\n"
                    + "\n".join(self.containers[n].logs(20) for n in wanted)
                )
            time.sleep(0.5)
        return time.monotonic() - started

    def meta_leader(self) -> str:
        for name in self.nats_names:
            leader = str((self.jsz(name).get("meta_cluster") or {}).get("leader") or "")
            if leader:
                return leader
        return ""

    # ----------------------------------------------------------------------------------------- kube

    def start_kube(self, *, timeout: float = 120, progress: Callable[[str], None] = say) -> LocalKube:
        """etcd and kube-apiserver (the compose stack's images and flags) with the CRDs and Trainer's runtimes."""
        pki_dir = self.root / "pki"
        pki = kubeapi.write_pki(pki_dir, dns_names=[APISERVER_ALIAS])
        token = kubeapi.write_token_file(pki_dir / "tokens.csv")
        flags = compose.component_flags()
        self.run_container("etcd", compose.ETCD_IMAGE, *flags["etcd"], entrypoint="/usr/local/bin/etcd")
        container_pki = kubeapi.pki_paths(compose.PKI_DIR)
        apiserver_flags = kubeapi.apiserver_flags(
            etcd_url=compose.ETCD_URL,
            bind_address="0.0.0.0",
            port=compose.APISERVER_PORT,
            pki=container_pki,
            tokens_file=compose.TOKENS_FILE,
            issuer=f"https://{APISERVER_ALIAS}:{compose.APISERVER_PORT}/",
        )
        apiserver = self.run_container(
            APISERVER_ALIAS,
            compose.APISERVER_IMAGE,
            *apiserver_flags,
            entrypoint="/usr/local/bin/kube-apiserver",
            mounts=[(pki_dir, str(compose.PKI_DIR))],
            publish=(compose.APISERVER_PORT,),
        )
        server = f"https://127.0.0.1:{apiserver.port(compose.APISERVER_PORT)}"
        host_kubeconfig = self.root / "kubeconfig"
        kubeapi.write_kubeconfig(host_kubeconfig, server=server, ca_file=pki.ca_cert, token=token)
        kubeapi.wait_for_api(host_kubeconfig, timeout=timeout, poll_seconds=1)
        # The services' view of it: by its alias, the CA inside; readable by the services' user only.
        inside = self.root / "kube-inside"
        inside.mkdir(mode=0o700, exist_ok=True)
        kubeapi.write_kubeconfig(
            inside / "kubeconfig",
            server=f"https://{APISERVER_ALIAS}:{compose.APISERVER_PORT}",
            ca_file=pki.ca_cert,
            token=token,
            embed_ca=True,
        )
        _own(inside, SERVICE_USER)
        with new_api_client(host_kubeconfig) as api:
            crds.install_crds(api, crds.crd_manifests(progress=progress))
            runtimes = crds.shipped_runtimes()
            crds.apply_objects(
                api, [*crds.runtime_prerequisites(), *runtimes.values()], field_manager="tjpipe-container-test"
            )
        self.kube = LocalKube(server=server, token=token, ca_file=pki.ca_cert, kubeconfig=host_kubeconfig, processes=())
        return self.kube

    # ------------------------------------------------------------------------------------- services

    def _service_files(self, role: str) -> list[tuple[Path, str]]:
        """The folders one service mounts: its NATS identity, its kubeconfig, its signing key, the keys it trusts."""
        assert self.creds is not None and self.keys is not None
        folder = self.root / "identities" / role
        if not folder.exists():
            folder.mkdir(parents=True)
            shutil.copyfile(self.creds.seed_file(role), folder / "nats.nk")
            (folder / "nats.nk").chmod(0o400)
            _own(folder, SERVICE_USER)
            _own(self.keys.root, SERVICE_USER)
        mounts = [(folder, "/etc/tjpipe/nats")]
        if role in ("watcher", "applier"):
            mounts.append((self.root / "kube-inside", "/kube"))
        if role in ("watcher", "planner"):
            mounts.append((self.keys.signing_key(role).parent, "/etc/tjpipe/signing"))
        if role == "planner":
            mounts.append((self.keys.trusted_events, "/etc/tjpipe/trusted-events"))
        if role == "applier":
            mounts.append((self.keys.trusted_plans, "/etc/tjpipe/trusted-plans"))
        return mounts

    def service_env(self, role: str, replica: str) -> dict[str, str]:
        env = {
            "NATS_URL": self.inside_url,
            "NATS_CREDS": "/etc/tjpipe/nats/nats.nk",
            "TJPIPE_STREAM_REPLICAS": str(len(self.nats_names)),
            "TJPIPE_LOG_FORMAT": "json",
            "TJPIPE_METRICS_PORT": "9090",
            "TJPIPE_REPLICA_ID": replica,
        }
        if role in ("watcher", "applier"):
            env["KUBECONFIG"] = "/kube/kubeconfig"
        if role in ("watcher", "planner"):
            env["TJPIPE_SIGNING_KEY"] = "/etc/tjpipe/signing/signing.key"
        if role == "planner":
            env["TJPIPE_TRUSTED_EVENT_KEYS"] = "/etc/tjpipe/trusted-events"
        if role == "applier":
            env["TJPIPE_TRUSTED_PLAN_KEYS"] = "/etc/tjpipe/trusted-plans"
        return env

    def bus_setup(self, *, timeout: float = 180) -> None:
        """``tjpipe bus-setup`` as the admin, in a container: the streams and buckets with one replica per member."""
        self.run_container(
            "bus-setup",
            compose.PROJECT_IMAGE,
            "bus-setup",
            env={k: v for k, v in self.service_env("admin", "bus-setup").items() if k != "TJPIPE_REPLICA_ID"},
            mounts=self._service_files("admin"),
            hardened=True,
            detach=False,
            timeout=timeout,
        )

    def start_service(self, role: str, index: int, *, image: str = compose.PROJECT_IMAGE) -> Container:
        """Replica ``index`` of ``role`` as compose runs it, from ``image`` (another version's, for an upgrade)."""
        replica = f"{role}-{index}"
        return self.run_container(
            replica,
            image,
            role,
            env=self.service_env(role, replica),
            mounts=self._service_files(role),
            hardened=True,
        )

    def services(self, role: str) -> list[Container]:
        return [c for alias, c in sorted(self.containers.items()) if alias.startswith(f"{role}-")]

    def exited_services(self, killed: Iterable[str] = ()) -> list[str]:
        """Services that stopped though nobody stopped them, with their last lines."""
        out = []
        gone = set(killed) | self.killed
        for role in SERVICE_ROLES:
            for c in self.services(role):
                if c.alias not in gone and not c.running():
                    out.append(f"{c.alias} exited with {c.exit_code()}:\n{c.logs(30)}")
        return out


@contextlib.contextmanager
def opened_rig(root: Path) -> Any:
    rig = Rig(root=root)
    try:
        yield rig.open()
    finally:
        rig.close()
