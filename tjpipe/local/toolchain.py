"""Build kube-apiserver and etcd from their Go modules, once per machine, into a user cache.

Why build instead of download: the project must not depend on a third party's release tarballs or a
container engine, and the Go module proxy plus a Go toolchain are the only things a developer machine is
guaranteed to have for this. Building from the exact upstream tags gives binaries that behave like the
official ones (same pinned dependencies, same GODEBUG defaults), and a `-X` version stamp makes
`/version` report the real release.

Why a wrapper module per binary: `k8s.io/kubernetes` requires its staging modules at v0.0.0 and resolves
them with `replace` lines that Go ignores in a dependency, so we regenerate those replaces (pointing at
the published `v0.<minor>.<patch>` tags) from the tag's own go.mod instead of hard-coding a list that
changes every release. etcd gets its own module because sharing one would let minimal version selection
raise dependencies that the two projects pin differently. We never run `go mod tidy` or `go get -u`: both
move dependencies away from what upstream tested.

Why a file lock: a test session and `tjpipe up` may start at the same time on a cold machine; the lock
makes the second caller wait for the first build and then reuse its result instead of building twice.
"""

from __future__ import annotations

import collections
import fcntl
import functools
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "1.36.3"
ETCD_VERSION = "3.6.8"

_KUBERNETES_MODULE = "k8s.io/kubernetes"
_KUBE_APISERVER_PACKAGE = "k8s.io/kubernetes/cmd/kube-apiserver"
_ETCD_MODULE = "go.etcd.io/etcd/server/v3"

# Seconds between two forwarded "go: downloading"/"compiled" lines, and of silence before a heartbeat.
_PROGRESS_THROTTLE_SECONDS = 2.0
_HEARTBEAT_SECONDS = 30.0
_OUTPUT_TAIL_LINES = 40
_INSTALL_GO = (
    "install Go 1.26 or newer (https://go.dev/doc/install), or adopt an existing cluster: tjpipe up --kubeconfig PATH."
)


class ToolchainMissing(RuntimeError):
    """A binary has to be built but there is no `go` command on PATH."""


@dataclass(frozen=True)
class KubeBinaries:
    kube_apiserver: Path
    etcd: Path


def cache_root() -> Path:
    """Where built binaries and build scratch space live; survives between runs on purpose."""
    configured = os.environ.get("TJPIPE_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "trainjob-pipeline"


def kube_apiserver_path() -> Path:
    return cache_root() / "bin" / f"kube-apiserver-v{KUBERNETES_VERSION}" / "kube-apiserver"


def etcd_path() -> Path:
    return cache_root() / "bin" / f"etcd-v{ETCD_VERSION}" / "etcd"


def ensure_kube_binaries(*, progress: Callable[[str], None]) -> KubeBinaries:
    """Return cached kube-apiserver and etcd binaries, building whichever is missing first."""
    binaries = KubeBinaries(kube_apiserver=kube_apiserver_path(), etcd=etcd_path())
    missing = _missing_binaries(binaries)
    if not missing:
        return binaries
    verb = "are" if len(missing) > 1 else "is"
    go = _go_command(missing=f"{' and '.join(missing)} {verb} not built yet")
    lock_path = cache_root() / "bin" / ".build.lock"
    with _exclusive_file_lock(lock_path, progress=progress):
        # Another process may have finished the build while we waited for the lock.
        if not _is_executable(binaries.kube_apiserver):
            _build_kube_apiserver(go=go, output=binaries.kube_apiserver, progress=progress)
        if not _is_executable(binaries.etcd):
            _build_etcd(go=go, output=binaries.etcd, progress=progress)
    return binaries


def kubectl_path() -> Path:
    return cache_root() / "bin" / f"kubectl-v{KUBERNETES_VERSION}" / "kubectl"


def ensure_kubectl(*, progress: Callable[[str], None]) -> Path:
    """The cached kubectl of the same Kubernetes release as the local kube-apiserver, built first if missing.

    For what runs the documentation's install commands as a user would (``tests/docs/test_install.py``): a
    kubectl of the machine's, if any, is of whatever version it is; this one is known.
    """
    output = kubectl_path()
    if _is_executable(output):
        return output
    go = _go_command(missing="kubectl is not built yet")
    with _exclusive_file_lock(cache_root() / "bin" / ".kubectl.lock", progress=progress):
        if not _is_executable(output):
            _build_kubernetes_commands(
                go=go, outputs={"kubectl": output}, estimate="about 3 min on 2 cores", progress=progress
            )
    return output


MANIFESTS_ENV = "TJPIPE_MANIFESTS_DIR"
"""A folder of module files exported ahead of time (``tjpipe.local.compose.export_manifests``): an image
without Go reads the CRDs, runtimes and webhook manifests from there instead of the module cache."""


def exported_manifests_dir() -> Path | None:
    configured = os.environ.get(MANIFESTS_ENV)
    return Path(configured) if configured else None


def exported_module_dir(root: Path, path: str, version: str) -> Path:
    """Where ``export_manifests`` puts (part of) a module version under ``root``."""
    return root / "modules" / f"{path}@{version}"


def generated_crds_subdir(module: str, version: str, package: str) -> Path:
    """The relative folder ``generated_crds_dir`` keeps one package's generated CRDs in."""
    return Path(f"{module.replace('/', '_')}@{version}") / package.replace("/", "_")


@functools.cache
def go_module_dir(path: str, version: str) -> Path:
    """Directory of a module version in the Go module cache, downloading it if needed (or, where
    ``TJPIPE_MANIFESTS_DIR`` is set, the exported copy there)."""
    exported = exported_manifests_dir()
    if exported is not None:
        return exported_module_dir(exported, path, version)
    go = _go_command(missing=f"reading {path}@{version} needs the Go module cache")
    with tempfile.TemporaryDirectory(prefix="tjpipe-gomod-") as scratch:
        completed = subprocess.run(
            [go, "mod", "download", "-json", f"{path}@{version}"],
            cwd=scratch,
            env=_go_environment(),
            capture_output=True,
            text=True,
            check=False,
        )
    try:
        answer = json.loads(completed.stdout)
    except json.JSONDecodeError:
        answer = {}
    if completed.returncode != 0 or "Dir" not in answer:
        detail = answer.get("Error") or completed.stderr.strip() or completed.stdout.strip()
        raise RuntimeError(f"go mod download {path}@{version} failed: {detail}")
    return Path(answer["Dir"])


def _missing_binaries(binaries: KubeBinaries) -> list[str]:
    missing = []
    if not _is_executable(binaries.kube_apiserver):
        missing.append("kube-apiserver")
    if not _is_executable(binaries.etcd):
        missing.append("etcd")
    return missing


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _go_command(*, missing: str) -> str:
    """The `go` executable; `missing` is the sentence's subject when there is none."""
    go = shutil.which("go")
    if go is None:
        raise ToolchainMissing(f"{missing} and no Go toolchain was found: {_INSTALL_GO}")
    return go


def _go_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # A go.work or vendor directory around the caller must not leak into our wrapper modules.
    env["GOWORK"] = "off"
    env["GOFLAGS"] = " ".join(flag for flag in (env.get("GOFLAGS", ""), "-mod=mod") if flag)
    if extra:
        env.update(extra)
    return env


@contextmanager
def _exclusive_file_lock(lock_path: Path, *, progress: Callable[[str], None]) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"another process is building the Kubernetes binaries; waiting for {lock_path}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fresh_build_dir(name: str) -> Path:
    build_dir = cache_root() / "build" / name
    shutil.rmtree(build_dir, ignore_errors=True)
    build_dir.mkdir(parents=True)
    return build_dir


def _build_kube_apiserver(*, go: str, output: Path, progress: Callable[[str], None]) -> None:
    _build_kubernetes_commands(
        go=go, outputs={"kube-apiserver": output}, estimate="about 5 min on 2 cores", progress=progress
    )


def _build_kubernetes_commands(
    *, go: str, outputs: Mapping[str, Path], estimate: str, progress: Callable[[str], None]
) -> None:
    """Build ``k8s.io/kubernetes/cmd/<name>`` for every name in ``outputs`` from one wrapper module.

    One wrapper for several commands means one dependency resolution and one shared build cache: the
    commands of one release pin the same modules, so building them together changes nothing they link.
    """
    version = f"v{KUBERNETES_VERSION}"
    minor = KUBERNETES_VERSION.split(".")[1]
    # Staging modules are published as v0.<minor>.<patch> alongside every v1.<minor>.<patch> tag.
    staging_version = "v0." + KUBERNETES_VERSION.split(".", 1)[1]
    names = list(outputs)
    what = " and ".join(names)
    started = time.monotonic()
    progress(f"building {what} {version} from Go modules (first time only; {estimate})…")
    module_dir = _fresh_build_dir(f"{'+'.join(names)}-{version}")
    _run_go([go, "mod", "init", f"local/tjpipe-{names[0]}"], cwd=module_dir, progress=progress)

    progress(f"reading {_KUBERNETES_MODULE}@{version}'s go.mod for its staging modules")
    downloaded = _run_go(
        [go, "mod", "download", "-json", f"{_KUBERNETES_MODULE}@{version}"], cwd=module_dir, progress=progress
    )
    upstream_go_mod = json.loads(downloaded)["GoMod"]
    upstream_json = _run_go([go, "mod", "edit", "-json", upstream_go_mod], cwd=module_dir, progress=progress)
    upstream = json.loads(upstream_json)
    edits = [
        f"-replace={requirement['Path']}={requirement['Path']}@{staging_version}"
        for requirement in upstream.get("Require") or []
        if requirement["Version"] == "v0.0.0" and requirement["Path"].startswith("k8s.io/")
    ]
    edits += [f"-godebug={entry['Key']}={entry['Value']}" for entry in upstream.get("Godebug") or []]
    if edits:
        _run_go([go, "mod", "edit", *edits], cwd=module_dir, progress=progress)

    packages = [f"{_KUBERNETES_MODULE}/cmd/{name}" for name in names]
    progress(f"resolving {', '.join(packages)} at {version} (downloads modules on a cold cache)")
    _run_go([go, "get", *(f"{package}@{version}" for package in packages)], cwd=module_dir, progress=progress)

    ldflags = " ".join(
        [
            "-s -w",
            f"-X k8s.io/component-base/version.gitVersion={version}",
            "-X k8s.io/component-base/version.gitMajor=1",
            f"-X k8s.io/component-base/version.gitMinor={minor}",
        ]
    )
    for name, package in zip(names, packages, strict=True):
        progress(f"compiling {name} (a link step needs ~2-3 GB of RAM)")
        _go_build(
            go=go,
            module_dir=module_dir,
            package=package,
            ldflags=ldflags,
            output=outputs[name],
            progress=progress,
        )
    shutil.rmtree(module_dir, ignore_errors=True)  # kept only when a step fails, for inspection
    progress(f"{what} {version} built in {time.monotonic() - started:.0f}s: {', '.join(map(str, outputs.values()))}")


def _build_etcd(*, go: str, output: Path, progress: Callable[[str], None]) -> None:
    # etcd is checked and built together with kube-apiserver, from a wrapper module of its own.
    _build_in_wrapper_module(
        go=go,
        what="etcd",
        name="etcd",
        module=_ETCD_MODULE,
        version=f"v{ETCD_VERSION}",
        ldflags="-s -w",
        output=output,
        progress=progress,
    )


def _build_in_wrapper_module(
    *,
    go: str,
    what: str,
    name: str,
    module: str,
    version: str,
    ldflags: str,
    output: Path,
    progress: Callable[[str], None],
    package: str | None = None,
) -> None:
    """Build a main package of ``module`` at ``version`` in a wrapper module of its own.

    ``package`` is the main package's import path (default: the module root). ``go get`` into an empty
    wrapper lets minimal version selection keep exactly the dependencies the release pins, which is
    what building from that project's own module means. A wrapper ignores the module's own ``replace``
    lines, so this suits modules whose replaces only point at sibling modules of the same release
    (etcd) or that have none (JobSet v0.12.0, Trainer v2.3.0).
    """
    main_package = package or module
    started = time.monotonic()
    progress(f"building {what} {version} from Go modules (first time only, a few minutes)…")
    module_dir = _fresh_build_dir(f"{name}-{version}")
    _run_go([go, "mod", "init", f"local/tjpipe-{name}"], cwd=module_dir, progress=progress)
    _run_go([go, "get", f"{main_package}@{version}"], cwd=module_dir, progress=progress)
    _go_build(go=go, module_dir=module_dir, package=main_package, ldflags=ldflags, output=output, progress=progress)
    shutil.rmtree(module_dir, ignore_errors=True)  # kept only when a step fails, for inspection
    progress(f"{what} {version} built in {time.monotonic() - started:.0f}s: {output}")


def _go_build(
    *,
    go: str,
    module_dir: Path,
    package: str,
    ldflags: str,
    output: Path,
    progress: Callable[[str], None],
    cgo: bool = False,
    tags: Sequence[str] = (),
) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    partial_output = output.with_name(f".{output.name}.partial-{os.getpid()}")
    tag_flags = ["-tags", ",".join(tags)] if tags else []
    try:
        _run_go(
            [go, "build", "-v", "-trimpath", *tag_flags, "-ldflags", ldflags, "-o", str(partial_output), package],
            cwd=module_dir,
            progress=progress,
            extra_env={"CGO_ENABLED": "1" if cgo else "0"},
        )
        os.replace(partial_output, output)
    finally:
        partial_output.unlink(missing_ok=True)


def _run_go(
    argv: Sequence[str],
    *,
    cwd: Path,
    progress: Callable[[str], None],
    extra_env: Mapping[str, str] | None = None,
) -> str:
    """Run one go command, forwarding its stderr to `progress`; return its stdout."""
    process = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=_go_environment(extra_env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    stdout_stream, stderr_stream = process.stdout, process.stderr
    stdout_chunks: list[str] = []
    stderr_lines: queue.Queue[str | None] = queue.Queue()

    def collect_stdout() -> None:
        stdout_chunks.append(stdout_stream.read())

    def pump_stderr() -> None:
        for line in stderr_stream:
            stderr_lines.put(line.rstrip("\n"))
        stderr_lines.put(None)

    stdout_reader = threading.Thread(target=collect_stdout, daemon=True)
    stdout_reader.start()
    threading.Thread(target=pump_stderr, daemon=True).start()
    tail: collections.deque[str] = collections.deque(maxlen=_OUTPUT_TAIL_LINES)
    forwarder = _ThrottledGoOutput(progress)
    started = time.monotonic()
    while True:
        try:
            line = stderr_lines.get(timeout=_HEARTBEAT_SECONDS)
        except queue.Empty:
            progress(f"  … still running {_describe(argv)} ({time.monotonic() - started:.0f}s so far)")
            continue
        if line is None:
            break
        tail.append(line)
        forwarder.forward(line)
    forwarder.flush()
    returncode = process.wait()
    stdout_reader.join()
    stdout = "".join(stdout_chunks)
    if returncode != 0:
        output_tail = "\n".join(tail) or stdout[-4000:]
        raise RuntimeError(f"`{' '.join(argv)}` failed with exit code {returncode} in {cwd}:\n{output_tail}")
    return stdout


def _describe(argv: Sequence[str]) -> str:
    return " ".join(Path(argv[0]).name if index == 0 else part for index, part in enumerate(argv[:3]))


class _ThrottledGoOutput:
    """Forward go's chatter without flooding: downloads and compiled packages are summarised."""

    def __init__(self, progress: Callable[[str], None]) -> None:
        self._progress = progress
        self._last_forwarded = 0.0
        self._downloads = 0
        self._compiled = 0
        self._pending: str | None = None

    def forward(self, line: str) -> None:
        if line.startswith("go: downloading "):
            self._downloads += 1
            latest = line.removeprefix("go: downloading ")
            summary = f"  go: downloaded {self._downloads} modules (latest: {latest})"
        elif line.startswith(("go: added ", "go: upgraded ", "go: finding ")):
            summary = f"  {line}"
        elif line and not line.startswith(("go:", "#", " ", "\t")) and " " not in line:
            # `go build -v` prints one import path per compiled package.
            self._compiled += 1
            summary = f"  compiled {self._compiled} packages (latest: {line})"
        else:
            self.flush()
            self._progress(f"  {line}")
            return
        now = time.monotonic()
        if now - self._last_forwarded >= _PROGRESS_THROTTLE_SECONDS:
            self._progress(summary)
            self._last_forwarded = now
            self._pending = None
        else:
            self._pending = summary

    def flush(self) -> None:
        if self._pending is not None:
            self._progress(self._pending)
            self._pending = None
            self._last_forwarded = time.monotonic()


CONTROLLER_GEN_VERSION = "v0.19.0"
_CONTROLLER_GEN_PACKAGE = "sigs.k8s.io/controller-tools/cmd/controller-gen"


def generated_crds_dir(module: str, version: str, package: str, *, progress: Callable[[str], None]) -> Path:
    """CRDs generated by controller-gen from the API types of ``module@version``, cached by version.

    For projects whose CRD YAML is not in a module the proxy serves (Volcano publishes its API types as
    ``volcano.sh/apis``, its CRDs only in the main repository), the CRD is made from the owner's own types,
    the way the owner's build makes it.
    """
    exported = exported_manifests_dir()
    if exported is not None:
        return exported / "crds" / generated_crds_subdir(module, version, package)
    out = cache_root() / "crds" / generated_crds_subdir(module, version, package)
    if out.is_dir() and any(out.glob("*.yaml")):
        return out
    go = _go_command(missing=f"the CRDs of {module}@{version} are not generated yet")
    with _exclusive_file_lock(cache_root() / "crds" / ".generate.lock", progress=progress):
        if out.is_dir() and any(out.glob("*.yaml")):
            return out
        progress(
            f"generating CRDs from {module}@{version} with controller-gen {CONTROLLER_GEN_VERSION} (first time only)"
        )
        module_dir = _fresh_build_dir(f"crdgen-{module.replace('/', '_')}")
        _run_go([go, "mod", "init", "local/tjpipe-crdgen"], cwd=module_dir, progress=progress)
        _run_go([go, "get", f"{module}@{version}"], cwd=module_dir, progress=progress)
        _run_go([go, "get", f"{_CONTROLLER_GEN_PACKAGE}@{CONTROLLER_GEN_VERSION}"], cwd=module_dir, progress=progress)
        binary = module_dir / "controller-gen"
        _go_build(
            go=go,
            module_dir=module_dir,
            package=_CONTROLLER_GEN_PACKAGE,
            ldflags="-s -w",
            output=binary,
            progress=progress,
        )
        partial = out.with_name(out.name + f".partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        _run_go(
            [str(binary), "crd:crdVersions=v1", f"paths={module}/{package}", f"output:crd:dir={partial}"],
            cwd=module_dir,
            progress=progress,
        )
        shutil.rmtree(out, ignore_errors=True)
        os.replace(partial, out)
        shutil.rmtree(module_dir, ignore_errors=True)
    return out


JOBSET_VERSION = "0.12.0"  # what Kubeflow Trainer v2.3.0 pins
JOBSET_MODULE = "sigs.k8s.io/jobset"


def jobset_manager_path() -> Path:
    return cache_root() / "bin" / f"jobset-v{JOBSET_VERSION}" / "jobset-manager"


def ensure_jobset_manager(*, progress: Callable[[str], None]) -> Path:
    """Return JobSet's controller manager (controllers and admission webhooks), building it once per version.

    Its main package is the module root, built in a wrapper module like etcd.
    """
    version = f"v{JOBSET_VERSION}"
    return _ensure_built_in_wrapper_module(
        output=jobset_manager_path(),
        what="the JobSet manager",
        name="jobset",
        module=JOBSET_MODULE,
        version=version,
        ldflags=f"-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion={version}",
        progress=progress,
    )


def _ensure_built_in_wrapper_module(
    *,
    output: Path,
    what: str,
    name: str,
    module: str,
    version: str,
    ldflags: str,
    progress: Callable[[str], None],
    package: str | None = None,
) -> Path:
    """Return ``output``, building it once (under the shared build lock) from ``module``@``version`` in a
    wrapper module when it is not cached yet; a second process waiting on the lock finds it built."""
    if _is_executable(output):
        return output
    go = _go_command(missing=f"{what} is not built yet")
    with _exclusive_file_lock(cache_root() / "bin" / ".build.lock", progress=progress):
        if _is_executable(output):
            return output
        _build_in_wrapper_module(
            go=go,
            what=what,
            name=name,
            module=module,
            version=version,
            ldflags=ldflags,
            output=output,
            progress=progress,
            package=package,
        )
    return output


TRAINER_VERSION = "2.3.0"  # the release this project rebuilds
TRAINER_MODULE = "github.com/kubeflow/trainer/v2"
_TRAINER_CONTROLLER_PACKAGE = f"{TRAINER_MODULE}/cmd/trainer-controller-manager"


def trainer_controller_path() -> Path:
    return cache_root() / "bin" / f"trainer-v{TRAINER_VERSION}" / "trainer-controller-manager"


def ensure_trainer_controller(*, progress: Callable[[str], None]) -> Path:
    """Return Kubeflow Trainer's own controller manager (controllers and webhooks), building it once per version.

    It is the reference the takeover test and the benchmark compare the pipeline with. Its main package
    is ``cmd/trainer-controller-manager``, built in a wrapper module like etcd (Trainer's go.mod has no
    ``replace`` lines at this tag, so the wrapper resolves exactly what the release pins). Trainer's
    own image build stamps no version, so neither does this one.
    """
    return _ensure_built_in_wrapper_module(
        output=trainer_controller_path(),
        what="Trainer's controller manager",
        name="trainer",
        module=TRAINER_MODULE,
        version=f"v{TRAINER_VERSION}",
        ldflags="-s -w",
        progress=progress,
        package=_TRAINER_CONTROLLER_PACKAGE,
    )


KWOK_VERSION = "0.8.0"
_KWOK_MODULE = "sigs.k8s.io/kwok"


@dataclass(frozen=True)
class ClusterBinaries:
    """What turns the local control plane into a simulated cluster (``tjpipe.local.cluster``)."""

    kube_controller_manager: Path
    kube_scheduler: Path
    kwok: Path


def cluster_binaries_paths() -> ClusterBinaries:
    bin_dir = cache_root() / "bin"
    return ClusterBinaries(
        kube_controller_manager=bin_dir / f"kube-controller-manager-v{KUBERNETES_VERSION}" / "kube-controller-manager",
        kube_scheduler=bin_dir / f"kube-scheduler-v{KUBERNETES_VERSION}" / "kube-scheduler",
        kwok=bin_dir / f"kwok-v{KWOK_VERSION}" / "kwok",
    )


def ensure_cluster_binaries(*, progress: Callable[[str], None]) -> ClusterBinaries:
    """Return cached kube-controller-manager, kube-scheduler (the apiserver's release) and kwok, building
    whichever is missing first.

    The two Kubernetes commands share one wrapper module like kube-apiserver's; kwok's main package is
    ``cmd/kwok`` of its own module, built in a wrapper of its own.
    """
    binaries = cluster_binaries_paths()
    kubernetes = {
        "kube-controller-manager": binaries.kube_controller_manager,
        "kube-scheduler": binaries.kube_scheduler,
    }
    missing = [name for name, path in kubernetes.items() if not _is_executable(path)]
    if not _is_executable(binaries.kwok):
        missing.append("kwok")
    if not missing:
        return binaries
    verb = "are" if len(missing) > 1 else "is"
    go = _go_command(missing=f"{' and '.join(missing)} {verb} not built yet")
    with _exclusive_file_lock(cache_root() / "bin" / ".build.lock", progress=progress):
        # Another process may have finished the build while we waited for the lock.
        still_missing = {name: path for name, path in kubernetes.items() if not _is_executable(path)}
        if still_missing:
            _build_kubernetes_commands(
                go=go, outputs=still_missing, estimate="a few minutes on 2 cores", progress=progress
            )
        if not _is_executable(binaries.kwok):
            version = f"v{KWOK_VERSION}"
            _build_in_wrapper_module(
                go=go,
                what="kwok",
                name="kwok",
                module=_KWOK_MODULE,
                package=f"{_KWOK_MODULE}/cmd/kwok",
                version=version,
                ldflags=f"-s -w -X {_KWOK_MODULE}/pkg/consts.Version={KWOK_VERSION}",
                output=binaries.kwok,
                progress=progress,
            )
    return binaries


# ------------------------------------------------------------------------------------------- a real node

CONTAINERD_VERSION = "2.4.2"
RUNC_VERSION = "1.5.3"
CNI_PLUGINS_VERSION = "1.10.0"
COREDNS_VERSION = "1.15.0"

_CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
_RUNC_MODULE = "github.com/opencontainers/runc"
_CNI_PLUGINS_MODULE = "github.com/containernetworking/plugins"
_COREDNS_MODULE = "github.com/coredns/coredns"

CNI_PLUGINS = {
    "bridge": "plugins/main/bridge",
    "host-local": "plugins/ipam/host-local",
    "loopback": "plugins/main/loopback",
    "portmap": "plugins/meta/portmap",
}
"""The CNI plugins the real node's network uses, by binary name: a bridge on the host with addresses from a
local range, each pod's loopback, and host ports."""


@dataclass(frozen=True)
class NodeBinaries:
    """What makes one real node (``tjpipe.local.realnode``): the kubelet and kube-proxy of the apiserver's
    release, containerd with its runc shim and ``ctr``, runc, the CNI plugins, and CoreDNS."""

    kubelet: Path
    kube_proxy: Path
    containerd: Path
    containerd_shim: Path
    ctr: Path
    runc: Path
    cni_dir: Path
    coredns: Path

    def all(self) -> dict[str, Path]:
        named = {
            "kubelet": self.kubelet,
            "kube-proxy": self.kube_proxy,
            "containerd": self.containerd,
            "containerd-shim-runc-v2": self.containerd_shim,
            "ctr": self.ctr,
            "runc": self.runc,
            "coredns": self.coredns,
        }
        return named | {f"cni {name}": self.cni_dir / name for name in CNI_PLUGINS}


def node_binaries_paths() -> NodeBinaries:
    bin_dir = cache_root() / "bin"
    containerd = bin_dir / f"containerd-v{CONTAINERD_VERSION}"
    return NodeBinaries(
        kubelet=bin_dir / f"kubelet-v{KUBERNETES_VERSION}" / "kubelet",
        kube_proxy=bin_dir / f"kube-proxy-v{KUBERNETES_VERSION}" / "kube-proxy",
        containerd=containerd / "containerd",
        containerd_shim=containerd / "containerd-shim-runc-v2",
        ctr=containerd / "ctr",
        runc=bin_dir / f"runc-v{RUNC_VERSION}-seccomp" / "runc",
        cni_dir=bin_dir / f"cni-plugins-v{CNI_PLUGINS_VERSION}",
        coredns=bin_dir / f"coredns-v{COREDNS_VERSION}" / "coredns",
    )


def ensure_node_binaries(*, progress: Callable[[str], None]) -> NodeBinaries:
    """Return the real node's binaries, building whichever is missing first (each from its own Go module).

    The kubelet and kube-proxy share one wrapper module like the other Kubernetes commands; containerd's
    three commands share another; runc is the one built with cgo (its ``nsenter`` part is C) and with the
    ``seccomp`` tag, linked to the system's libseccomp: containerd gives every pod sandbox a seccomp profile,
    which a runc without seccomp refuses. Its headers must be there to build it (``libseccomp-dev``).
    """
    binaries = node_binaries_paths()
    missing = [name for name, path in binaries.all().items() if not _is_executable(path)]
    if not missing:
        return binaries
    go = _go_command(missing=f"the real node's {', '.join(missing)} not built yet")
    if "runc" in missing and not Path("/usr/include/seccomp.h").exists():
        raise ToolchainMissing("building runc needs libseccomp's headers: apt-get install -y libseccomp-dev")
    with _exclusive_file_lock(cache_root() / "bin" / ".build.lock", progress=progress):
        build_node_binaries(go=go, binaries=binaries, progress=progress)
    return binaries


def build_node_binaries(*, go: str, binaries: NodeBinaries, progress: Callable[[str], None]) -> dict[str, float]:
    """Build what is missing of ``binaries``; the seconds each group took (the cold-build figures)."""
    took: dict[str, float] = {}
    groups: list[tuple[str, str, str, dict[str, tuple[str, Path]], str, Sequence[str] | None]] = [
        (
            "containerd",
            _CONTAINERD_MODULE,
            f"v{CONTAINERD_VERSION}",
            {
                "containerd": (f"{_CONTAINERD_MODULE}/cmd/containerd", binaries.containerd),
                "containerd-shim-runc-v2": (
                    f"{_CONTAINERD_MODULE}/cmd/containerd-shim-runc-v2",
                    binaries.containerd_shim,
                ),
                "ctr": (f"{_CONTAINERD_MODULE}/cmd/ctr", binaries.ctr),
            },
            f"-s -w -X {_CONTAINERD_MODULE}/version.Version=v{CONTAINERD_VERSION} "
            f"-X {_CONTAINERD_MODULE}/version.Package={_CONTAINERD_MODULE}",
            None,
        ),
        (
            "runc",
            _RUNC_MODULE,
            f"v{RUNC_VERSION}",
            {"runc": (_RUNC_MODULE, binaries.runc)},
            f"-s -w -X main.version={RUNC_VERSION}",
            ("seccomp",),  # cgo, with these tags
        ),
        (
            "cni-plugins",
            _CNI_PLUGINS_MODULE,
            f"v{CNI_PLUGINS_VERSION}",
            {
                name: (f"{_CNI_PLUGINS_MODULE}/{package}", binaries.cni_dir / name)
                for name, package in CNI_PLUGINS.items()
            },
            f"-s -w -X {_CNI_PLUGINS_MODULE}/pkg/utils/buildversion.BuildVersion=v{CNI_PLUGINS_VERSION}",
            None,
        ),
        (
            "coredns",
            _COREDNS_MODULE,
            f"v{COREDNS_VERSION}",
            {"coredns": (_COREDNS_MODULE, binaries.coredns)},
            "-s -w",
            None,
        ),
    ]
    for group, module, version, commands, ldflags, cgo_tags in groups:
        wanted = {name: entry for name, entry in commands.items() if not _is_executable(entry[1])}
        if not wanted:
            continue
        started = time.monotonic()
        progress(f"building {', '.join(wanted)} {version} from Go modules (first time only)…")
        module_dir = _fresh_build_dir(f"{group}-{version}")
        _run_go([go, "mod", "init", f"local/tjpipe-{group}"], cwd=module_dir, progress=progress)
        _run_go([go, "get", f"{module}@{version}"], cwd=module_dir, progress=progress)
        for name, (package, output) in wanted.items():
            progress(f"compiling {name}")
            _go_build(
                go=go,
                module_dir=module_dir,
                package=package,
                ldflags=ldflags,
                output=output,
                progress=progress,
                cgo=cgo_tags is not None,
                tags=cgo_tags or (),
            )
        shutil.rmtree(module_dir, ignore_errors=True)
        took[group] = time.monotonic() - started
        progress(f"{', '.join(wanted)} {version} built in {took[group]:.0f}s")
    kubernetes = {"kubelet": binaries.kubelet, "kube-proxy": binaries.kube_proxy}
    still_missing = {name: path for name, path in kubernetes.items() if not _is_executable(path)}
    if still_missing:
        started = time.monotonic()
        _build_kubernetes_commands(
            go=go, outputs=still_missing, estimate="several minutes on 2 cores", progress=progress
        )
        took["kubelet+kube-proxy"] = time.monotonic() - started
    return took
