"""A learning-rate sweep recorded in the story's namespace: five TrainJobs labelled as one sweep, each with its
own runtime, state, creation time and newest loss, and one of another team; what the find and compare tests
look for."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec

from contracts import subjects
from contracts.messages import TrainJobObserved, encode
from plumbing import bus

from .progress_support import Story, progress_record
from .support import _event, get, run_async, wait_until

NLP = {"sweep": "lr", "team": "nlp"}
SWEEP = {
    # name: (labels, runtime, state, creationTimestamp, losses reported in turn)
    "lr-1e-2": (NLP, "torch-distributed", "Complete", "2026-11-01T10:00:00Z", (2.1, 0.9, 0.52)),
    "lr-3e-3": (NLP, "torch-distributed", "Complete", "2026-11-02T10:00:00Z", (2.0, 0.6, 0.28)),
    "lr-1e-3": (NLP, "torch-distributed", "Complete", "2026-11-03T10:00:00Z", (2.2, 0.5, 0.21)),
    "lr-3e-4": (NLP, "deepspeed", "Running", "2026-11-04T10:00:00Z", (2.3, 0.7, 0.35)),
    "lr-1e-4": ({**NLP, "canary": ""}, "torch-distributed", "Failed", "2026-11-05T10:00:00Z", (2.4, 1.9)),
    "vision-a": ({"team": "cv"}, "torch-distributed", "Complete", "2026-11-06T10:00:00Z", (1.0, 0.1)),
}
_STATUS: dict[str, dict[str, Any]] = {
    "Running": {"jobsStatus": [{"name": "node", "active": 2}]},
    "Complete": {
        "conditions": [{"type": "Complete", "status": "True", "reason": "AllJobsCompleted", "message": "done"}],
        "jobsStatus": [{"name": "node", "active": 0, "succeeded": 2}],
    },
    "Failed": {
        "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "oom"}],
        "jobsStatus": [{"name": "node", "active": 0, "failed": 2}],
    },
}


def _labelled(
    namespace: str, name: str, labels: dict[str, str], runtime: str, status: Any, created: str, rv: str
) -> bytes:
    event = msgspec.to_builtins(_event(namespace, name, nodes=2 if runtime != "deepspeed" else 4, status=status, rv=rv))
    event["trainjob"]["metadata"] |= {"labels": labels, "creationTimestamp": created}
    event["trainjob"]["spec"]["runtimeRef"]["name"] = runtime
    return encode(msgspec.convert(event, TrainJobObserved))


def record_sweep(story: Story) -> None:
    async def publish() -> None:
        nc = await bus.connect(story.nats_url, name="test-history-sweep", creds=story.admin_creds)
        try:
            js = nc.jetstream()
            for name, (labels, runtime, state, created, losses) in SWEEP.items():
                subject = subjects.event_subject(story.namespace, name)
                await js.publish(subject, _labelled(story.namespace, name, labels, runtime, None, created, "1"))
                running = _STATUS["Running"]
                await js.publish(subject, _labelled(story.namespace, name, labels, runtime, running, created, "2"))
                for i, loss in enumerate(losses):
                    await asyncio.sleep(0.05)
                    data = progress_record(
                        story.namespace, name, pod=f"{name}-node-0-0", percent=(i + 1) * 30, metrics={"loss": str(loss)}
                    )
                    await js.publish(subjects.progress_subject(story.namespace, name), data)
                if state != "Running":
                    final = _labelled(story.namespace, name, labels, runtime, _STATUS[state], created, "3")
                    await js.publish(subject, final)
        finally:
            await nc.close()

    run_async(publish)


def indexed_sweep(story: Story) -> None:
    """Until the history server's index holds every record of the sweep: each TrainJob in its final state with
    its last loss. Its jobs show up with their first record; a test that read them then raced their last."""
    url = f"{story.server.url}/api/v1/namespaces/{story.namespace}/trainjobs?limit=50"
    want = {name: (state, str(losses[-1])) for name, (_, _, state, _, losses) in SWEEP.items()}

    def indexed() -> bool:
        items = json.loads(get(url, story.tokens["viewer"])[1] or b"{}").get("items") or []
        seen = {
            item["name"]: (item.get("state"), ((item.get("progress") or {}).get("metrics") or {}).get("loss"))
            for item in items
        }
        return all(seen.get(name) == final for name, final in want.items())

    wait_until(indexed, timeout=60, what="every record of the sweep in the history server's index")
