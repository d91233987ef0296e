"""Shared pytest configuration; fixtures specific to one package live beside its tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """``tests/fixtures``: real outputs of real machines, each beside a ``.src`` provenance file."""
    return FIXTURES_DIR


#: Tests cache from fsspec's process-local ``memory://`` filesystem, which no agent allows
#: by default (DSAGENT_PROTOCOLS); agents started by tests allow it too.
TEST_PROTOCOLS = ("s3", "gs", "az", "http", "https", "file", "memory")


@pytest.fixture(autouse=True)
def _memory_sources_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    from dsagent.format import sources

    monkeypatch.setattr(sources, "DEFAULT_PROTOCOLS", TEST_PROTOCOLS)


os.environ.setdefault("DSAGENT_PROTOCOLS", ",".join(TEST_PROTOCOLS))  # agents the tests start as processes
