"""Every status a controller writes to the TrainJobs of some namespaces, in the order the apiserver saw it.

Why a watch and not polling: a poll every few hundred milliseconds misses a status that lives shorter than
that, and the differential compares whole sequences. A watch delivers every write of a TrainJob (each one a
new resourceVersion), so what is recorded is what the controller wrote, not what a poll happened to catch.

What is left out, and why that is honest: the conditions' ``lastTransitionTime`` (a clock reading; the
lifecycle tests check the times against the JobSet's), and the order of ``jobsStatus`` (JobSet v0.12.0 builds
its ``replicatedJobsStatus`` from a Go map, so both controllers copy it in an arbitrary order). A write that
leaves the status as it was (a spec or metadata change) adds nothing. A deletion is recorded as ``DELETED``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client as kube_client
from kubernetes import watch
from lifecycle.trainer_status import status_shape

from tjpipe.local.kubeapi import new_api_client

Obj = dict[str, Any]
Key = tuple[str, str]

TRAINJOBS = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
JOBSETS = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
DELETED: Obj = {"deleted": True}
"""The entry a TrainJob's deletion adds to its sequence."""


def normalised(trainjob: Obj) -> Obj:
    return status_shape(trainjob)


def append_distinct(sequence: list[Obj], entry: Obj) -> bool:
    """Append ``entry`` unless it equals the last one; whether it was appended."""
    if sequence and sequence[-1] == entry:
        return False
    sequence.append(entry)
    return True


def _key(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


class StatusRecorder:
    """Threads watching TrainJobs and JobSets in the whole cluster: the status sequences of the TrainJobs in
    ``namespaces``, and their JobSets as last seen."""

    def __init__(self, kubeconfig: Path) -> None:
        self._kubeconfig = kubeconfig
        self.namespaces: set[str] = set()
        """Whose TrainJobs are kept; add a namespace before anything is created in it."""
        self._lock = threading.Lock()
        self._sequences: dict[Key, list[Obj]] = {}
        self._latest: dict[Key, Obj] = {}
        self._jobsets: dict[Key, Obj] = {}
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._threads = [
            (threading.Thread(target=self._run, args=(kind, record), daemon=True), threading.Event())
            for kind, record in ((TRAINJOBS, self._record), (JOBSETS, self._keep_jobset))
        ]

    def start(self) -> StatusRecorder:
        for thread, started in self._threads:
            thread.start()
            if not started.wait(timeout=30):
                raise RuntimeError(f"a watch did not start: {self._error}")
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread, _ in self._threads:
            thread.join(timeout=15)

    def jobset(self, namespace: str, name: str) -> Obj | None:
        """The JobSet as last seen: what the scenarios wait on, so that waiting costs the apiserver nothing."""
        with self._lock:
            return self._jobsets.get((namespace, name))

    def _keep_jobset(self, event_type: str, obj: Obj) -> None:
        key = _key(obj)
        with self._lock:
            if event_type == "DELETED":
                self._jobsets.pop(key, None)
            elif key[0] in self.namespaces:
                self._jobsets[key] = obj

    def sequence(self, namespace: str, name: str) -> list[Obj]:
        with self._lock:
            return list(self._sequences.get((namespace, name), []))

    def latest(self, namespace: str, name: str) -> Obj | None:
        """The TrainJob as last seen (whole object), or None if never seen or deleted."""
        with self._lock:
            return self._latest.get((namespace, name))

    def _record(self, event_type: str, obj: Obj) -> None:
        key = _key(obj)
        if key[0] not in self.namespaces:
            return
        with self._lock:
            sequence = self._sequences.setdefault(key, [])
            if event_type == "DELETED":
                self._latest.pop(key, None)
                append_distinct(sequence, DELETED)
                return
            self._latest[key] = obj
            append_distinct(sequence, normalised(obj))

    def _run(self, kind: tuple[str, str, str], record: Callable[[str, Obj], None]) -> None:
        started = next(event for thread, event in self._threads if thread is threading.current_thread())
        with new_api_client(self._kubeconfig) as api:
            custom = kube_client.CustomObjectsApi(api)
            resource_version = ""
            while not self._stop.is_set():
                try:
                    if not resource_version:
                        listed = custom.list_cluster_custom_object(*kind)
                        for item in listed.get("items") or []:
                            record("ADDED", item)
                        resource_version = listed["metadata"]["resourceVersion"]
                        started.set()
                    stream = watch.Watch()
                    for event in stream.stream(
                        custom.list_cluster_custom_object,
                        *kind,
                        resource_version=resource_version,
                        allow_watch_bookmarks=True,
                        timeout_seconds=5,
                    ):
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            resource_version = ""  # expired: list again (a gap the log would show)
                            break
                        resource_version = obj["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            record(event["type"], obj)
                        if self._stop.is_set():
                            stream.stop()
                except Exception as exc:  # a dropped connection: watch again from where it was
                    self._error = exc
                    time.sleep(0.5)

    async def until(
        self,
        namespace: str,
        name: str,
        check: Callable[[Obj | None], bool],
        *,
        timeout: float,
        what: str,
    ) -> None:
        """Wait until ``check`` holds for the TrainJob as last seen (None once deleted)."""
        deadline = time.monotonic() + timeout
        while not check(self.latest(namespace, name)):
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"{namespace}/{name}: timed out after {timeout:.0f}s waiting for {what}; "
                    f"statuses seen: {self.sequence(namespace, name)}"
                )
            await asyncio.sleep(0.2)
