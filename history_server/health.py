"""The pipeline's health as one page: how far behind each stage's consumers are, the dead letters, the
publishes full streams refused, and how full each stream is.

Everything but the refusals comes from the bus itself, with requests the ``reader`` identity may make and
that change nothing (stream and consumer info). Refused publishes are counted by the publishing processes
(``tjpipe_publish_refused_total``), so they are summed from the ``/metrics`` pages the server is told to
read (``--scrape``); without any, the page says the figure is not known rather than showing a zero.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from contracts import streams
from contracts.subjects import PARTITIONS

if TYPE_CHECKING:
    import aiohttp
    from nats.js import JetStreamContext

REFUSED_METRIC = "tjpipe_publish_refused_total"
STAGES = ((streams.PLANNER, "planner"), (streams.APPLIER, "applier"))


async def stream_usage(js: JetStreamContext) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for spec in streams.ALL_STREAMS:
        try:
            info = await js.stream_info(spec.name)
        except Exception as exc:
            out.append({"stream": spec.name, "error": type(exc).__name__})
            continue
        state, config = info.state, info.config
        max_bytes = int(config.max_bytes or -1)
        used = int(state.bytes or 0)
        out.append(
            {
                "stream": spec.name,
                "messages": int(state.messages or 0),
                "bytes": used,
                "maxBytes": max_bytes,
                "maxAgeSeconds": float(config.max_age or 0),
                "usage": (used / max_bytes) if max_bytes > 0 else None,
                "firstSeq": int(state.first_seq or 0),
                "lastSeq": int(state.last_seq or 0),
            }
        )
    return out


async def consumer_lag(js: JetStreamContext) -> list[dict[str, Any]]:
    """Per stage and partition: messages not yet delivered, and delivered but not yet acknowledged."""

    async def one(spec: streams.ConsumerSpec, stage: str, partition: int) -> dict[str, Any]:
        durable = f"{spec.durable}-p{partition}"
        row: dict[str, Any] = {"stage": stage, "partition": partition, "consumer": durable}
        try:
            info = await js.consumer_info(spec.stream, durable)
        except Exception as exc:
            return {**row, "error": type(exc).__name__}
        return {
            **row,
            "pending": int(info.num_pending or 0),
            "unacknowledged": int(info.num_ack_pending or 0),
            "redelivered": int(info.num_redelivered or 0),
        }

    return list(await asyncio.gather(*(one(spec, stage, p) for spec, stage in STAGES for p in range(PARTITIONS))))


def refused_from(text: str) -> dict[str, float]:
    """``tjpipe_publish_refused_total`` by stream, from one Prometheus text page."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == REFUSED_METRIC:
                stream = sample.labels.get("stream", "")
                out[stream] = out.get(stream, 0.0) + float(sample.value)
    return out


async def refused_publishes(session: aiohttp.ClientSession, urls: Sequence[str]) -> dict[str, Any]:
    import aiohttp

    if not urls:
        return {"known": False, "byStream": {}, "sources": []}
    total: dict[str, float] = {}
    sources = []
    for url in urls:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=3)) as resp:
                text = await resp.text()
            for stream, value in refused_from(text).items():
                total[stream] = total.get(stream, 0.0) + value
            sources.append({"url": url, "ok": True})
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            sources.append({"url": url, "ok": False, "error": type(exc).__name__})
    return {"known": any(s["ok"] for s in sources), "byStream": total, "sources": sources}


async def pipeline_health(
    js: JetStreamContext, session: aiohttp.ClientSession, scrape: Sequence[str]
) -> dict[str, Any]:
    usage, lag, refused = await asyncio.gather(stream_usage(js), consumer_lag(js), refused_publishes(session, scrape))
    dlq: dict[str, Any] = next((s for s in usage if s["stream"] == streams.DLQ.name), {})
    by_stage: dict[str, int] = {}
    for row in lag:
        by_stage[row["stage"]] = by_stage.get(row["stage"], 0) + int(row.get("pending", 0))
    return {
        "deadLetters": dlq.get("messages"),
        "lagByStage": by_stage,
        "consumers": lag,
        "streams": usage,
        "refusedPublishes": refused,
    }
