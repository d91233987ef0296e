"""The README's simulator block is what ``tools/sim/results.py`` makes of the committed JSON."""

from __future__ import annotations

import json

from tests.conftest import REPO_ROOT
from tools.sim import results


def _docs() -> dict[str, dict[str, object]]:
    out = REPO_ROOT / "tools" / "sim" / "out" / "results"
    return {name: json.loads((out / f"{name}.json").read_text()) for name in results.WORKLOADS}


def _committed_seeds() -> dict[str, dict[str, object]]:
    seeds = REPO_ROOT / "tools" / "sim" / "out" / "results" / "seeds"
    return {
        f"{name} seed {path.stem.rsplit('-seed', 1)[1]}": json.loads(path.read_text())
        for name in results.WORKLOADS
        for path in sorted(seeds.glob(f"{name}-seed*.json"))
    }


def test_the_readme_block_is_the_committed_results_table() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert results.BEGIN in readme and results.END in readme
    seeded = _committed_seeds()
    assert seeded, "the other seeds' runs are committed"
    expected = results.with_goals(readme, _docs(), seeded)
    assert expected == readme, "re-run: python tools/sim/results.py --render-only"


def test_the_block_is_rewritten_between_its_markers_only() -> None:
    docs = _docs()
    stale = f"before\n{results.BEGIN}\nold table\n{results.END}\nafter\n"
    written = results.with_goals(stale, docs)
    assert written.startswith("before\n" + results.BEGIN) and written.endswith(results.END + "\nafter\n")
    assert "old table" not in written and "| results-churn | ours+stripe+early |" in written
    assert results.with_goals("no markers\n", docs) == "no markers\n"


def _seeded(store: float, local: float, ttfs: float) -> dict[str, object]:
    """A run document of the Fluid settings and ours, ours at these ratios to the best Fluid."""
    fluid = {"storage_bytes": 100.0, "local_fraction": 0.2, "ttfs_mean_s": 50.0}
    ours = {"storage_bytes": 100.0 * store, "local_fraction": 0.2 * local, "ttfs_mean_s": 50.0 * ttfs}
    return {"policies": {**{p: dict(fluid) for p in results.FLUIDS}, "ours+stripe+early": ours}}


def test_other_seeds_are_counted_per_goal_and_their_misses_are_bold() -> None:
    seeded = {
        "w seed 2": _seeded(1.0, 2.0, 0.5),
        "w seed 3": _seeded(1.004, 2.0, 0.5),  # a miss that would round to 1.00x
        "w seed 4": _seeded(0.9, 1.2, 1.1),
    }
    section = "\n".join(results.seeds_section(seeded))
    assert "(3 runs)" in section
    assert "meets the store goal on 2, the local-byte goal on 2 and the time goal on 2 of them" in section
    assert "| w seed 3 | ours+stripe+early | **1.0040x (fluid-r1)** |" in section
    missed = "| w seed 4 | ours+stripe+early | 0.90x (fluid-r1) | **1.20x (fluid-r1)** | **1.10x (fluid-r1)** |"
    assert missed in section
    block = results.with_goals(f"{results.BEGIN}\n{results.END}\n", _docs(), seeded)
    assert "On other seeds of the same workloads (3 runs)" in block and "store goal on 2" in block
    page = results.render(_docs(), None, seeded)
    assert page.index("## Other seeds") < page.index("## The baselines as modelled")
    assert "## Other seeds" not in results.render(_docs())


def test_two_runs_that_both_start_at_once_are_equal_on_time_to_first_step() -> None:
    both_zero = _seeded(1.0, 2.0, 0.0)
    for fluid in results.FLUIDS:
        both_zero["policies"][fluid]["ttfs_mean_s"] = 0.0  # type: ignore[index]
    late = _seeded(1.0, 2.0, 0.0)
    late["policies"]["ours+stripe+early"]["ttfs_mean_s"] = 3.0  # type: ignore[index]
    for fluid in results.FLUIDS:
        late["policies"][fluid]["ttfs_mean_s"] = 0.0  # type: ignore[index]
    [(_, _, cells)] = results.goal_ratios({"w": both_zero})
    assert cells[2] == (1.0, "fluid-r1", True)
    [(_, _, cells)] = results.goal_ratios({"w": late})
    assert cells[2][0] == float("inf") and not cells[2][2]


def test_a_ratio_against_zero_is_shown_as_the_two_figures() -> None:
    late = _seeded(1.0, 2.0, 0.0)
    late["policies"]["ours+stripe+early"]["ttfs_mean_s"] = 42.0  # type: ignore[index]
    for fluid in results.FLUIDS:
        late["policies"][fluid]["ttfs_mean_s"] = 0.0  # type: ignore[index]
    [row] = [line for line in results.goals_table({"w": late}) if line.startswith("| w |")]
    assert "**42 s against 0 s (fluid-r1)**" in row and "inf" not in row
    early = _seeded(1.0, 2.0, 0.0)
    early["policies"]["ours+stripe+early"]["ttfs_mean_s"] = 0.0  # type: ignore[index]
    [row] = [line for line in results.goals_table({"w": early}) if line.startswith("| w |")]
    assert "0 s against " in row and "0.00x" not in row
