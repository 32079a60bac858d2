"""Issue #40: the Kubeflow SDK 0.5.0's ``update_trainjob_status``, unchanged, reports a TrainJob's progress to
``tjpipe status-server``, from processes set up as the pods of a TrainJob are.

Each "pod" is a process of its own (the SDK throttles and caches its token per process, as in a real pod) with
the three variables Trainer's plugin injects: the URL of the status endpoint, the CA file and the token file,
a real projected token from the TokenRequest API bound to the pod object (the pod never runs). The series the SDK
reported is then read back from ``tjpipe history-server`` (the JSON the TrainJob's progress chart draws, and the
CSV download). Run in the SDK's own environment (.venv-sdk), as tests/e2e/test_sdk.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from history.support import Server, get, start_server
from status_endpoint.support import (
    StatusServer,
    TrainJobWithPods,
    make_trainjob,
    pod_token,
    records,
    start_status_server,
    trainer_status,
)

from status_server import core
from tjpipe.credentials import Credentials

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(300)]

pytest.importorskip(
    "kubeflow.trainer", reason="the Kubeflow SDK: kubeflow 0.5.0, the sdk extra (bash scripts/bootstrap.sh test,sdk)"
)

_REPORT = """
import json, sys, time
from kubeflow.trainer import update_trainjob_status
calls = json.loads(sys.argv[1])
out = []
for i, call in enumerate(calls):
    if i:
        time.sleep(5.2)  # the SDK sends at most one update per 5 s per process
    out.append(update_trainjob_status(**call))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def server(
    kube: Any, nats_url: str, nats_credentials: Credentials | None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StatusServer]:
    if kube.local is None or nats_credentials is None:
        pytest.skip("needs the session's own kube-apiserver and NATS identities")
    with kube.api_client() as api:
        started = start_status_server(
            api,
            admin_kubeconfig=kube.kubeconfig,
            nats_url=nats_url,
            creds=nats_credentials,
            root=tmp_path_factory.mktemp("sdk-status-server"),
            interval=1.0,
        )
    try:
        yield started
    finally:
        print(started.process.log_tail(30))
        started.stop()


@pytest.fixture(scope="module")
def history(nats_url: str, nats_credentials: Credentials | None, kube: Any, server: StatusServer) -> Iterator[Server]:
    assert nats_credentials is not None  # the server fixture skipped otherwise
    started = start_server(
        nats_url=nats_url,
        reader_creds=nats_credentials.seed_file("reader"),
        kubeconfig=Path(kube.kubeconfig),
        log_dir=server.log_dir.parent / "history-server",
    )
    try:
        yield started
    finally:
        started.process.stop()


def _as_pod(server: StatusServer, api: Any, job: TrainJobWithPods, folder: Path, pod: int = 0) -> dict[str, str]:
    """The environment Trainer's plugin gives the pod's containers, with its projected token in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    token = pod_token(api, job.namespace, pod=job.pods[pod], audience=core.audience(job.namespace, job.name))
    (folder / "token").write_text(token)
    (folder / "ca.crt").write_bytes(server.ca_file.read_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEFLOW_TRAINER_")}
    return env | {
        "KUBEFLOW_TRAINER_SERVER_URL": server.endpoint(job.namespace, job.name),
        "KUBEFLOW_TRAINER_SERVER_CA_CERT": str(folder / "ca.crt"),
        "KUBEFLOW_TRAINER_SERVER_TOKEN": str(folder / "token"),
    }


def _report(env: dict[str, str], *calls: dict[str, Any]) -> list[bool]:
    done = subprocess.run(
        [sys.executable, "-c", _REPORT, json.dumps(list(calls))],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: list[bool] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_sdk_reports_progress_and_the_trainjob_and_the_history_show_it(
    server: StatusServer, history: Server, kube: Any, namespace: str, tmp_path: Path
) -> None:
    with kube.api_client() as api:
        job = make_trainjob(api, namespace, "sdk-progress", pods=2)
        pod0 = _as_pod(server, api, job, tmp_path / "pod0", 0)
        pod1 = _as_pod(server, api, job, tmp_path / "pod1", 1)
        first = {"progress_percent": 10, "estimated_remaining_seconds": 90, "metrics": {"loss": 0.9, "epoch": 1}}
        second = {"progress_percent": 55, "estimated_remaining_seconds": 40, "metrics": {"loss": 0.4, "epoch": 5}}
        assert _report(pod0, first, second) == [True, True]
        assert _report(pod1, {"progress_percent": 50, "metrics": {"loss": 0.45}}) == [True]

        def shown() -> bool:
            status, _ = trainer_status(api, namespace, job.name)
            return status is not None and status.get("progressPercentage") == 50

        deadline = time.monotonic() + 15
        while not shown():
            assert time.monotonic() < deadline, trainer_status(api, namespace, job.name)
            time.sleep(0.3)
        status, managers = trainer_status(api, namespace, job.name)
        assert managers == ["trainer-status"]
        assert status is not None and status["metrics"] == [{"name": "loss", "value": "0.45"}]

    recorded = records(server.env["NATS_URL"], server_creds(server), namespace, job.name)
    assert [r.trainer_status.progress_percentage for r in sorted(recorded, key=lambda r: r.updated_at)] == [10, 55, 50]
    assert {r.pod for r in recorded} == {job.pods[0].name, job.pods[1].name}

    # The history server's series, as the admin reads it: every update, in the order the status server took them.
    series = f"{history.url}/api/v1/namespaces/{namespace}/trainjobs/{job.name}/progress"
    code, body, _ = get(series, kube.local.token)
    assert code == 200, body[:300]
    points = json.loads(body)["points"]
    assert [(p["progressPercentage"], p["metrics"].get("loss")) for p in points] == [
        (10, "0.9"),
        (55, "0.4"),
        (50, "0.45"),
    ]
    code, body, headers = get(series + "?output=csv", kube.local.token)
    rows = body.decode().splitlines()
    assert code == 200 and headers["Content-Type"].startswith("text/csv"), code
    assert len(rows) == 4 and {"loss", "epoch"} <= set(rows[0].split(",")), rows[0]


def test_with_the_server_down_the_sdk_returns_false_and_the_next_update_lands(
    server: StatusServer, kube: Any, namespace: str, tmp_path: Path
) -> None:
    with kube.api_client() as api:
        job = make_trainjob(api, namespace, "sdk-outage")
        env = _as_pod(server, api, job, tmp_path / "pod")
        server.stop()
        try:
            assert _report(env, {"progress_percent": 30}) == [False]  # no exception: training goes on
        finally:
            server.restart()
        assert trainer_status(api, namespace, job.name)[0] is None
        assert _report(env, {"progress_percent": 35}) == [True]
        deadline = time.monotonic() + 15
        while (trainer_status(api, namespace, job.name)[0] or {}).get("progressPercentage") != 35:
            assert time.monotonic() < deadline
            time.sleep(0.3)


def test_outside_a_trainjob_the_sdk_returns_false(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEFLOW_TRAINER_")}
    assert _report(env, {"progress_percent": 1}) == [False]


def server_creds(server: StatusServer) -> Credentials:
    return Credentials(Path(server.env["NATS_CREDS"]).parent)
