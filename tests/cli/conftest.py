"""A NATS server of this folder's own: ``dlq list`` and ``replay --all`` then print exactly what the tests
recorded, with nothing another module left on the session's server."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tjpipe.credentials import Credentials, generate_credentials, server_authorization
from tjpipe.local.natsd import start_nats
from tjpipe.local.stack import setup_bus_as_admin


@dataclass(frozen=True)
class Bus:
    url: str
    credentials: Credentials

    def env(self, identity: str = "reader") -> dict[str, str]:
        """What ``. .tjpipe/env`` gives an operator: the server and one identity's seed."""
        return {"NATS_URL": self.url, "NATS_CREDS": str(self.credentials.seed_file(identity))}


@pytest.fixture(scope="module")
def own_bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bus]:
    root: Path = tmp_path_factory.mktemp("cli-nats")
    credentials = generate_credentials(root / "creds")
    local = start_nats(store_dir=root / "store", log_dir=root / "logs", authorization=server_authorization(credentials))
    try:
        setup_bus_as_admin(local.url, credentials, environ={}, tls_from_env=False)
        yield Bus(url=local.url, credentials=credentials)
    finally:
        local.stop()
