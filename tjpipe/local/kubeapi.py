"""A real kube-apiserver with etcd on loopback, the way controller-runtime's envtest runs one.

Why a real apiserver and not a fake: the pipeline's correctness rests on server behaviour that fakes get
wrong or skip: server-side apply field ownership, CRD structural-schema defaulting and validation,
ValidatingAdmissionPolicy, resourceVersion semantics for watches. Without kube-controller-manager or a
scheduler nothing runs, nothing is garbage-collected and namespaces never finish deleting, which is fine
for a control-plane pipeline that only reads and writes API objects.

Why our own CA and a token: the kubeconfig can then carry `certificate-authority` so every client
verifies TLS exactly as it would against a real cluster, and a bearer token in `system:masters` keeps
the kubeconfig a plain text file with no client-certificate plumbing. Keys are generated per start; the
files under `work_dir` only have to outlive the processes.

Why `--advertise-address` only sometimes: the apiserver picks the address it publishes in the
`default/kubernetes` Endpoints from the interface of the IPv4 default route, and refuses to start
("no default routes found") where there is none, e.g. in a sandbox with only loopback. Only then do we
pass a non-loopback local address, or, if the machine has none, 127.0.0.1: the apiserver accepts that
and serves normally; it merely logs that it cannot write loopback into the Endpoints object, which no
one reads here.

Why a bind address other than loopback at all (``bind_address``): pods of a real node
(``tjpipe.local.realnode``) call the apiserver through the ``kubernetes`` Service, which kube-proxy maps to the
address the apiserver advertises; a pod cannot reach this machine's loopback. The real node binds it to its
bridge's address, which exists on this machine only, and advertises that; everything else keeps loopback.

Why etcd runs with `--unsafe-no-fsync`: the data is throwaway, and fsync latency dominates etcd's write
path on small cloud disks.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import secrets
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from kubernetes import config as kube_config
from kubernetes.client import ApiClient

from tjpipe.keys.pki import private_key_pem, self_signed_ca, serving_certificate
from tjpipe.local.procs import ManagedProcess, free_port, http_ok, http_status, spawn, wait_until
from tjpipe.local.toolchain import ensure_kube_binaries
from tjpipe.private_files import write_private_file

CONTEXT_NAME = "tjpipe-local"
ADMIN_USER = "admin"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"

_SERVICE_ACCOUNT_KEY = "sa.key"  # next to ca.crt in the pki folder
_ETCD_READY_TIMEOUT_SECONDS = 30.0
_APISERVER_READY_TIMEOUT_SECONDS = 90.0


@dataclass(frozen=True)
class LocalKube:
    server: str  # https://127.0.0.1:PORT (or the bind address start_kube was given)
    token: str
    ca_file: Path
    kubeconfig: Path
    processes: tuple[ManagedProcess, ...]
    user_tokens: Mapping[str, str] = field(default_factory=dict)
    """Bearer tokens of the users ``start_kube`` was asked for, by name."""

    @property
    def service_account_private_key(self) -> Path:
        """The key the apiserver signs service-account tokens with (kube-controller-manager signs with it too)."""
        return self.ca_file.parent / _SERVICE_ACCOUNT_KEY

    def api_client(self) -> ApiClient:
        """A fresh `kubernetes.client.ApiClient` for this cluster."""
        return new_api_client(self.kubeconfig)

    def stop(self, timeout: float = 10) -> None:
        """Stop the apiserver before etcd, so it does not spend its shutdown retrying a dead etcd."""
        for process in reversed(self.processes):
            process.stop(timeout=timeout)


def new_api_client(kubeconfig: Path) -> ApiClient:
    """A `kubernetes.client.ApiClient` built from a kubeconfig file, never from global client state."""
    client: ApiClient = kube_config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig)
    )
    return client


def start_kube(
    *,
    work_dir: Path,
    log_dir: Path,
    kubeconfig_path: Path,
    progress: Callable[[str], None],
    extra_apiserver_args: Sequence[str] = (),
    users: Mapping[str, Sequence[str]] | None = None,
    service_account_admission: bool = False,
    bind_address: str = "127.0.0.1",
) -> LocalKube:
    """Start etcd and kube-apiserver (on 127.0.0.1 unless ``bind_address`` says otherwise) and write a kubeconfig.

    ``users`` (name → groups) are people the apiserver knows by a token of their own and RBAC grants
    nothing until a binding does: what a test of authorization needs besides ServiceAccounts.

    ``bind_address``: where the apiserver listens (etcd stays on loopback). Any other address than loopback must
    be one of this machine's own; the apiserver then also advertises it (the ``kubernetes`` Service's endpoint)
    and its serving certificate names it.
    """
    binaries = ensure_kube_binaries(progress=progress)
    started = time.monotonic()
    work_dir.mkdir(parents=True, exist_ok=True)

    etcd_client_port, etcd_peer_port = free_port(), free_port()
    etcd_url = f"http://127.0.0.1:{etcd_client_port}"
    peer_url = f"http://127.0.0.1:{etcd_peer_port}"
    etcd = spawn(
        name="etcd",
        argv=[
            str(binaries.etcd),
            *etcd_flags(data_dir=work_dir / "etcd", client_url=etcd_url, listen_client_url=etcd_url, peer_url=peer_url),
        ],
        log_dir=log_dir,
    )
    processes: list[ManagedProcess] = [etcd]
    try:
        # Key generation overlaps with etcd's startup.
        loopback = ipaddress.ip_address(bind_address).is_loopback
        pki = write_pki(work_dir / "pki", ip_addresses=() if loopback else (bind_address,))
        tokens_file = work_dir / "tokens.csv"
        user_tokens = {name: secrets.token_urlsafe(32) for name in users or {}}
        token = write_token_file(tokens_file, users={n: (user_tokens[n], g) for n, g in (users or {}).items()})
        wait_until(
            lambda: http_ok(f"{etcd_url}/health"),
            timeout=_ETCD_READY_TIMEOUT_SECONDS,
            what=f"etcd health on {etcd_url}",
            process=etcd,
        )

        port = free_port()
        server = f"https://{bind_address}:{port}"
        argv = [
            str(binaries.kube_apiserver),
            *apiserver_flags(
                etcd_url=etcd_url,
                bind_address=bind_address,
                port=port,
                pki=pki,
                tokens_file=tokens_file,
                issuer=f"{server}/",
                service_account_admission=service_account_admission,
            ),
        ]
        advertise_address = _advertise_address_if_needed() if loopback else bind_address
        if advertise_address is not None:
            argv.append(f"--advertise-address={advertise_address}")
        argv.extend(extra_apiserver_args)
        apiserver = spawn(name="kube-apiserver", argv=argv, log_dir=log_dir)
        processes.append(apiserver)

        tls = ssl.create_default_context(cafile=str(pki.ca_cert))
        wait_until(
            lambda: http_status(f"{server}/readyz", tls=tls, token=token) == 200,
            timeout=_APISERVER_READY_TIMEOUT_SECONDS,
            what=f"kube-apiserver /readyz on {server}",
            process=apiserver,
        )
    except BaseException:
        for process in reversed(processes):
            process.stop()
        raise

    write_kubeconfig(kubeconfig_path, server=server, ca_file=pki.ca_cert, token=token)
    elapsed = time.monotonic() - started
    progress(f"kube-apiserver ready at {server} in {elapsed:.1f}s (kubeconfig {kubeconfig_path})")
    return LocalKube(
        server=server,
        token=token,
        ca_file=pki.ca_cert,
        kubeconfig=kubeconfig_path,
        processes=tuple(processes),
        user_tokens=user_tokens,
    )


def etcd_flags(*, data_dir: Path | str, client_url: str, listen_client_url: str, peer_url: str) -> list[str]:
    """etcd's flags, one member (``default``); the local stack and compose run it with these."""
    return [
        "--name=default",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={listen_client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=default={peer_url}",
        "--unsafe-no-fsync=true",
    ]


def apiserver_flags(
    *,
    etcd_url: str,
    bind_address: str,
    port: int,
    pki: ApiserverPki,
    tokens_file: Path | str,
    issuer: str,
    service_account_admission: bool = False,
) -> list[str]:
    """kube-apiserver's flags: TLS from ``pki``, a static token file, RBAC, service-account tokens signed
    with ``pki``'s key; the local stack and compose run it with these.

    The ServiceAccount admission plugin is off unless ``service_account_admission``: without
    kube-controller-manager nobody makes a namespace's ``default`` ServiceAccount, which the plugin requires
    of every pod. With the simulated cluster it is on, as in any cluster: it gives a pod that names no
    ServiceAccount the ``default`` one, which a pod projecting a token needs (Trainer's TrainJobStatus volume;
    the API server refuses such a pod without a ServiceAccount)."""
    return [
        f"--etcd-servers={etcd_url}",
        f"--bind-address={bind_address}",
        f"--secure-port={port}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--allow-privileged=true",
        *(() if service_account_admission else ("--disable-admission-plugins=ServiceAccount",)),
        "--authorization-mode=RBAC",
        f"--token-auth-file={tokens_file}",
        f"--service-account-issuer={issuer}",
        f"--service-account-key-file={pki.service_account_public_key}",
        f"--service-account-signing-key-file={pki.service_account_private_key}",
    ]


def write_token_file(path: Path, *, users: Mapping[str, tuple[str, Sequence[str]]] | None = None) -> str:
    """A fresh admin bearer token (group ``system:masters``) in the apiserver's token file, with a line for each
    of ``users`` (name: its token and groups); returns the admin's token."""
    token = secrets.token_urlsafe(32)
    lines = [f'{token},{ADMIN_USER},{ADMIN_USER},"system:masters"']
    for name, (user_token, groups) in (users or {}).items():
        lines.append(f'{user_token},{name},{name},"{",".join(groups)}"' if groups else f"{user_token},{name},{name}")
    write_private_file(path, "\n".join(lines) + "\n")
    return token


def read_token_file(path: Path) -> str:
    """The admin token ``write_token_file`` wrote."""
    return path.read_text().split(",", 1)[0]


@dataclass(frozen=True)
class ApiserverPki:
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    service_account_private_key: Path
    service_account_public_key: Path


def pki_paths(pki_dir: Path) -> ApiserverPki:
    """Where ``write_pki`` puts each file."""
    return ApiserverPki(
        ca_cert=pki_dir / "ca.crt",
        serving_cert=pki_dir / "apiserver.crt",
        serving_key=pki_dir / "apiserver.key",
        service_account_private_key=pki_dir / _SERVICE_ACCOUNT_KEY,
        service_account_public_key=pki_dir / "sa.pub",
    )


def write_pki(pki_dir: Path, *, dns_names: Sequence[str] = (), ip_addresses: Sequence[str] = ()) -> ApiserverPki:
    """A CA, the apiserver's serving certificate (loopback, the in-cluster names and the ``kubernetes`` Service's
    address, ``dns_names`` and ``ip_addresses``) and the service-account signing key pair, in ``pki_dir``
    (keys 0600)."""
    pki_dir.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=365)

    ca_key, ca_cert = self_signed_ca("tjpipe-local-ca", not_before=not_before, not_after=not_after)

    alternative_names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
        # The first address of the service range is the in-cluster `kubernetes` Service.
        x509.IPAddress(next(ipaddress.IPv4Network(SERVICE_CLUSTER_IP_RANGE).hosts())),
        *(x509.DNSName(name) for name in dns_names),
        *(x509.IPAddress(ipaddress.ip_address(address)) for address in ip_addresses),
    ]
    serving_key, serving_cert = serving_certificate(
        ca_key,
        ca_cert,
        common_name="kube-apiserver",
        names=alternative_names,
        not_before=not_before,
        not_after=not_after,
    )

    service_account_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    pki = pki_paths(pki_dir)
    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pki.serving_cert.write_bytes(serving_cert.public_bytes(serialization.Encoding.PEM))
    write_private_file(pki.serving_key, private_key_pem(serving_key))
    write_private_file(pki.service_account_private_key, private_key_pem(service_account_key))
    pki.service_account_public_key.write_bytes(
        service_account_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def write_kubeconfig(path: Path, *, server: str, ca_file: Path, token: str, embed_ca: bool = False) -> None:
    """A kubeconfig for the admin token; with ``embed_ca`` the CA travels inside it (for another machine's
    or container's view of the same cluster, where the CA file's path means nothing)."""
    cluster: dict[str, str] = {"server": server}
    if embed_ca:
        cluster["certificate-authority-data"] = base64.b64encode(ca_file.read_bytes()).decode()
    else:
        cluster["certificate-authority"] = str(ca_file.resolve())
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CONTEXT_NAME,
                "cluster": cluster,
            }
        ],
        "users": [{"name": ADMIN_USER, "user": {"token": token}}],
        "contexts": [{"name": CONTEXT_NAME, "context": {"cluster": CONTEXT_NAME, "user": ADMIN_USER}}],
        "current-context": CONTEXT_NAME,
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private_file(path, yaml.safe_dump(kubeconfig, sort_keys=False))


def _advertise_address_if_needed() -> str | None:
    """None when the apiserver can derive its address from the IPv4 default route itself."""
    if _has_ipv4_default_route():
        return None
    return next(iter(_local_ipv4_addresses()), "127.0.0.1")


def _has_ipv4_default_route() -> bool:
    route_up = 0x1
    try:
        lines = Path("/proc/net/route").read_text().splitlines()[1:]
    except OSError:
        return True  # not Linux: let the apiserver decide, as it would anyway
    for line in lines:
        fields = line.split()
        if len(fields) >= 4 and fields[1] == "00000000" and int(fields[3], 16) & route_up:
            return True
    return False


def _local_ipv4_addresses() -> list[str]:
    """Non-loopback IPv4 addresses assigned to this host, read from the kernel's local routing table."""
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        return []
    addresses: list[str] = []
    previous = ""
    for line in lines:
        if line.strip() == "/32 host LOCAL" and previous.strip().startswith("|-- "):
            candidate = previous.strip().removeprefix("|-- ")
            if not ipaddress.ip_address(candidate).is_loopback and candidate not in addresses:
                addresses.append(candidate)
        previous = line
    return addresses


def wait_for_api(kubeconfig: Path, *, timeout: float, poll_seconds: float = 2.0) -> None:
    """Until the apiserver a kubeconfig names answers ``/version`` (one that starts beside its caller)."""
    from kubernetes.client import VersionApi

    deadline = time.monotonic() + timeout
    while True:
        try:
            with new_api_client(kubeconfig) as api:
                VersionApi(api).get_code()
            return
        except Exception as error:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the API server in {kubeconfig} did not answer within {timeout:.0f}s") from error
            time.sleep(poll_seconds)
