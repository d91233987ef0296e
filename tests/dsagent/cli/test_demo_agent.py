"""``make demo`` stage 2: a real agent caches, hits, lists, evicts for space and stops."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsagent.cli import demo

pytestmark = pytest.mark.slow


def test_the_demo_agent_caches_hits_lists_evicts_and_stops(tmp_path: Path) -> None:
    demo.run(tmp_path)
    lines = demo.run_agent(tmp_path)
    verbs = [line.split()[0] for line in lines]
    assert verbs == ["started", "cached", "hit", "listed", "released", "evicted", "stopped"]
    assert "1 dataset (imagenet-mini, least recently used)" in lines[5]
    assert "cache now holds coco-mini" in lines[5]
    assert "gracefully" in lines[6]
    assert not any((tmp_path / "agent" / "datasets").glob(f"{demo.DATASET}/*"))
    assert len(list((tmp_path / "agent" / "datasets" / demo.AGENT_DATASET).iterdir())) == 1
