"""``make demo`` stage 1 runs end to end and says what happened."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsagent.cli import demo
from dsagent.format.bundles.bundle import verify_tree
from dsagent.format.manifest import read_manifest

pytestmark = pytest.mark.slow


def test_the_demo_packs_reuses_unpacks_and_verifies(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    lines = demo.run(tmp_path)
    verbs = [line.split()[0] for line in lines]
    assert verbs == ["generated", "digested", "packed", "re-packed", "unpacked", "verified"]
    assert "1 bundle rewritten" in lines[3]
    manifest = read_manifest(str(tmp_path / "store"), demo.DATASET)
    verify_tree(tmp_path / "datasets" / demo.DATASET, manifest)
    assert len(capsys.readouterr().out.splitlines()) == len(lines) + 1
    demo.run(tmp_path)  # runs again over its own leftovers
