"""Shared pytest configuration; fixtures specific to one package live beside its tests."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DIR = REPO_ROOT.parent / "shared"


@pytest.fixture(scope="session")
def shared_fixtures() -> Path:
    """``../shared/fixtures``: real data from real machines (read-only)."""
    path = SHARED_DIR / "fixtures"
    if not path.is_dir():
        pytest.fail(f"shared fixtures not found at {path}; clone the repo beside shared/")
    return path
