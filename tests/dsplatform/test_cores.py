"""The cores a process may use (dsplatform.cores): the machine's, within the cpuset and the
container's CPU limit, read from cgroup v2 or v1 files laid out as the kernel does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dsplatform import cores


def _v2(root: Path, cpu_max: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cpu.max").write_text(cpu_max + "\n")
    return root


def _v1(root: Path, quota: int, period: int, controller: str = "cpu,cpuacct") -> Path:
    (root / controller).mkdir(parents=True)
    (root / controller / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (root / controller / "cpu.cfs_period_us").write_text(f"{period}\n")
    return root


@pytest.mark.parametrize(
    ("cpu_max", "limit"),
    [("max 100000", None), ("200000 100000", 2), ("250000 100000", 3), ("50000 100000", 1), ("100000 50000", 2)],
)
def test_a_cgroup_v2_limit_is_whole_cores_rounded_up(tmp_path: Path, cpu_max: str, limit: int | None) -> None:
    assert cores.cpu_limit(_v2(tmp_path, cpu_max)) == limit


def test_a_cgroup_v1_limit_and_no_limit(tmp_path: Path) -> None:
    assert cores.cpu_limit(_v1(tmp_path / "a", 150000, 100000)) == 2
    assert cores.cpu_limit(_v1(tmp_path / "b", -1, 100000, controller="cpu")) is None  # no quota
    assert cores.cpu_limit(tmp_path / "none") is None  # no cgroup files at all


@pytest.mark.parametrize("junk", ["", "max", "lots 100000", "100000 0", "-5 100000"])
def test_unreadable_or_nonsense_files_mean_no_limit(tmp_path: Path, junk: str) -> None:
    assert cores.cpu_limit(_v2(tmp_path, junk)) is None


def test_the_usable_cores_are_the_fewest_of_machine_cpuset_and_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert cores.usable(tmp_path / "none") == 16  # the cpuset
    assert cores.usable(_v2(tmp_path / "lim", "250000 100000")) == 3  # the CPU limit
    assert cores.usable(_v2(tmp_path / "big", "9900000 100000")) == 16  # a limit above the cpuset
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(), raising=False)
    assert cores.usable(tmp_path / "none") == 1  # nothing known: one


def test_this_process_counts_at_least_one_and_at_most_the_machines() -> None:
    assert 1 <= cores.usable() <= (os.cpu_count() or 1)
