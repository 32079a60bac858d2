"""One fleet per test module: a three-server hub and two members, ``c1`` and ``c2`` (``support.start_fleet``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleet.support import Fleet
from tjpipe.local.fleet import start_fleet

CLUSTERS = ("c1", "c2")


@pytest.fixture(scope="module")
def fleet_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    running = start_fleet(tmp_path_factory.mktemp("fleet"), CLUSTERS)
    try:
        yield running
    finally:
        running.stop()
