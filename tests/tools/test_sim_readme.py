"""The README's simulator block is what ``tools/sim/results.py`` makes of the committed held-out runs,
and the goals are counted against every rival setting."""

from __future__ import annotations

import json

from tests.conftest import REPO_ROOT
from tools.sim import results
from tools.sim.policies import PRODUCT_POLICY


def _docs() -> dict[str, dict[str, object]]:
    out = REPO_ROOT / "tools" / "sim" / "out" / "results"
    return {name: json.loads((out / f"{name}.json").read_text()) for name in results.WORKLOADS}


def _committed_seeds() -> dict[str, dict[str, object]]:
    seeds = REPO_ROOT / "tools" / "sim" / "out" / "results" / "seeds"
    return {
        f"{name} seed {seed}": json.loads((seeds / f"{name}-seed{seed}.json").read_text())
        for name in results.CLAIM_WORKLOADS
        for seed in results.CLAIM_SEEDS
    }


def test_the_readme_block_is_the_committed_held_out_runs() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert results.BEGIN in readme and results.END in readme
    seeded = _committed_seeds()
    assert all(doc.get("product_policy") == PRODUCT_POLICY for doc in seeded.values())
    expected = results.with_goals(readme, seeded)
    assert expected == readme, "re-run: python tools/sim/results.py --render-only"


def test_claims_are_only_measured_on_seeds_no_choice_was_made_on() -> None:
    assert results.CLAIM_SEEDS and not set(results.CLAIM_SEEDS) & set(results.TUNING_SEEDS)
    assert results.main(["--seeds", str(results.TUNING_SEEDS[0]), "--render-only", "--readme", "/nonexistent"]) == 2


def _figures(store: float, local: float, ttfs: float, idle: float = 1.0, jct: float = 10.0) -> dict[str, float]:
    return {
        "storage_bytes": store, "local_fraction": local, "ttfs_mean_s": ttfs, "gpu_hours_idle_for_data": idle,
        "jct_mean_s": jct, "jobs_across_subnets_avoidable": 0, "deadline_misses": 0,
    }  # fmt: skip


def _seeded(store: float, local: float, ttfs: float, idle: float = 1.0, jct: float = 1.0) -> dict[str, object]:
    """A run of every rival setting and the product's, the product at these ratios to each."""
    rival = _figures(100.0, 0.2, 50.0, 10.0, 1000.0)
    ours = _figures(100.0 * store, 0.2 * local, 50.0 * ttfs, 10.0 * idle, 1000.0 * jct)
    return {"policies": {**{p: dict(rival) for p in results.RIVALS}, PRODUCT_POLICY: ours}}


def test_held_out_runs_are_counted_per_goal_and_their_misses_are_bold() -> None:
    seeded = {
        "w seed 2": _seeded(1.0, 2.0, 0.5),
        "w seed 3": _seeded(1.004, 2.0, 0.5),  # a miss that would round to 1.00x
        "w seed 4": _seeded(0.9, 1.2, 1.1, idle=2.0),
    }
    section = "\n".join(results.seeds_section(seeded))
    assert "(3 runs)" in section
    assert "store bytes <= 1.0x 2" in section and "local bytes >= 1.5x best Fluid 2" in section
    assert "GPU-h idle <= 1.0x 2" in section and "avoidable split jobs = 0 3" in section
    assert "| w seed 3 | 2.00x (fluid-r1) | **1.0040x (fluid-r1)** |" in section
    assert (
        "| w seed 4 | **1.20x (fluid-r1)** | 0.90x (fluid-r1) | **1.10x (fluid-r1)** | **2.00x (fluid-r1)** |"
        in section
    )
    block = results.with_goals(f"{results.BEGIN}\n{results.END}\n", seeded)
    assert "Held-out seeds (3 runs)" in block
    page = results.render(_docs(), None, seeded)
    assert page.index("## The claims: held-out seeds") < page.index("## The baselines as modelled")
    assert "## The claims" not in results.render(_docs())


def test_the_store_time_idle_and_job_goals_count_juicefs_too() -> None:
    doc = _seeded(1.0, 2.0, 1.0)
    doc["policies"]["juicefs+pack"]["storage_bytes"] = 50.0  # type: ignore[index]
    doc["policies"]["juicefs"]["local_fraction"] = 0.9  # type: ignore[index]  # not Fluid: not the local reference
    [(_, _, cells)] = results.goal_ratios({"w": doc})
    assert cells[0] == (2.0, "fluid-r1", True)
    assert cells[1] == (2.0, "juicefs+pack", False)


def test_two_runs_that_both_start_at_once_are_equal_on_time_to_first_step() -> None:
    both_zero = _seeded(1.0, 2.0, 0.0)
    for rival in results.RIVALS:
        both_zero["policies"][rival]["ttfs_mean_s"] = 0.0  # type: ignore[index]
    [(_, _, cells)] = results.goal_ratios({"w": both_zero})
    assert cells[2] == (1.0, "fluid-r1", True)
    late = _seeded(1.0, 2.0, 0.0)
    late["policies"][PRODUCT_POLICY]["ttfs_mean_s"] = 3.0  # type: ignore[index]
    for rival in results.RIVALS:
        late["policies"][rival]["ttfs_mean_s"] = 0.0  # type: ignore[index]
    [(_, _, cells)] = results.goal_ratios({"w": late})
    assert cells[2][0] == float("inf") and not cells[2][2]
    [row] = [line for line in results.goals_table({"w": late}) if line.startswith("| w |")]
    assert "**3 s against 0 s (fluid-r1)**" in row and "inf" not in row


def test_a_job_split_across_subnets_it_could_have_avoided_misses_its_goal() -> None:
    doc = _seeded(1.0, 2.0, 1.0)
    doc["policies"][PRODUCT_POLICY]["jobs_across_subnets_avoidable"] = 2  # type: ignore[index]
    [(_, _, cells)] = results.goal_ratios({"w": doc})
    assert cells[-1] == (2, "", False)
