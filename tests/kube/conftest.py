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
