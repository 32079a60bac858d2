"""What ``tjpipe up`` and ``tjpipe demo`` print while the demo runs: the apply results, the JobSet the demo
TrainJob got, the TrainJob's life, then its clean-up. The CLI only hands its console here.

Why a poller and not a watch: the demo prints a line only when something a user cares about changed (a
condition, jobsStatus, the pods' phases), and a fresh GET every half second is simpler to reason about than
resuming watches across a cluster that is still starting up. Why the demo deletes the TrainJob itself: the
point of the last step is to show that the garbage collector, not the pipeline, removes what the TrainJob
owned (JobSet, ConfigMaps, Secrets) and what they owned in turn (Jobs, Pods).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from kubernetes import dynamic
from kubernetes.client import ApiClient, BatchV1Api, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from rich.markup import escape

from contracts import streams, subjects
from contracts.messages import decode_result
from plumbing import bus, bus_history
from tjpipe.local.kubeapi import new_api_client, wait_for_api

if TYPE_CHECKING:
    from rich.console import Console

_GROUP, _VERSION = "trainer.kubeflow.org", "v1alpha1"
_JOBSET_GROUP, _JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"
_JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
_FINISHED = ("Complete", "Failed")
_SECONDS_BEFORE_DELETE = 2.0


class DemoWatch:
    """Follows one TrainJob: prints its status changes; once it finished, deletes it and reports the cascade.

    ``say`` takes rich markup; every text that comes from the cluster (reasons, messages, names) is escaped.
    """

    def __init__(self, kubeconfig: Path, namespace: str, name: str, *, say: Callable[[str], None]) -> None:
        self.namespace, self.name = namespace, name
        self._say = say
        self._api: ApiClient = new_api_client(kubeconfig)
        self._custom = CustomObjectsApi(self._api)
        self._core = CoreV1Api(self._api)
        self._last: tuple[Any, ...] | None = None
        self._last_pods = ""
        self._last_progress: Any = None
        self._finished_at: float | None = None
        self._owned: dict[str, str] = {}
        """kind/name -> what the demo printed for each object the TrainJob (or its JobSet's Jobs) owned."""
        self.state = "following"
        """following -> deleting -> done"""

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    def poll(self) -> None:
        """One look at the cluster; prints what changed since the last look."""
        try:
            if self.state == "following":
                self._follow()
            elif self.state == "deleting":
                self._watch_cascade()
        except ApiException as error:  # the apiserver may be restarting or going away; try again next time
            if error.status not in (None, 0, 500, 503, 504):
                raise

    # ----------------------------------------------------------------------------------------- following

    def _follow(self) -> None:
        trainjob = self._get_trainjob()
        if trainjob is None:
            return
        status = trainjob.get("status") or {}
        conditions = tuple(
            (c.get("type"), c.get("status"), c.get("reason", ""), c.get("message", ""))
            for c in status.get("conditions") or []
        )
        jobs = tuple(
            (j.get("name"), *(j.get(k, 0) for k in ("active", "ready", "succeeded", "failed", "suspended")))
            for j in status.get("jobsStatus") or []
        )
        if (conditions, jobs) != self._last:
            self._last = (conditions, jobs)
            self._print_status(conditions, jobs)
        progress = status.get("trainerStatus")
        if progress and progress != self._last_progress:
            self._last_progress = progress
            where = escape(f"{self.namespace}/{self.name}")
            self._say(f"  [cyan]progress[/] of {where}: {escape(progress_line(progress))}")
        pods = self._pod_phases()
        if pods and pods != self._last_pods:
            self._last_pods = pods
            self._say(f"  [dim]pods of {self.namespace}/{self.name}:[/] {escape(pods)}")
        finished = [c for c in conditions if c[0] in _FINISHED and c[1] == "True"]
        if finished and self._finished_at is None:
            self._finished_at = time.monotonic()
            self._say(f"[bold green]TrainJob {self.namespace}/{self.name} is {finished[0][0]}[/]")
        if self._finished_at is not None and time.monotonic() - self._finished_at >= _SECONDS_BEFORE_DELETE:
            self._delete(trainjob)

    def _print_status(self, conditions: tuple[Any, ...], jobs: tuple[Any, ...]) -> None:
        self._say(f"[bold]TrainJob {self.namespace}/{self.name}[/] status at {time.strftime('%H:%M:%S')}:")
        if not conditions:
            # Trainer v2.3.0 has no Running condition: a TrainJob that runs shows it in jobsStatus only.
            self._say("  conditions: none (running or about to: see jobsStatus)")
        for kind, value, reason, message in conditions:
            colour = "green" if value == "True" else "dim"
            self._say(
                f"  condition [{colour}]{escape(f'{kind}={value}')}[/] " + escape(f"reason={reason or '-'}: {message}")
            )
        for name, active, ready, succeeded, failed, suspended in jobs:
            self._say(
                escape(
                    f"  jobsStatus {name}: active={active} ready={ready} succeeded={succeeded} "
                    f"failed={failed} suspended={suspended}"
                )
            )

    def _pod_phases(self) -> str:
        pods: Any = self._core.list_namespaced_pod(self.namespace, label_selector=f"{_JOBSET_NAME_LABEL}={self.name}")
        counts: dict[str, int] = {}
        for pod in pods.items:
            phase = pod.status.phase or "Pending"
            counts[phase] = counts.get(phase, 0) + 1
        return ", ".join(f"{count} {phase}" for phase, count in sorted(counts.items()))

    # ------------------------------------------------------------------------------------------ deleting

    def _delete(self, trainjob: dict[str, Any]) -> None:
        uid = trainjob["metadata"]["uid"]
        self._owned = self._owned_objects(uid)
        listed = ", ".join(self._owned) or "nothing"
        self._say(
            f"[bold]deleting TrainJob {self.namespace}/{self.name}[/]; it owns (directly or through them): "
            + escape(listed)
        )
        self._custom.delete_namespaced_custom_object(_GROUP, _VERSION, self.namespace, "trainjobs", self.name)
        self.state = "deleting"

    def _owned_objects(self, trainjob_uid: str) -> dict[str, str]:
        """What the garbage collector is expected to remove: objects owned by the TrainJob, then by those."""
        owned: dict[str, str] = {}
        jobsets: Any = self._custom.list_namespaced_custom_object(
            _JOBSET_GROUP, _JOBSET_VERSION, self.namespace, "jobsets"
        )
        jobset_uids = set()
        for jobset in jobsets["items"]:
            if _owned_by(jobset["metadata"], {trainjob_uid}):
                owned[f"JobSet/{jobset['metadata']['name']}"] = jobset["metadata"]["uid"]
                jobset_uids.add(jobset["metadata"]["uid"])
        configmaps: Any = self._core.list_namespaced_config_map(self.namespace)
        secrets: Any = self._core.list_namespaced_secret(self.namespace)
        for kind, items in (("ConfigMap", configmaps.items), ("Secret", secrets.items)):
            for item in items:
                if _owned_by(item.metadata.to_dict(), {trainjob_uid}):
                    owned[f"{kind}/{item.metadata.name}"] = item.metadata.uid
        jobs: Any = BatchV1Api(self._api).list_namespaced_job(self.namespace)
        job_uids = set()
        for job in jobs.items:
            if _owned_by(job.metadata.to_dict(), jobset_uids):
                owned[f"Job/{job.metadata.name}"] = job.metadata.uid
                job_uids.add(job.metadata.uid)
        pods: Any = self._core.list_namespaced_pod(self.namespace)
        for pod in pods.items:
            if _owned_by(pod.metadata.to_dict(), job_uids):
                owned[f"Pod/{pod.metadata.name}"] = pod.metadata.uid
        return owned

    def _watch_cascade(self) -> None:
        remaining = self._still_there()
        gone = [key for key in self._owned if key not in remaining]
        for key in gone:
            self._say(f"  [green]removed by the garbage collector:[/] {escape(key)}")
            del self._owned[key]
        if not self._owned and self._get_trainjob() is None:
            self._say(f"[green]TrainJob {self.namespace}/{self.name} and everything it owned are gone[/]")
            self.state = "done"

    def _still_there(self) -> set[str]:
        present = set()
        jobsets: Any = self._custom.list_namespaced_custom_object(
            _JOBSET_GROUP, _JOBSET_VERSION, self.namespace, "jobsets"
        )
        present |= {f"JobSet/{j['metadata']['name']}" for j in jobsets["items"]}
        configmaps: Any = self._core.list_namespaced_config_map(self.namespace)
        present |= {f"ConfigMap/{c.metadata.name}" for c in configmaps.items}
        secrets: Any = self._core.list_namespaced_secret(self.namespace)
        present |= {f"Secret/{c.metadata.name}" for c in secrets.items}
        jobs: Any = BatchV1Api(self._api).list_namespaced_job(self.namespace)
        present |= {f"Job/{j.metadata.name}" for j in jobs.items}
        pods: Any = self._core.list_namespaced_pod(self.namespace)
        present |= {f"Pod/{p.metadata.name}" for p in pods.items}
        return present

    def _get_trainjob(self) -> dict[str, Any] | None:
        try:
            trainjob: Any = self._custom.get_namespaced_custom_object(
                _GROUP, _VERSION, self.namespace, "trainjobs", self.name
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return dict(trainjob)


def progress_line(progress: dict[str, Any]) -> str:
    """``status.trainerStatus`` in a line: ``40% · ETA 12s · loss=0.52 epoch=2 · reported 22:40:01Z``."""
    parts = []
    if "progressPercentage" in progress:
        parts.append(f"{progress['progressPercentage']}%")
    if "estimatedRemainingSeconds" in progress:
        parts.append(f"ETA {progress['estimatedRemainingSeconds']}s")
    metrics = " ".join(f"{m.get('name')}={m.get('value')}" for m in progress.get("metrics") or [])
    if metrics:
        parts.append(metrics)
    parts.append(f"reported {str(progress.get('lastUpdatedTime', '?')).partition('T')[2] or '?'}")
    return " · ".join(parts)


def _owned_by(metadata: dict[str, Any], owner_uids: set[str]) -> bool:
    references = metadata.get("ownerReferences") or metadata.get("owner_references") or []
    return any(reference.get("uid") in owner_uids for reference in references)


def wait_until_admitting(kubeconfig: Path, *, timeout: float, say: Callable[[str], None]) -> None:
    """Until the cluster takes the demo: JobSet's webhooks default a JobSet, ``tjpipe webhook`` is called, and
    the simulated nodes are Ready (on a stack whose parts start side by side, as compose's do)."""
    from tjpipe.local import admission_webhook, cluster, jobset_controller
    from tjpipe.local.procs import wait_until

    wait_for_api(kubeconfig, timeout=timeout)
    with new_api_client(kubeconfig) as api:
        jobset_controller.wait_until_admitted(api, None, timeout=timeout)
        admission_webhook.wait_until_called(api, None, timeout=timeout)
        wait_until(lambda: cluster.nodes_ready(api) > 0, timeout=timeout, what="a simulated node to become Ready")
    say("the cluster admits TrainJobs: JobSet's webhooks and tjpipe webhook answer, nodes are Ready")


def create_trainjobs(kubeconfig: Path, trainjobs: list[dict[str, Any]], *, field_manager: str) -> list[tuple[str, str]]:
    """Server-side apply the TrainJobs and their namespaces; returns their (namespace, name)."""
    from tjpipe.local import crds

    namespaces = sorted({t["metadata"]["namespace"] for t in trainjobs})
    objects = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}} for ns in namespaces]
    with new_api_client(kubeconfig) as api:
        crds.apply_objects(api, [*objects, *trainjobs], field_manager=field_manager)
    return [(t["metadata"]["namespace"], t["metadata"]["name"]) for t in trainjobs]


def follow(kubeconfig: Path, trainjobs: list[tuple[str, str]], *, say: Callable[[str], None], timeout: float) -> bool:
    """``DemoWatch`` each TrainJob until every one finished and was cleaned up; False if ``timeout`` passed."""
    watches = [DemoWatch(kubeconfig, namespace, name, say=say) for namespace, name in trainjobs]
    deadline = time.monotonic() + timeout
    try:
        while any(watch.state != "done" for watch in watches):
            if time.monotonic() >= deadline:
                return False
            for watch in watches:
                watch.poll()
            time.sleep(0.5)
    finally:
        for watch in watches:
            watch.close()
    return True


async def results_position(stack: Any) -> int:
    """The newest apply result's sequence now: ``follow_stack`` shows only what comes after it."""
    nc = await bus.connect(stack.nats_url, name="tjpipe-up", identity="reader", **stack.nats_connect_options("reader"))
    try:
        info = await nc.jetstream().stream_info(streams.RESULTS.name)
        return int(info.state.last_seq or 0)
    finally:
        await nc.close()


OTHER_WORK_EVERY_SECONDS = 10.0
"""How often the demo says, in one line, how much else the stack did meanwhile."""


async def follow_stack(
    stack: Any,
    demo: tuple[str, str] | None,
    more_demos: list[tuple[str, str]] | None = None,
    *,
    console: Console,
    sigterm_handler: Callable[[int, Any], None],
    since_seq: int = 0,
) -> None:
    """Print the apply results since ``since_seq`` as they happen, the demo JobSet's shape once it exists, and
    on a simulated cluster the demo TrainJobs' status and progress until they finished, then their deletion and
    clean-up (``DemoWatch``), with the training stand-in (``tjpipe.standin``) reporting for their running pods.

    With a demo, only the demo TrainJobs' results are printed, in the order they happen; the rest of what the
    stack does (other namespaces, other TrainJobs) is one line every ``OTHER_WORK_EVERY_SECONDS``.
    Until it returns, SIGINT and SIGTERM end the loop; then SIGTERM goes back to ``sigterm_handler``.
    """
    say = functools.partial(console.print, emoji=False)
    logging.getLogger("plumbing.bus").setLevel(logging.ERROR)
    # Read-only: the results are polled with direct gets, as the reader identity.
    nc = await bus.connect(stack.nats_url, name="tjpipe-up", identity="reader", **stack.nats_connect_options("reader"))
    js = nc.jetstream()
    shown = False
    next_seq = since_seq + 1
    demos = [d for d in (demo, *(more_demos or [])) if d is not None]
    wanted = {f"{ns}/{name}" for ns, name in demos}
    watches = []
    standins: list[Any] = []
    if demo and getattr(stack, "simulation", None) is not None:
        watches = [DemoWatch(stack.kubeconfig, *d, say=say) for d in demos]
        standins = await asyncio.to_thread(_standins, stack, demos, say)
    other: dict[str, int] = {}
    said_other = time.monotonic()
    # Ctrl-C and SIGTERM set an event the loop checks, rather than cancelling this task: on Python 3.11 a
    # cancellation that lands while asyncio.wait_for's inner future completes is lost (fixed in 3.12), and
    # a lost one left `tjpipe up` running after Ctrl-C under load.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        while not stop.is_set():
            for process in stack.services:
                if not process.is_running():
                    console.print(f"[red]{process.name} exited[/]; last log lines:")
                    console.print(process.log_tail(), markup=False, emoji=False)
                    return
            # The results first, then the status: a TrainJob's lines come in the order they happened.
            try:
                stored = await bus_history.read_stream(
                    js, streams.RESULTS.name, f"{subjects.RESULTS_PREFIX}.>", start_seq=next_seq
                )
            except Exception:
                stored = []
            if stored:
                next_seq = stored[-1].seq + 1
            for msg in stored:
                try:
                    result = decode_result(msg.data)
                except msgspec.DecodeError:
                    continue
                if wanted and str(result.trainjob) not in wanted:
                    other[str(result.trainjob)] = other.get(str(result.trainjob), 0) + 1
                    continue
                colour = {"created": "green", "configured": "cyan", "unchanged": "dim", "failed": "red"}.get(
                    result.action, "yellow"
                )
                console.print(
                    f"[{colour}]{escape(f'{result.action:>10}')}[/] {escape(str(result.target))}  "
                    f"({result.attempts} attempt{'s' if result.attempts != 1 else ''}, {result.duration_ms:.0f} ms)"
                    + (f" — {escape(result.reason)}" if result.reason else ""),
                    emoji=False,
                )
                if demo and not shown and result.component == "jobset" and result.action in ("created", "configured"):
                    shown = True
                    show_jobset(stack.kubeconfig, *demo, console=console)
            if other and time.monotonic() - said_other >= OTHER_WORK_EVERY_SECONDS:
                namespaces = {key.partition("/")[0] for key in other}
                say(
                    f"[dim]meanwhile the stack also applied {sum(other.values())} components of {len(other)} other "
                    f"TrainJob{'s' if len(other) != 1 else ''} in {len(namespaces)} namespace"
                    f"{'s' if len(namespaces) != 1 else ''}[/]"
                )
                other.clear()
                said_other = time.monotonic()
            if watches and any(watch.state != "done" for watch in watches):
                for standin in standins:
                    await asyncio.to_thread(standin.poll)
                for watch in watches:
                    await asyncio.to_thread(watch.poll)
                if all(watch.state == "done" for watch in watches):
                    console.print(
                        "[bold green]demo finished[/]: the TrainJobs ran to Complete and the garbage collector removed "
                        "everything they owned; the stack keeps running, Ctrl-C stops it"
                    )
            if not stored:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=0.5)
        console.print("\nstopping…")
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        signal.signal(signal.SIGTERM, sigterm_handler)
        for watch in watches:
            watch.close()
        for standin in standins:
            standin.close()
        await nc.close()


def _standins(stack: Any, demos: list[tuple[str, str]], say: Callable[[str], None]) -> list[Any]:
    """A training stand-in per demo TrainJob, when the status server runs and the Kubeflow SDK is at hand."""
    from tjpipe.standin import TrainingStandIn, sdk_python

    if not getattr(stack, "status_server_url", ""):
        return []
    if getattr(stack, "real_node", False):
        say(
            "the demo's pods run the training image on the real node: the training code in each container reports "
            "its progress with the Kubeflow SDK, from the environment, token and CA Trainer's plugin gave the pod"
        )
        return []
    python = sdk_python()
    if python is None:
        say(
            "[yellow]no training progress in this demo[/]: the stand-in that reports it calls the Kubeflow SDK "
            "(kubeflow 0.5.0), which is not installed here or in .venv-sdk (bash scripts/up.sh installs it there; "
            "by hand: TJPIPE_VENV=.venv-sdk bash scripts/bootstrap.sh sdk)"
        )
        return []
    say(
        "a stand-in for training code (no container runs on the simulated nodes) reports progress for each running "
        "pod with the Kubeflow SDK's update_trainjob_status, the pod's environment and a token bound to the pod"
    )
    api = new_api_client(stack.kubeconfig)
    return [
        TrainingStandIn(
            api,
            namespace,
            name,
            python=python,
            folder=stack.paths.root / "standin",
            default_seconds=float(getattr(stack, "pod_run_seconds", 5.0)),
            say=say,
        )
        for namespace, name in demos
    ]


def show_jobset(kubeconfig: Path, namespace: str, name: str, *, console: Console) -> None:
    """The demo JobSet's shape: owner, field managers, and per replicated Job its containers."""

    def plain(text: str) -> None:
        console.print(text, markup=False, emoji=False)

    client = dynamic.DynamicClient(new_api_client(kubeconfig))  # type: ignore[no-untyped-call]
    jobsets = client.resources.get(api_version="jobset.x-k8s.io/v1alpha2", kind="JobSet")
    js = jobsets.get(namespace=namespace, name=name).to_dict()
    owner = js["metadata"]["ownerReferences"][0]
    managers = sorted({f"{m['manager']}/{m['operation']}" for m in js["metadata"].get("managedFields", [])})
    # Everything below but the bold names is cluster data (a container command may hold "[i]"): no markup.
    console.print(
        f"[bold]JobSet {escape(namespace)}/{escape(name)}[/]  "
        + escape(
            f"suspend={js['spec'].get('suspend', False)}  "
            f"owner={owner['kind']}/{owner['name']} (controller={owner.get('controller')})  "
            f"managers={', '.join(managers)}"
        ),
        emoji=False,
    )
    for rj in js["spec"]["replicatedJobs"]:
        jspec = rj["template"]["spec"]
        console.print(
            f"  replicatedJob [bold]{escape(rj['name'])}[/]: replicas={rj.get('replicas', 1)} "
            f"parallelism={jspec.get('parallelism', 1)} completions={jspec.get('completions', 1)}",
            emoji=False,
        )
        for c in jspec["template"]["spec"]["containers"]:
            plain(f"    container {c['name']}  image={c.get('image', '')}")
            plain(f"      command: {' '.join(c.get('command', []) + c.get('args', []))}")
            for kind, values in (c.get("resources") or {}).items():
                plain(f"      {kind}: " + " ".join(f"{k}={v}" for k, v in values.items()))
            env = " ".join(
                f"{e['name']}={e.get('value', '<from ' + next(iter(e.get('valueFrom', {})), '?') + '>')}"
                for e in c.get("env", [])
            )
            plain(f"      env: {env}")
            ports = ", ".join(str(p["containerPort"]) for p in c.get("ports", []))
            plain(f"      ports: {ports}")
    console.print(f"[green]JobSet applied at {time.strftime('%H:%M:%S')}[/]; watching for further changes…")
