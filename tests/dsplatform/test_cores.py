"""The cores a process may use (dsplatform.cores): the machine's, within the cpuset and the
container's CPU limit, read from cgroup v2 or v1 files laid out as the kernel does."""

from __future__ import annotations

import os
import subprocess
import sys
import time
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


def _proc(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proc-cgroup"
    path.write_text(text)
    return path


def test_the_limit_of_the_process_own_cgroup_and_of_those_above_it(tmp_path: Path) -> None:
    root = tmp_path / "v2"
    _v2(root / "kubepods" / "pod1", "max")
    _v2(root / "kubepods" / "pod1" / "ctr", "max")
    proc = _proc(tmp_path, "0::/kubepods/pod1/ctr\n")
    assert cores.cpu_limit(root, proc) is None
    _v2(root / "kubepods" / "pod1", "150000 100000")  # the pod's limit holds its containers too
    assert cores.cpu_limit(root, proc) == 2
    _v2(root / "kubepods" / "pod1" / "ctr", "50000 100000")  # the lowest of them
    assert cores.cpu_limit(root, proc) == 1
    _v2(root, "400000 100000")  # the root's (a namespaced container's own) counts as well
    assert cores.cpu_limit(root, _proc(tmp_path, "0::/elsewhere\n")) == 4  # a path not under this mount: its root


def test_a_cgroup_v1_process_path_under_the_cpu_controllers_mount(tmp_path: Path) -> None:
    root = tmp_path / "v1"
    _v1(root / "cpu,cpuacct" / "kubepods", 300000, 100000, controller="pod1")  # the pod's limit
    _v1(root / "cpu,cpuacct" / "kubepods" / "pod1", -1, 100000, controller="ctr")  # none of its own
    proc = _proc(tmp_path, "12:memory:/kubepods/pod1/ctr\n4:cpu,cpuacct:/kubepods/pod1/ctr\n0::/\n")
    assert cores.cpu_limit(root, proc) == 3


@pytest.mark.parametrize(
    "junk", ["", "garbage", "0::", "4:cpu:/../../etc", "0::/" + "/".join(["a"] * 5000), "\x00" * 100]
)
def test_a_proc_file_of_nonsense_reads_the_mount_root(tmp_path: Path, junk: str) -> None:
    root = _v2(tmp_path / "v2", "200000 100000")
    assert cores.cpu_limit(root, _proc(tmp_path, junk)) == 2
    assert cores.cpu_limit(root, tmp_path / "no-such-file") == 2


def _cpu_cgroup_parent() -> tuple[Path, str] | None:
    """Where this test may make a cgroup with a CPU limit, and its version; None where the
    machine's cgroup mounts offer none (no rights are checked here)."""
    for mount in (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct")):
        if (mount / "cpu.cfs_quota_us").is_file():
            return mount, "v1"
    control = Path("/sys/fs/cgroup/cgroup.subtree_control")
    if control.is_file() and "cpu" in control.read_text().split():
        return control.parent, "v2"
    return None


def test_a_process_in_a_real_cgroup_with_a_cpu_limit_counts_that_limit() -> None:
    found = _cpu_cgroup_parent()
    if found is None or os.geteuid() != 0:
        pytest.skip("making a cgroup needs root and a cgroup mount with the cpu controller")
    parent, version = found
    group = parent / f"dsplatform-test-cores-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup under {parent}: {exc}")
    try:
        if version == "v1":
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text("50000")
        else:
            (group / "cpu.max").write_text("50000 100000")
        script = "from dsplatform import cores; print(cores.cpu_limit(), cores.usable())"
        # the child moves itself into the cgroup, then runs the count there
        enter = f'echo $$ > "{group}/cgroup.procs" && exec "$0" -c "$1"'
        out = subprocess.run(
            ["sh", "-c", enter, sys.executable, script], capture_output=True, text=True, timeout=120, check=True
        )
        assert out.stdout.split() == ["1", "1"]  # half a core: one, whatever the machine has
    finally:
        for _ in range(50):  # the child has exited; the kernel empties its cgroup just after
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
