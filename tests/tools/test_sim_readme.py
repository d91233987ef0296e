"""The README's simulator block is what ``tools/sim/results.py`` makes of the committed JSON."""

from __future__ import annotations

import json

from tests.conftest import REPO_ROOT
from tools.sim import results


def _docs() -> dict[str, dict[str, object]]:
    out = REPO_ROOT / "tools" / "sim" / "out" / "results"
    return {name: json.loads((out / f"{name}.json").read_text()) for name in results.WORKLOADS}


def test_the_readme_block_is_the_committed_results_table() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert results.BEGIN in readme and results.END in readme
    assert results.with_goals(readme, _docs()) == readme, "re-run: python tools/sim/results.py --render-only"


def test_the_block_is_rewritten_between_its_markers_only() -> None:
    docs = _docs()
    stale = f"before\n{results.BEGIN}\nold table\n{results.END}\nafter\n"
    written = results.with_goals(stale, docs)
    assert written.startswith("before\n" + results.BEGIN) and written.endswith(results.END + "\nafter\n")
    assert "old table" not in written and "| results-churn | ours+stripe+early |" in written
    assert results.with_goals("no markers\n", docs) == "no markers\n"
