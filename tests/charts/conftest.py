"""Every test under tests/charts/ renders the chart (Helm's SDK or the helm binary): all are
``slow``, marked here so that a new chart test module is too without saying so."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.slow)
