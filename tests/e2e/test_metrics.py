"""The TrainJob lifecycle metrics on real servers, with two replicas of every stage: each change counted once.

Two watchers publish every change (active-active), two planners and two appliers share the partitions. Four
TrainJobs go through what the counters count: one completes (its JobSet's status is set Completed, as
JobSet's controller would), one runs past ``activeDeadlineSeconds`` and fails, one is suspended, one is
deleted. Summed over all six replicas, each counter holds exactly its count, and the watchers' gauge says
one TrainJob is active. Then an applier and a watcher are replaced by new processes and every TrainJob is
changed again, so each is planned and applied anew: nothing is counted a second time (what the stopped
replicas had counted is kept from their last scrape, as Prometheus keeps a series that reset), and the new
watcher's gauge is right at once.

The same running replicas then check the monitoring component: every expression of the Grafana dashboard
and the PrometheusRule must parse and read only metrics and labels that these services' ``/metrics`` have
(``tests/deploy/monitoring.py``).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from kubernetes import dynamic
from prometheus_client.parser import text_string_to_metric_families

from contracts import subjects
from contracts.kube import ConfigMap
from contracts.messages import ApplyConfigMap, ObjectKey, Target, encode
from deploy import monitoring
from tjpipe.local.stack import Stack

from .support import TRAINER, condition_of, create, eventually, get, stack_on_session_servers

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(300)]

RUNTIME = "torch-distributed"
REPLICAS = ("a", "b")
STAGES = ("watcher", "planner", "applier")


@pytest.fixture(scope="module")
def replicated(
    kube: Any, nats_url: str, nats_credentials: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    with stack_on_session_servers(kube, nats_url, nats_credentials, tmp_path_factory, (RUNTIME,)) as stack:
        for stage in STAGES:
            for replica in REPLICAS:
                stack.start_service(stage, name=f"{stage}-{replica}")
        yield stack


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text: str = resp.read().decode()
    return text


STOPPED: list[str] = []
"""The last scrapes of the replicas the first test stops; the second reads them too, as Prometheus would have."""


def scrape(port: int, namespace: str, *, text: str | None = None) -> Samples:
    """This replica's ``kubeflow_trainer_*`` samples of one namespace, by name and the other labels."""
    out: Samples = {}
    for family in text_string_to_metric_families(metrics_text(port) if text is None else text):
        for sample in family.samples:
            if sample.name.startswith("kubeflow_trainer_") and sample.labels.get("namespace") == namespace:
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "namespace"))
                out[(sample.name, labels)] = sample.value
    return out


def total(samples: list[Samples], name: str, **labels: str) -> float:
    wanted = tuple(sorted({"runtime": RUNTIME, **labels}.items()))
    return sum(s.get((name, wanted), 0.0) for s in samples)


def trainjob(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    body = {"runtimeRef": {"name": RUNTIME}, "trainer": {"numNodes": 1, "image": "example.com/t:1"}, **spec}
    return {"apiVersion": TRAINER, "kind": "TrainJob", "metadata": {"name": name, "namespace": namespace}, "spec": body}


def complete_jobset(dyn: dynamic.DynamicClient, namespace: str, name: str) -> None:
    """What JobSet's controller writes when every job succeeded (no controller runs on this apiserver)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    condition = {
        "type": "Completed",
        "status": "True",
        "reason": "AllJobsCompleted",
        "message": "jobset completed successfully",
        "lastTransitionTime": now,
    }
    jobsets = dyn.resources.get(api_version="jobset.x-k8s.io/v1alpha2", kind="JobSet")
    jobsets.status.patch(
        body={"status": {"conditions": [condition]}},
        namespace=namespace,
        name=name,
        content_type="application/merge-patch+json",
    )


def test_two_replicas_of_every_stage_count_each_change_once(replicated: Stack, kube: Any, namespace: str) -> None:
    dyn = dynamic.DynamicClient(kube.api_client())
    create(dyn, trainjob("done", namespace))
    create(dyn, trainjob("late", namespace, activeDeadlineSeconds=3))
    create(dyn, trainjob("paused", namespace, suspend=True))
    create(dyn, trainjob("gone", namespace))
    eventually(lambda: get(dyn, "jobset.x-k8s.io/v1alpha2", "JobSet", namespace, "done"), what="done's JobSet")
    complete_jobset(dyn, namespace, "done")
    eventually(lambda: get(dyn, "jobset.x-k8s.io/v1alpha2", "JobSet", namespace, "gone"), what="gone's JobSet")
    dyn.resources.get(api_version=TRAINER, kind="TrainJob").delete(namespace=namespace, name="gone")

    def status_of(name: str, condition: str) -> str:
        return (condition_of(get(dyn, TRAINER, "TrainJob", namespace, name), condition) or {}).get("status", "")

    eventually(lambda: status_of("done", "Complete") == "True", what="done to be Complete")
    eventually(lambda: status_of("late", "Failed") == "True", timeout=45, what="late to fail its deadline")
    eventually(lambda: status_of("paused", "Suspended") == "True", what="paused to be Suspended")

    ports = replicated.metrics_ports
    expected = {
        ("kubeflow_trainer_trainjobs_created_total", ()): 4.0,
        ("kubeflow_trainer_trainjobs_completed_total", ()): 1.0,
        ("kubeflow_trainer_trainjobs_failed_total", (("reason", "DeadlineExceeded"),)): 1.0,
        ("kubeflow_trainer_trainjobs_suspended_total", ()): 1.0,
        ("kubeflow_trainer_trainjobs_deleted_total", ()): 1.0,
        ("kubeflow_trainer_trainjob_duration_seconds_count", (("result", "Complete"),)): 1.0,
        ("kubeflow_trainer_trainjob_duration_seconds_count", (("result", "Failed"),)): 1.0,
    }

    def counts(samples: list[Samples]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(name, labels): total(samples, name, **dict(labels)) for name, labels in expected}

    def settled() -> list[Samples] | None:
        samples = [scrape(port, namespace) for port in ports.values()]
        return samples if counts(samples) == expected else None

    try:
        samples = eventually(settled, timeout=30, what="every change counted")
    except AssertionError:
        samples = [scrape(port, namespace) for port in ports.values()]
        raise AssertionError(f"counted {counts(samples)}, expected {expected}") from None
    assert counts(samples) == expected
    active = [scrape(ports[f"watcher-{r}"], namespace) for r in REPLICAS]
    assert [total([s], "kubeflow_trainer_trainjobs_active") for s in active] == [1.0, 1.0]

    # Replace an applier and a watcher; keep what they counted, as a Prometheus series that reset keeps it.
    STOPPED.extend(metrics_text(ports[name]) for name in ("applier-a", "watcher-a"))
    kept = [scrape(0, namespace, text=text) for text in STOPPED]
    for name in ("applier-a", "watcher-a"):
        next(p for p in replicated.services if p.name == name).stop()
    replicated.start_service("applier", name="applier-c")
    replicated.start_service("watcher", name="watcher-c")
    live = [name for name in ports if name not in ("applier-a", "watcher-a")]
    eventually(
        lambda: total([scrape(ports["watcher-c"], namespace)], "kubeflow_trainer_trainjobs_active") == 1.0,
        what="the new watcher's gauge",
    )

    # Every TrainJob changes once more, so each is planned and its messages applied again, by whichever
    # applier holds its partition now: nothing may be counted twice.
    trainjobs = dyn.resources.get(api_version=TRAINER, kind="TrainJob")
    for name in ("done", "late", "paused"):
        trainjobs.patch(
            body={"metadata": {"labels": {"tjpipe.test/again": "1"}}},
            namespace=namespace,
            name=name,
            content_type="application/merge-patch+json",
        )
    time.sleep(5)  # the changes go through the pipeline; a wrong count would show up in this time
    after = kept + [scrape(ports[name], namespace) for name in live]
    assert counts(after) == expected
    assert total([scrape(ports["watcher-c"], namespace)], "kubeflow_trainer_trainjobs_active") == 1.0


def unjustified_apply(namespace: str) -> tuple[str, bytes]:
    """A genuine (signed) apply message whose object has no controller reference: dead-lettered as unauthorized."""
    name = "nobody"
    obj = msgspec.convert(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}}, ConfigMap
    )
    message = ApplyConfigMap(
        trainjob=ObjectKey(namespace=namespace, name=name),
        trainjob_uid="00000000-0000-0000-0000-000000000000",
        target=Target(api_version="v1", kind="ConfigMap", namespace=namespace, name=name),
        source_seq=1,
        object=obj,
    )
    return subjects.apply_subject(namespace, name, "configmap"), encode(message)


def test_every_dashboard_and_alert_expression_reads_what_the_services_expose(replicated: Stack, namespace: str) -> None:
    """After the test above, plus one dead letter: the scrapes hold the series the expressions read."""
    subject, payload = unjustified_apply(namespace)

    async def publish() -> None:
        nc = await replicated.connect()
        try:
            await nc.jetstream().publish(subject, payload, headers=replicated.sign_headers(subject, payload))
        finally:
            await nc.close()

    asyncio.run(publish())
    live = [p.name for p in replicated.services if p.is_running()]
    eventually(
        lambda: any("tjpipe_unauthorized_total{" in metrics_text(replicated.metrics_ports[name]) for name in live),
        what="the unauthorized apply counted",
    )
    texts = [*STOPPED, *(metrics_text(replicated.metrics_ports[name]) for name in live)]
    exposed, declared_only = monitoring.exposed(texts)
    found = [
        problem
        for e in monitoring.every_expression()
        for problem in monitoring.problems(e, exposed, pending_allowed=True)
    ]
    for variable, metric, label in monitoring.variable_queries():
        if label not in exposed.get(metric, {}):
            found.append(f"variable {variable}: {metric} has no label {label}")
    assert found == []
    pending = sorted(set(monitoring.PENDING) - set(exposed))
    print(
        f"read from a scrape: {len(exposed)} series names; declared with no sample yet: {sorted(declared_only)};"
        f" pending (h-streams): {pending}"
    )
