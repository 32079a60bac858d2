"""The index against a real nats-server: it pages through the streams, then reads only what arrived since."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from history_server import index as index_module
from history_server.index import HistoryIndex

from .support import record

pytestmark = [pytest.mark.nats]


async def test_the_index_pages_through_the_streams_and_then_reads_only_what_is_new(
    nats_connect: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_module, "READ_PAGE", 3)
    namespace = f"idx-{secrets.token_hex(3)}"
    admin, reader = await nats_connect(), await nats_connect("reader")
    try:
        for name in ("one", "two", "three"):
            await record(admin.jetstream(), namespace, name)
        index = HistoryIndex()
        assert await index.catch_up(reader.jetstream()) >= 9  # 6 events and 3 dead letters at least, in pages of 3
        mine = {s.name: s for s in index.in_namespace(namespace)}
        assert sorted(mine) == ["one", "three", "two"]
        assert all((s.events, s.dead_letters, s.state) == (2, 1, "Running") for s in mine.values())

        assert await index.catch_up(reader.jetstream()) == 0
        await record(admin.jetstream(), namespace, "four")
        assert await index.catch_up(reader.jetstream()) == 3  # its two events and its dead letter
        assert len(index.in_namespace(namespace)) == 4
    finally:
        await admin.close()
        await reader.close()
