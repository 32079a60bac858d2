"""A service runs on the event loop its settings name: asyncio's own by default, or uvloop."""

from __future__ import annotations

import asyncio

import pytest

from plumbing.runner import ProcessSettings, loop_factory, run_service
from tjpipe import cli


def loop_module_of(event_loop: str) -> str:
    seen: list[str] = []

    async def main(_settings: ProcessSettings, _stop: asyncio.Event) -> None:
        seen.append(type(asyncio.get_running_loop()).__module__)

    assert run_service(ProcessSettings(event_loop=event_loop, log_format="json"), main) == 0
    return seen[0]


def test_the_default_is_asyncios_loop() -> None:
    assert loop_factory("asyncio") is None
    assert loop_module_of("asyncio").startswith("asyncio")


def test_uvloop_when_asked() -> None:
    pytest.importorskip("uvloop", reason="the uvloop extra is not installed")
    assert loop_module_of("uvloop").startswith("uvloop")


def test_an_unknown_loop_is_a_clear_error() -> None:
    with pytest.raises(SystemExit, match="unknown event loop 'trio'"):
        loop_factory("trio")


def test_every_service_takes_the_flag_and_its_variable() -> None:
    from tjpipe import settings

    args = settings.resolve(cli.build_parser().parse_args(["planner"]), {"TJPIPE_EVENT_LOOP": "uvloop"})
    assert args.event_loop == "uvloop"
    args = settings.resolve(cli.build_parser().parse_args(["applier", "--event-loop", "asyncio"]), {})
    assert args.event_loop == "asyncio"
