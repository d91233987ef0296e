"""Shared pytest configuration; fixtures specific to one package live beside its tests."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """``tests/fixtures``: real outputs of real machines, each beside a ``.src`` provenance file."""
    return FIXTURES_DIR
