"""Fixtures for the scheduler extender's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def read_fixture_text(fixtures_dir: Path) -> str:
    """A real ``nvidia-smi topo -m`` of a DGX-A100-class node (8 GPUs, 10 NICs, NPS4)."""
    path = next((fixtures_dir / "topology").glob("dgx-a100-class-*.txt"))
    return path.read_text(encoding="utf-8")
