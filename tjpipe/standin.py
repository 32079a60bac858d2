"""The demo's stand-in for training code: the Kubeflow SDK's own ``update_trainjob_status``, called for each running
pod of a demo TrainJob as that pod's training code would call it.

Why a stand-in: on the simulated cluster no container runs, so nothing would ever report progress. The stand-in
runs beside the stack, on the host, one process per running pod (the SDK throttles and caches its token per
process, as in a pod), with the pod's own environment: the status server's URL the planner gave the pod, the CA
of the pod's ``<trainjob>-tls-config`` ConfigMap, and a real projected token, requested from the TokenRequest API
for the pod's ServiceAccount with the audience of the pod's projected volume and bound to the pod object. It
reports a progress that moves with the pod's run time, a falling loss and an ETA, until the pod ends. It is not
training: it is what training code would send, so that the demo shows the status server, the history and
``status.trainerStatus`` at work.

The SDK (``kubeflow`` 0.5.0) needs an older Kubernetes client than the project's own, so it usually lives in an
environment of its own (``.venv-sdk``, ``bash scripts/bootstrap.sh sdk``); the stand-in runs its reports with
that environment's interpreter (:func:`sdk_python`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as kube_client
from kubernetes.client import ApiClient

from tjpipe.private_files import write_private_file

URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
CA_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"
RUN_TIME_ANNOTATION = "sim.tjpipe.local/run-time"
_JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"

_REPORTER = r"""
import math, sys, time
from kubeflow.trainer import update_trainjob_status

# Training code sends its last report as it finishes; the SDK lets one call through every 5 s, so the stand-in
# reaches 100 % one throttle window (and a second of slack) before the pod ends, sends it, and stops.
seconds = max(float(sys.argv[1]) - 6.0, 1.0)
started = time.monotonic() - float(sys.argv[2])  # the pod started that long ago
while True:
    done = min((time.monotonic() - started) / seconds, 1.0)
    sent = update_trainjob_status(  # False while the SDK's 5 s throttle holds; the next call then goes out
        progress_percent=int(done * 100),
        estimated_remaining_seconds=int(max(0.0, seconds * (1 - done))),
        metrics={"loss": f"{2.3 * math.exp(-3 * done) + 0.05:.4f}", "epoch": str(1 + int(done * 4.999))},
    )
    if sent and done >= 1.0:
        break
    time.sleep(0.5)
"""


def sdk_python(repo: Path | None = None) -> str | None:
    """An interpreter that imports the Kubeflow SDK: this one, else the checkout's ``.venv-sdk``; None: neither."""
    candidates = [sys.executable]
    root = repo or Path(__file__).resolve().parents[1]
    candidates.append(str(root / ".venv-sdk" / "bin" / "python"))
    for python in candidates:
        if not Path(python).exists():
            continue
        probe = subprocess.run([python, "-c", "import kubeflow.trainer"], capture_output=True, timeout=60, check=False)
        if probe.returncode == 0:
            return python
    return None


def go_duration_seconds(text: str) -> float | None:
    """``90s``, ``2m``, ``1h``, ``1m30s`` (a Go duration, as the simulated nodes read the annotation)."""
    import re

    parts = re.findall(r"(\d+(?:\.\d+)?)(h|m|s|ms)", text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        return None
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


@dataclass
class _Report:
    process: subprocess.Popen[bytes]
    folder: Path


class TrainingStandIn:
    """Keeps one SDK reporter running per running pod of one TrainJob; ``poll`` starts and stops them."""

    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        name: str,
        *,
        python: str,
        folder: Path,
        default_seconds: float,
        say: Callable[[str], None],
    ) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.python, self.folder, self.default_seconds, self.say = python, folder, default_seconds, say
        self.reports: dict[str, _Report] = {}
        self.started = 0

    def poll(self) -> None:
        core = kube_client.CoreV1Api(self.api)
        pods: Any = core.list_namespaced_pod(self.namespace, label_selector=f"{_JOBSET_NAME_LABEL}={self.name}")
        running = {p.metadata.uid: p for p in pods.items if (p.status.phase or "") == "Running"}
        for uid in [u for u in self.reports if u not in running]:
            self._stop(uid)
        for uid, pod in running.items():
            if uid not in self.reports:
                self._start(core, pod)

    def close(self) -> None:
        for uid in list(self.reports):
            self._stop(uid)

    def _start(self, core: kube_client.CoreV1Api, pod: Any) -> None:
        container = next((c for c in pod.spec.containers if any(e.name == URL_ENV for e in c.env or [])), None)
        if container is None:
            return  # not a trainer pod, or TrainJobStatus is off: nothing to report
        url = next(e.value for e in container.env if e.name == URL_ENV)
        audience, seconds = projected_token(pod)
        if audience is None:
            return
        folder = self.folder / pod.metadata.name
        folder.mkdir(parents=True, exist_ok=True)
        tls = core.read_namespaced_config_map(f"{self.name}-tls-config", self.namespace)
        (folder / "ca.crt").write_text((tls.data or {}).get("ca.crt", ""))
        token = pod_token(core, pod, audience, seconds=seconds)
        if token is None:
            return
        write_private_file(folder / "token", token)
        run_time = go_duration_seconds((pod.metadata.annotations or {}).get(RUN_TIME_ANNOTATION, "")) or 0
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEFLOW_TRAINER_")}
        env |= {URL_ENV: url, CA_ENV: str(folder / "ca.crt"), TOKEN_ENV: str(folder / "token")}
        log = (folder / "report.log").open("ab")
        process = subprocess.Popen(
            [self.python, "-c", _REPORTER, str(run_time or self.default_seconds), f"{_running_for(pod):.1f}"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.reports[pod.metadata.uid] = _Report(process=process, folder=folder)
        self.started += 1

    def _stop(self, uid: str) -> None:
        report = self.reports.pop(uid)
        if report.process.poll() is None:
            report.process.terminate()
            try:
                report.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                report.process.kill()
                report.process.wait(timeout=5)


def _running_for(pod: Any) -> float:
    """Seconds since the pod started (its ``status.startTime``); 0 when it does not say."""
    import datetime as dt

    started = pod.status.start_time
    if started is None:
        return 0.0
    elapsed: float = (dt.datetime.now(dt.UTC) - started).total_seconds()
    return max(0.0, elapsed)


def pod_token(core: kube_client.CoreV1Api, pod: Any, audience: str, *, seconds: int = 3600) -> str | None:
    """The token the kubelet would project into ``pod``: from the TokenRequest API, for the pod's ServiceAccount,
    with ``audience``, valid ``seconds``, and bound to the pod object (name and uid), so the API server honours it
    only while that very pod exists. None when the API server hands back no token. Never logged."""
    spec = kube_client.V1TokenRequestSpec(
        audiences=[audience],
        expiration_seconds=seconds,
        bound_object_ref=kube_client.V1BoundObjectReference(
            api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid
        ),
    )
    account = pod.spec.service_account_name or "default"
    answer = core.create_namespaced_service_account_token(
        account, pod.metadata.namespace, kube_client.AuthenticationV1TokenRequest(spec=spec)
    )
    if answer.status is None or not answer.status.token:
        return None
    return str(answer.status.token)


def projected_token(pod: Any) -> tuple[str | None, int]:
    """The audience and lifetime of the pod's projected ServiceAccount token (Trainer's plugin's volume)."""
    for volume in pod.spec.volumes or []:
        projected = volume.projected
        for source in (projected.sources or []) if projected else []:
            token = source.service_account_token
            if token is not None and token.audience:
                return token.audience, int(token.expiration_seconds or 3600)
    return None, 3600
