"""The extender's Prometheus metrics, kept by ``prometheus_client``.

Who calls it: :class:`scheduler_plugin.app.ExtenderApp` records each kube-scheduler verb
(``filter``, ``prioritize/<which>``) as it is served and answers ``GET /metrics`` with
:meth:`ExtenderMetrics.render`. One :class:`~prometheus_client.CollectorRegistry` per app,
never the process-global one, so tests can run several apps in one process.

- ``dsplatform_extender_request_duration_seconds{verb}``: a histogram of the time each verb
  took to decode, score and encode (the reply's send excluded);
- ``dsplatform_extender_requests_total{verb,outcome}``: ``ok``, ``error`` (a 200 with
  ``Error`` set or all-zero scores) or ``unsynced`` (the node view was not ready);
- ``dsplatform_extender_parse_failures_total{verb}``: bodies that were not valid
  ExtenderArgs (or too large);
- ``dsplatform_extender_nodes_scored_total{verb}``: nodes given a score;
- ``dsplatform_extender_nodes_filtered_total{result}``: nodes passed or failed by filter;
- ``dsplatform_extender_waiting_jobs``: the multi-worker jobs kube-scheduler could not
  place, for which nodes with every GPU free are kept whole (watch mode; read at each
  scrape; docs/design.md#whole-nodes);
- ``dsplatform_extender_build_info{version}`` = 1.

Every verb's series exist (at 0) from the start (:data:`VERBS`): an error ratio and a
per-verb latency panel read 0, not "no data", before the first request. The prefix is the
platform's (``dsplatform_``) then the component's (docs/design.md#metrics).
"""

from __future__ import annotations

from dsplatform.metrics import CONTENT_TYPE, MetricSet

#: kube-scheduler's verbs, as :class:`scheduler_plugin.app.ExtenderApp` names them
VERBS = (
    "filter",
    "prioritize/combined",
    "prioritize/dataset",
    "prioritize/roce",
    "prioritize/numa",
    "prioritize/time",
)
# 100 us .. 10 s: a tiny request to a 5,000-node body on a loaded scheduler
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class ExtenderMetrics(MetricSet):
    def __init__(self, version: str = "0.1.0") -> None:
        super().__init__("extender", version)
        self.latency = self.histogram(
            "request_duration_seconds", "Seconds a scheduler verb took, by verb.", "verb", buckets=LATENCY_BUCKETS
        )
        self.requests = self.counter(
            "requests", "Scheduler verbs served, by verb and outcome (ok, error, unsynced).", "verb", "outcome"
        )
        self.parse_failures = self.counter(
            "parse_failures", "Request bodies that were not valid ExtenderArgs, by verb.", "verb"
        )
        self.nodes_scored = self.counter("nodes_scored", "Nodes given a score, by verb.", "verb")
        self.nodes_filtered = self.counter(
            "nodes_filtered", "Nodes judged by filter, by result (passed, failed).", "result"
        )
        for result in ("passed", "failed"):
            self.nodes_filtered.labels(result=result)
        self.waiting_jobs = self.gauge(
            "waiting_jobs", "Multi-worker jobs kube-scheduler could not place, kept whole nodes for (watch mode)."
        )
        # an error-ratio alert and a latency panel need the series before the first request
        for verb in VERBS:
            self.latency.labels(verb=verb)
            self.parse_failures.labels(verb=verb)
            for outcome in ("ok", "error", "unsynced"):
                self.requests.labels(verb=verb, outcome=outcome)
        for verb in VERBS[1:]:
            self.nodes_scored.labels(verb=verb)

    def observe(self, verb: str, seconds: float, outcome: str) -> None:
        self.latency.labels(verb=verb).observe(seconds)
        self.requests.labels(verb=verb, outcome=outcome).inc()


__all__ = ["CONTENT_TYPE", "ExtenderMetrics"]
