"""The JSON every benchmark writes (``--json PATH``), which ``tools/bench/results.py`` turns
into docs/results-performance.md.

One file per run: the benchmark's name, when and where it ran (CPUs, the load average at
its start and end: figures from a loaded machine are only good as ratios), its
parameters, every timed row (a step, a side, wall and CPU seconds) and the ratios it was
run for, each beside its goal.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any


def cpu_model() -> str | None:
    """The processor's model name (Linux), so that figures from two machines of one kind are
    not compared as if from one: ratios against the C tools moved by up to 3x between them."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip() or None
    except OSError:
        pass
    return None


def filesystem(path: Path) -> str:
    """The type of the filesystem holding ``path``: the mount whose point is its longest prefix
    (Linux ``/proc/self/mounts``; "unknown" elsewhere). Where a benchmark's files lie decides
    whether the disk or the CPU is timed."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    where = os.path.realpath(path)
    best, kind = "", "unknown"
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, fields[2]
    return kind


class Record:
    def __init__(self, bench: str, params: dict[str, Any]) -> None:
        self.data: dict[str, Any] = {
            "bench": bench,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": {
                "cpus": os.cpu_count(),
                "machine": platform.machine(),
                "cpu": cpu_model(),
                "python": platform.python_version(),
            },
            "load_start": list(os.getloadavg()),
            "params": params,
            "rows": [],
            "ratios": [],
        }

    def row(self, step: str, side: str, wall: float, cpu: float | None = None, **extra: Any) -> None:
        self.data["rows"].append({"step": step, "side": side, "wall_s": wall, "cpu_s": cpu, **extra})

    def ratio(self, name: str, value: float | None, goal: float | None, note: str = "") -> None:
        """``value``: how many times faster (or, for a share, the share) ours is; ``goal``: the target."""
        self.data["ratios"].append({"name": name, "value": value, "goal": goal, "note": note})

    def write(self, path: Path | None) -> None:
        self.data["load_end"] = list(os.getloadavg())
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.data, indent=1) + "\n")
            print(f"results written to {path}", flush=True)
