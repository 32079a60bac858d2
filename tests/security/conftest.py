"""Fixtures the security tests that run the whole pipeline share.

Each test module gets its own API server (module scope), so what one module installs (an admission policy,
forged objects) cannot change what another sees; the tests in a module share it and use a namespace each.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from faults.conftest import start_private_kube
from faults.support import Pipeline, close_pipeline, open_pipeline

from tjpipe.local.kubeapi import LocalKube


@pytest.fixture(scope="module")
def module_kube(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[LocalKube]:
    """A private kube-apiserver with the CRDs, for one test module."""
    kube = start_private_kube(tmp_path_factory.mktemp(f"{request.module.__name__.rpartition('.')[2]}-kube"))
    try:
        yield kube
    finally:
        kube.stop()


@pytest.fixture
def pipeline(module_kube: LocalKube, tmp_path: Path) -> Iterator[Pipeline]:
    """NATS and the three services' command lines on the module's API server, with one runtime installed."""
    pipe = open_pipeline(module_kube, tmp_path / "pipe", runtimes=("torch-distributed",))
    try:
        yield pipe
    finally:
        print(close_pipeline(pipe))
