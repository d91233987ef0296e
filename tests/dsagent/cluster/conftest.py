"""Fixtures for the cluster-mode tests: a running fake API server and clients for it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.fake_apiserver import FakeApiServer


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    """A fake Kubernetes API server on 127.0.0.1, stopped after the test."""
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def api_client(apiserver: FakeApiServer) -> Iterator[Any]:
    """An unmodified ``kubernetes.client.ApiClient`` talking to :func:`apiserver`."""
    client = apiserver.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def memory_dataset() -> Iterator[str]:
    """A small dataset on a fresh ``memory://`` prefix (removed afterwards)."""
    import os

    import fsspec

    root = f"memory://dsagent-kube-tests/{os.urandom(6).hex()}"
    fs = fsspec.filesystem("memory")
    path = root.split("://", 1)[1]
    for i in range(4):
        fs.pipe(f"{path}/train/{i}.jpg", bytes([i]) * (300 + i))
    yield root
    if fs.exists(path):
        fs.rm(path, recursive=True)
