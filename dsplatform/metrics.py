"""The platform's Prometheus metrics: one registry per process object, one naming rule.

Who calls it: each process's metrics class derives from :class:`MetricSet`: the agent's
(:mod:`dsagent.cache.metrics`), the extender's (:mod:`scheduler_plugin.metrics`), the
webhook's (:mod:`dsagent.webhook.admissionmetrics`) and the Dataset controller's
(:mod:`dsagent.controller.controllermetrics`). What it owns (docs/design.md#metrics):

- the names: ``dsplatform_`` then the component (``agent``, ``extender``...) then the metric;
  a counter's ``_total`` is ``prometheus_client``'s;
- a registry of the object's own, never the process-global one (tests run several agents,
  extenders or webhooks in one process, and each must show only its own counts);
- no ``*_created`` twin per counter and histogram (Prometheus' naming guide); the switch is
  process-wide in ``prometheus_client``, thrown here once;
- ``build_info{version}`` = 1, and the exposition text (:meth:`MetricSet.render`).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

#: the exposition format :meth:`MetricSet.render` writes
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "dsplatform_"

disable_created_metrics()  # type: ignore[no-untyped-call]


class MetricSet:
    """The metrics of one process object, in a registry of their own, named
    ``dsplatform_<component>_<name>``; ``version``: its ``build_info`` (None: none)."""

    def __init__(self, component: str, version: str | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.prefix = f"{PREFIX}{component}_"
        if version is not None:
            build = self.gauge("build_info", f"The {component}'s version; always 1.", "version")
            build.labels(version=version).set(1)

    def counter(self, name: str, documentation: str, *labels: str) -> Counter:
        return Counter(self.prefix + name, documentation, labels, registry=self.registry)

    def gauge(self, name: str, documentation: str, *labels: str) -> Gauge:
        return Gauge(self.prefix + name, documentation, labels, registry=self.registry)

    def histogram(
        self, name: str, documentation: str, *labels: str, buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS
    ) -> Histogram:
        return Histogram(self.prefix + name, documentation, labels, buckets=buckets, registry=self.registry)

    def render(self) -> bytes:
        """The exposition text of every metric of this set."""
        return generate_latest(self.registry)


__all__ = ["CONTENT_TYPE", "PREFIX", "MetricSet"]
