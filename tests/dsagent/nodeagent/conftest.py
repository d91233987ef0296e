"""Fixtures for the cluster-mode tests (the fake API server's fixtures are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


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
