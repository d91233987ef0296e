"""The agent's Prometheus metrics, rendered in the text exposition format.

Who calls it: :mod:`dsagent.cache.service` counts (hits, misses, bytes fetched, fetch seconds,
evictions); ``GET /metrics`` renders the counters with the service's gauges (free and
used bytes). Counters live in memory and restart from zero with the agent, as
Prometheus expects of counters.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

_HELP = {
    "dsagent_cache_hits_total": ("counter", "Dataset requests served by a ready, digest-matching cached copy."),
    "dsagent_cache_misses_total": ("counter", "Dataset requests that needed a fetch."),
    "dsagent_fetched_bytes_total": ("counter", "Bytes written into the cache by fetches."),
    "dsagent_fetch_seconds_total": ("counter", "Seconds spent in finished fetches."),
    "dsagent_fetches_total": ("counter", "Finished fetches, by result."),
    "dsagent_evictions_total": ("counter", "Dataset versions evicted, by reason."),
    "dsagent_evicted_bytes_total": ("counter", "Bytes freed by evictions."),
    "dsagent_peer_bytes_total": ("counter", "Bundle bytes (compressed) served to and fetched from peer agents, by direction."),
    "dsagent_free_bytes": ("gauge", "Bytes free for the cache (after reservations and the capacity limit)."),
    "dsagent_used_bytes": ("gauge", "Bytes held by cached dataset versions."),
    "dsagent_capacity_bytes": ("gauge", "Bytes the cache may use."),
    "dsagent_datasets": ("gauge", "Cached dataset versions, by state."),
    "dsagent_tasks": ("gauge", "Tasks holding datasets."),
}


@dataclass(frozen=True)
class Sample:
    name: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()


class Metrics:
    """Thread-safe counters keyed by metric name and labels."""

    def __init__(self) -> None:
        self._counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._lock = threading.Lock()

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0.0) + value

    def value(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._counters.get((name, tuple(sorted(labels.items()))), 0.0)

    def render(self, gauges: Mapping[str, float] | list[Sample] | None = None) -> str:
        """The exposition text: every known counter (zero if unseen) plus ``gauges``."""
        with self._lock:
            samples = [Sample(name, value, labels) for (name, labels), value in sorted(self._counters.items())]
        for name in ("dsagent_cache_hits_total", "dsagent_cache_misses_total", "dsagent_fetched_bytes_total", "dsagent_fetch_seconds_total"):
            if not any(s.name == name for s in samples):
                samples.append(Sample(name, 0.0))
        if isinstance(gauges, Mapping):
            samples += [Sample(name, value) for name, value in gauges.items()]
        elif gauges:
            samples += list(gauges)
        return _exposition(samples)


def _exposition(samples: list[Sample]) -> str:
    lines: list[str] = []
    seen: set[str] = set()
    for sample in sorted(samples, key=lambda s: s.name):
        if sample.name not in seen:
            seen.add(sample.name)
            kind, text = _HELP.get(sample.name, ("untyped", sample.name))
            lines += [f"# HELP {sample.name} {text}", f"# TYPE {sample.name} {kind}"]
        labels = ",".join(f'{key}="{_escape(value)}"' for key, value in sample.labels)
        value = repr(float(sample.value)) if sample.value != int(sample.value) else str(int(sample.value))
        lines.append(f"{sample.name}{{{labels}}} {value}" if labels else f"{sample.name} {value}")
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


__all__ = ["Metrics", "Sample"]
