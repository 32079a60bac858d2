"""A TrainJob's history recorded the way the pipeline records it, and the history server as a subprocess."""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from contracts import subjects
from contracts.messages import ApplyResult, DeadLetter, ObjectKey, TrainJobObserved, component_of, encode
from contracts.trainer import TrainingRuntime, TrainJob
from planner.core import plan
from tjpipe.local import crds
from tjpipe.local.procs import ManagedProcess, free_port, spawn, wait_until
from tjpipe.local.stack import demo_trainjob

T = TypeVar("T")


def run_async(coroutine: Callable[[], Awaitable[T]]) -> T:
    """Run async set-up from a sync fixture, on its own loop in its own thread."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine()).result()  # type: ignore[arg-type]


@dataclass(frozen=True)
class Recorded:
    namespace: str
    name: str
    event_seqs: tuple[int, ...]
    """The two events, created and then scaled from 4 to 2 nodes, whose plans differ."""


def _event(namespace: str, name: str, *, nodes: int, status: dict[str, Any] | None, rv: str) -> TrainJobObserved:
    job = copy.deepcopy(demo_trainjob())
    job["metadata"] = {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}", "resourceVersion": rv}
    job["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    job["spec"]["trainer"]["numNodes"] = nodes
    if status is not None:
        job["status"] = status
    runtime = crds.shipped_runtimes()["torch-distributed"]
    return TrainJobObserved(
        trainjob=msgspec.convert(job, TrainJob),
        runtime=msgspec.convert(runtime, TrainingRuntime),
        runtime_source="live",
        observed_at=time.time(),
        cause="TrainJob ADDED" if status is None else "TrainJob MODIFIED",
    )


async def record(js: Any, namespace: str, name: str) -> Recorded:
    """Two events with their plans and results, and a dead letter of the second plan's JobSet."""
    seqs = []
    running = {"jobsStatus": [{"name": "node", "active": 2}]}
    for nodes, status, rv in ((4, None, "1"), (2, running, "2")):
        event = _event(namespace, name, nodes=nodes, status=status, rv=rv)
        seq = (await js.publish(subjects.event_subject(namespace, name), encode(event))).seq
        seqs.append(seq)
        for message in plan(event, source_seq=seq).applies:
            component = component_of(message)
            await js.publish(subjects.apply_subject(namespace, name, component), encode(message))
            if component == "jobset" and status is not None:
                letter = DeadLetter(
                    stage="applier",
                    reason="permanent",
                    error="JobSet.jobset.x-k8s.io is invalid: spec.replicatedJobs: field is immutable",
                    subject=subjects.apply_subject(namespace, name, component),
                    payload=encode(message),
                    dead_at=time.time(),
                )
                await js.publish(subjects.dlq_subject("applier", namespace, name), encode(letter))
                continue
            result = ApplyResult(
                trainjob=ObjectKey(namespace=namespace, name=name),
                target=message.target,
                component=component,
                source_seq=seq,
                action="created" if status is None else "unchanged",
                attempts=1,
                duration_ms=9.0,
                finished_at=time.time(),
            )
            await js.publish(subjects.result_subject(namespace, name, component), encode(result))
    return Recorded(namespace=namespace, name=name, event_seqs=tuple(seqs))


@dataclass
class Server:
    url: str
    process: ManagedProcess
    log: Path


def start_server(
    *, nats_url: str, reader_creds: Path, kubeconfig: Path, log_dir: Path, extra: tuple[str, ...] = ()
) -> Server:
    port = free_port()
    process = spawn(
        name=f"history-server-{port}",
        argv=[
            sys.executable,
            "-m",
            "tjpipe",
            "history-server",
            "--listen",
            f"127.0.0.1:{port}",
            "--refresh-seconds",
            "0.5",
            "--log-format",
            "json",
            *extra,
        ],
        log_dir=log_dir,
        env={"NATS_URL": nats_url, "NATS_CREDS": str(reader_creds), "KUBECONFIG": str(kubeconfig)},
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: get(f"{url}/readyz")[0] == 200, timeout=60, what="history-server /readyz", process=process)
    return Server(url=url, process=process, log=process.log_path)


def get(url: str, token: str | None = None) -> tuple[int, bytes, dict[str, str]]:
    """Status, body and headers of a GET (an error status is an answer, not an exception)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)
    except (urllib.error.URLError, OSError):
        return 0, b"", {}


CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def browser(
    tmp: Path, *, width: int = 1280, height: int = 900, phone: bool = False, arguments: tuple[str, ...] = ()
) -> Any:
    """Debian's Chromium, headless, driven by its chromedriver, with a profile of its own and nothing that
    calls out (updates, sync, background networking); skips the test where either is not installed.

    ``phone``: the page is laid out as on a phone's screen of ``width`` CSS pixels (a headless window is
    never narrower than 500). ``arguments``: more of Chromium's flags."""
    import shutil

    from needs import unavailable

    chromium = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    driver = shutil.which("chromedriver") or (CHROMEDRIVER if Path(CHROMEDRIVER).exists() else None)
    if chromium is None or driver is None:
        unavailable("needs chromium and chromium-driver (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp / 'chromium-profile'}",
        f"--window-size={width},{height}",
        *arguments,
    ):
        options.add_argument(argument)
    if phone:
        metrics = {"width": width, "height": height, "pixelRatio": 2.0, "touch": True}
        options.add_experimental_option("mobileEmulation", {"deviceMetrics": metrics})
    return webdriver.Chrome(service=Service(driver), options=options)


def log_in(driver: Any, url: str, token: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url + "/")
    WebDriverWait(driver, 20).until(ec.visibility_of_element_located((By.ID, "token"))).send_keys(token)
    driver.find_element(By.ID, "login").click()
    WebDriverWait(driver, 20).until(ec.visibility_of_element_located((By.ID, "nav")))


def listed_trainjobs(driver: Any) -> list[tuple[str, str]]:
    """The TrainJob list's rows, (namespace, name), read in one script call: the list renders itself again as it
    refreshes, so rows found first and read one by one after can be gone by then."""
    rows: list[list[str]] = driver.execute_script(
        "return Array.from(document.querySelectorAll('#trainjobs tbody tr'),"
        " r => [r.getAttribute('data-namespace'), r.getAttribute('data-name')])"
    )
    return [(namespace, name) for namespace, name in rows]


def screenshot(driver: Any, name: str, folder: Path) -> Path:
    """A PNG of the page; also into ``TJPIPE_SCREENSHOTS`` when set (tools/screenshots.sh: the docs' pictures)."""
    import os

    path = folder / f"{name}.png"
    driver.save_screenshot(str(path))
    extra = os.environ.get("TJPIPE_SCREENSHOTS")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(extra) / f"{name}.png"))
    assert path.stat().st_size > 10_000
    return path
