"""The published performance figures are what ``tools/bench/results.py`` makes of the
committed benchmark JSON: the results page and the README's figures block, never edited by
hand (and a README figure always has its goal and its load beside it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tools.bench import results


def _committed_runs() -> list[dict]:
    return results.read_runs(sorted(results.DATA.glob("*.json")))


def test_the_results_page_is_the_rendering_of_the_committed_json() -> None:
    runs = _committed_runs()
    assert runs, f"no benchmark JSON under {results.DATA}"
    assert results.PAGE.read_text() == results.render(runs)


def test_the_readme_figures_are_the_committed_json_with_goal_and_load() -> None:
    runs = _committed_runs()
    readme = results.README.read_text()
    assert results.with_figures(readme, runs) == readme
    block = readme[readme.index(results.BEGIN) : readme.index(results.END)]
    rows = [line for line in block.splitlines() if line.startswith("| ") and "---" not in line][1:]
    names = {results._row_name(r["name"]) for run in runs for r in run.get("ratios", []) if r.get("goal") is not None}
    assert len(rows) == len(names) > 0
    cell = r"(-|[0-9.]+x \((met|not met)\), [0-9.]+ / [0-9.]+)"
    for row in rows:
        assert re.search(rf"\| [0-9.]+x( \| {cell})+ \|$", row), row


def test_one_ratio_on_two_machine_sizes_is_one_row_with_a_column_each() -> None:
    def run(cpus: int, value: float, load: float) -> dict[str, object]:
        name = f"digest vs find | xargs -P{cpus} xxh128sum"
        return {"bench": "bundle", "host": {"cpus": cpus}, "load_start": [load], "load_end": [load],
                "ratios": [{"name": name, "value": value, "goal": 1.0}]}  # fmt: skip

    block = results.figures([run(2, 1.13, 1.1), run(16, 0.34, 0.2), run(2, 1.2, 0.9)])
    lines = block.splitlines()
    assert lines[1] == "| what users feel | goal | 2 CPUs (load start / end) | 16 CPUs (load start / end) |"
    # the later 2-CPU run replaces the earlier one; the 16-CPU run has its own column
    assert lines[3:-1] == [
        "| digest vs find \\| xargs -P$(nproc) xxh128sum | 1.00x "
        "| 1.20x (met), 0.9 / 0.9 | 0.34x (not met), 0.2 / 0.2 |"
    ]


def test_runs_on_as_many_cpus_of_two_models_get_a_column_each_named_by_model() -> None:
    def run(cpus: int, cpu: str, value: float) -> dict[str, object]:
        return {"bench": "bundle", "host": {"cpus": cpus, "cpu": cpu}, "load_start": [0.5], "load_end": [0.5],
                "ratios": [{"name": "pack vs tar", "value": value, "goal": 1.5}]}  # fmt: skip

    block = results.figures(
        [run(2, "AMD EPYC", 1.6), run(2, "Intel(R) Xeon(R) Processor", 1.3), run(16, "Intel(R) Xeon(R) Processor", 1.1)]
    )
    lines = block.splitlines()
    assert lines[1] == (
        "| what users feel | goal | 2 CPUs, AMD EPYC (load start / end) | 2 CPUs, Intel Xeon (load start / end)"
        " | 16 CPUs (load start / end) |"
    )
    # a later run on the other model does not replace the first: each machine keeps its figure
    assert lines[3] == (
        "| pack vs tar | 1.50x | 1.60x (met), 0.5 / 0.5 | 1.30x (not met), 0.5 / 0.5 | 1.10x (not met), 0.5 / 0.5 |"
    )


def test_a_run_that_leaves_rows_out_says_which_and_why_on_the_page() -> None:
    run = {"bench": "bundle", "started": "2026-01-02T03:04:05Z", "host": {"cpus": 16}, "load_start": [0.1],
           "load_end": [0.2], "ratios": [{"name": "pack vs tar", "value": 1.2, "goal": 1.5}], "rows": [],
           "excluded": "unpack: taken with a build that was not kept"}  # fmt: skip
    page = results.render([run])
    assert "Left out of the run of 2026-01-02T03:04:05Z: unpack: taken with a build that was not kept." in page
    assert "Left out" not in results.render([{**run, "excluded": None}])


def test_a_new_run_replaces_the_block_and_nothing_else(tmp_path: Path) -> None:
    run = {
        "bench": "bundle",
        "started": "2026-01-01T00:00:00Z",
        "load_start": [0.4, 0.3, 0.2],
        "load_end": [0.6, 0.3, 0.2],
        "ratios": [{"name": "pack vs tar | zstd", "value": 1.6, "goal": 1.5}, {"name": "untargeted", "value": 2.0}],
    }
    readme = f"# x\n\nbefore\n\n{results.BEGIN}\nold\n{results.END}\n\nafter\n"
    new = results.with_figures(readme, [run])
    assert new.startswith("# x\n\nbefore\n\n") and new.endswith("\n\nafter\n") and "old" not in new
    assert "| pack vs tar \\| zstd | 1.50x | 1.60x (met), 0.4 / 0.6 |" in new and "untargeted" not in new
    (tmp_path / "r.json").write_text(json.dumps(run))
    assert results.read_runs([tmp_path / "r.json"]) == [run]


def test_a_ratio_just_under_its_goal_does_not_print_as_the_goal() -> None:
    run = {
        "bench": "bundle",
        "load_start": [0.4, 0.3, 0.2],
        "ratios": [{"name": "short", "value": 0.9966, "goal": 1.0}, {"name": "over", "value": 1.0012, "goal": 1.0}],
    }
    block = results.figures([run])
    assert "| short | 1.00x | 0.997x (not met), 0.4 / nan |" in block
    assert "| over | 1.00x | 1.00x (met), 0.4 / nan |" in block
