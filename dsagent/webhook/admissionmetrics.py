"""The admission webhook's Prometheus metrics, kept by ``prometheus_client``.

Who calls it: :func:`dsagent.webhook.server.create_app` counts every
AdmissionReview by outcome, times it, and answers ``GET /metrics`` with :meth:`render`.
One registry per app, never the process-global one, so tests can run several apps.

The webhook never blocks a pod: whatever fails, the pod is admitted, without its dataset
wiring or its GPU class. Those failures were visible only as warnings in ``kubectl`` and
in the kube-apiserver's ``apiserver_admission_webhook_fail_open_count`` (which counts only a
webhook that did not answer). These metrics count them where they happen
(docs/design.md#metrics):

- ``dsplatform_webhook_admissions_total{outcome}``: ``patched`` (datasets wired or a GPU
  class assigned), ``unpatched`` (nothing to do: no datasets, not a pod CREATE),
  ``failed_open`` (a part failed and the pod was admitted without it: a missing Dataset, an
  unreachable API server, a bug), ``invalid`` (not an AdmissionReview: answered 400, and the
  API server's ``failurePolicy: Ignore`` admits the pod unmutated); every outcome is
  pre-initialised, so a failure ratio reads 0 before the first failure;
- ``dsplatform_webhook_request_duration_seconds{route}``: seconds per request (``/mutate``);
- ``dsplatform_webhook_node_reads_total{source}``: where the class vote's views and the
  deadline plans read the Nodes, ``watch`` (the webhook's list+watch) or ``list`` (listed for
  themselves: the watch not synced yet, failing, or ``webhook.watchNodes: false``);
- ``dsplatform_webhook_build_info{version}`` = 1.
"""

from __future__ import annotations

from dsagent import __version__
from dsagent.kube.nodewatch import NodeReads
from dsplatform.metrics import CONTENT_TYPE, MetricSet

OUTCOMES = ("patched", "unpatched", "failed_open", "invalid")
# 1 ms .. 10 s: the API server's webhook timeout is 10 s at most (the chart sets 5 s)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class WebhookMetrics(MetricSet):
    def __init__(self, version: str = __version__) -> None:
        super().__init__("webhook", version)
        self.admissions = self.counter(
            "admissions", "AdmissionReviews answered, by outcome (patched, unpatched, failed_open, invalid).", "outcome"
        )
        self.latency = self.histogram(
            "request_duration_seconds", "Seconds an admission request took, by route.", "route", buckets=LATENCY_BUCKETS
        )
        self.node_reads = NodeReads(
            self, "Reads of the Nodes by the class vote and the deadline plans, by source: watch (list+watch) or list."
        )
        for outcome in OUTCOMES:
            self.admissions.labels(outcome=outcome)
        self.latency.labels(route="/mutate")

    def admitted(self, outcome: str, seconds: float) -> None:
        self.admissions.labels(outcome=outcome).inc()
        self.latency.labels(route="/mutate").observe(seconds)


__all__ = ["CONTENT_TYPE", "OUTCOMES", "WebhookMetrics"]
