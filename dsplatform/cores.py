"""The cores this process may use: the one count every thread pool and worker count is sized by.

Who calls it: every place that sizes threads or processes by the machine (the digest's and
the pack's threads, the unpack's workers and frame decoders, the walk's listers, the ready
check). What it owns: the rule. ``os.cpu_count()`` counts the machine's CPUs, and a
container may use fewer: those its cpuset allows (``sched_getaffinity``; Kubernetes' static
CPU manager pins a Guaranteed pod's) and its CPU limit (cgroup v2 ``cpu.max``, v1
``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``; 2.5 CPUs count as 3). Threads past the
limit add no speed: the kernel throttles the whole container for the rest of each 100 ms
period once it has used its share, so a ``dsctl`` init container limited to 2 CPUs on a
64-core node would otherwise start 64 readers and stall.

The files are read at each call (a few microseconds; no state kept): a test or an
embedding passes its own ``cgroup`` root.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

#: where a container sees its own cgroup (cgroup namespaces, the default under Kubernetes)
CGROUP = Path("/sys/fs/cgroup")


def cpu_limit(cgroup: Path = CGROUP) -> int | None:
    """The CPU limit of the cgroup at ``cgroup``, rounded up to whole cores; None where it
    has none or the files cannot be read."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else _whole(int(quota), int(period))
    except (OSError, ValueError):
        pass
    for controller in ("cpu", "cpu,cpuacct"):  # cgroup v1
        try:
            quota_us = int((cgroup / controller / "cpu.cfs_quota_us").read_text())
            period_us = int((cgroup / controller / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return _whole(quota_us, period_us)
    return None


def _whole(quota: int, period: int) -> int | None:
    return max(1, math.ceil(quota / period)) if quota > 0 and period > 0 else None


def usable(cgroup: Path = CGROUP) -> int:
    """The cores this process may use: the machine's, within its cpuset and its CPU limit."""
    count = os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        try:
            count = min(count, len(os.sched_getaffinity(0)) or count)
        except OSError:
            pass
    limit = cpu_limit(cgroup)
    return max(1, min(count, limit) if limit is not None else count)


__all__ = ["CGROUP", "cpu_limit", "usable"]
