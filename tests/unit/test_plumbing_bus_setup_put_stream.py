"""``plumbing.bus_setup.put_stream``: only "the name is in use" means the stream exists; a cluster still forming
is waited for. The real server's answers are exercised by tests/local/test_bus_upgrade.py (a stream that exists
with another configuration) and tests/fleet (replicated streams on a hub of three servers)."""

from __future__ import annotations

from typing import Any

import pytest
from nats.js import api as js_api
from nats.js.errors import BadRequestError

from plumbing import bus_setup

CONFIG = js_api.StreamConfig(name="TJ_X", subjects=["x.>"])


class Server:
    """Answers ``add_stream`` the way nats-server does for one situation, and records the calls."""

    def __init__(self, refusal: dict[str, Any] | None) -> None:
        self.refusal = refusal
        self.calls: list[str] = []

    async def add_stream(self, config: js_api.StreamConfig) -> None:
        self.calls.append("add")
        if self.refusal is not None:
            raise BadRequestError(**self.refusal)

    async def update_stream(self, config: js_api.StreamConfig) -> None:
        self.calls.append("update")


async def test_a_new_stream_is_added() -> None:
    server = Server(None)
    await bus_setup.put_stream(server, CONFIG)  # type: ignore[arg-type]
    assert server.calls == ["add"]


async def test_a_stream_that_exists_otherwise_is_updated() -> None:
    in_use = {
        "code": 400,
        "err_code": 10058,
        "description": "stream name already in use with a different configuration",
    }
    server = Server(in_use)
    await bus_setup.put_stream(server, CONFIG)  # type: ignore[arg-type]
    assert server.calls == ["add", "update"]


async def test_a_cluster_still_forming_is_waited_for_not_taken_for_an_existing_stream() -> None:
    no_peers = {"code": 400, "err_code": 10005, "description": "no suitable peers for placement, peer offline"}
    server = Server(no_peers)
    with pytest.raises(bus_setup.NotPlacedYet, match="no suitable peers"):
        await bus_setup.put_stream(server, CONFIG)  # type: ignore[arg-type]
    assert server.calls == ["add"]
    assert bus_setup.NotPlacedYet in bus_setup._SETUP_RETRYABLE  # until_done tries again


async def test_any_other_refusal_is_raised_as_it_is() -> None:
    invalid = {"code": 400, "err_code": 10052, "description": "subjects overlap with an existing stream"}
    with pytest.raises(BadRequestError, match="subjects overlap"):
        await bus_setup.put_stream(Server(invalid), CONFIG)  # type: ignore[arg-type]
