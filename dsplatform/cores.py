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

Which cgroup: the process's own, as ``/proc/self/cgroup`` names it, and every cgroup above
it (a limit on a parent, a systemd slice or a pod's cgroup, holds its children too): the
fewest cores any of them allows. Inside a container with a cgroup namespace (the default
under cgroup v2) the process's cgroup is the mount's root; where the named path is not
under the mount (a cgroup v1 container whose mount is its own cgroup), the mount's root is
the process's cgroup.

The files are read at each call (some tens of microseconds; no state kept): a test or an
embedding passes its own ``cgroup`` root and ``proc`` file. Paths are plain strings
(``os.path``): ``dsctl digest`` and ``pack`` size their threads here and import no pathlib.
"""

from __future__ import annotations

import math
import os

#: where a container sees its own cgroup (cgroup namespaces, the default under Kubernetes)
CGROUP = "/sys/fs/cgroup"


#: where the kernel names this process's cgroups
PROC_CGROUP = "/proc/self/cgroup"

#: the most cgroups above a process's that are read (the kernel nests cgroups at most
#: ``cgroup.max.depth`` deep, unlimited by default; real hierarchies are a few levels)
MAX_DEPTH = 32


def cpu_limit(cgroup: str | os.PathLike[str] = CGROUP, proc: str | os.PathLike[str] = PROC_CGROUP) -> int | None:
    """The CPU limit of this process's cgroups under the mount at ``cgroup`` (``proc``:
    the file naming them), rounded up to whole cores: the lowest of its own cgroup's and
    those above it; None where none has one or the files cannot be read."""
    own = _own_cgroups(proc)
    limits = [_v2_limit(d) for d in _upwards(os.fspath(cgroup), own.get(""))]
    for controller in ("cpu", "cpu,cpuacct"):  # cgroup v1: the mount named by its controllers
        mount = os.path.join(cgroup, controller)
        limits += [_v1_limit(d) for d in _upwards(mount, own.get("cpu"))]
    found = [limit for limit in limits if limit is not None]
    return min(found) if found else None


def _own_cgroups(proc: str | os.PathLike[str]) -> dict[str, str]:
    """``/proc/self/cgroup`` as controller -> path: ``""`` for the cgroup v2 hierarchy, ``"cpu"``
    for the v1 one the cpu controller is in; empty where it cannot be read."""
    try:
        with open(proc, encoding="utf-8", errors="replace") as file:
            text = file.read(65536)  # a few lines from the kernel; no more is read
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        ident, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if ident == "0" and not controllers:
            out[""] = path
        elif "cpu" in controllers.split(","):
            out["cpu"] = path
    return out


def _upwards(mount: str, path: str | None) -> list[str]:
    """The cgroup directories from the process's own up to the mount's root (the root
    alone where the path is unknown or not under this mount)."""
    parts = [p for p in (path or "").split("/") if p and p not in (".", "..")][:MAX_DEPTH]
    if not parts or not os.path.isdir(os.path.join(mount, *parts)):
        return [mount]
    return [os.path.join(mount, *parts[:i]) for i in range(len(parts), -1, -1)]


def _read(path: str) -> str:
    with open(path) as file:
        return file.read()


def _v2_limit(cgroup: str) -> int | None:
    try:
        quota, period = _read(os.path.join(cgroup, "cpu.max")).split()[:2]
        return None if quota == "max" else _whole(int(quota), int(period))
    except (OSError, ValueError):
        return None


def _v1_limit(cgroup: str) -> int | None:
    try:
        quota_us = int(_read(os.path.join(cgroup, "cpu.cfs_quota_us")))
        period_us = int(_read(os.path.join(cgroup, "cpu.cfs_period_us")))
    except (OSError, ValueError):
        return None
    return _whole(quota_us, period_us)


def _whole(quota: int, period: int) -> int | None:
    return max(1, math.ceil(quota / period)) if quota > 0 and period > 0 else None


def usable(cgroup: str | os.PathLike[str] = CGROUP, proc: str | os.PathLike[str] = PROC_CGROUP) -> int:
    """The cores this process may use: the machine's, within its cpuset and its CPU limit."""
    count = os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        try:
            count = min(count, len(os.sched_getaffinity(0)) or count)
        except OSError:
            pass
    limit = cpu_limit(cgroup, proc)
    return max(1, min(count, limit) if limit is not None else count)


__all__ = ["CGROUP", "MAX_DEPTH", "PROC_CGROUP", "cpu_limit", "usable"]
