"""The Dataset controller's metrics and its probe port.

Who calls it: :class:`dsagent.controller.reconcile.DatasetController` counts into
:class:`ControllerMetrics`; :func:`dsagent.controller.process.main` serves them with
:func:`serve_metrics` when ``DSAGENT_CONTROLLER_METRICS_PORT`` is set.
"""

from __future__ import annotations

from typing import Any

from dsagent.kube.nodewatch import NodeReads
from dsplatform.metrics import MetricSet


class ControllerMetrics(MetricSet):
    """The controller's own registry (``GET /metrics`` on ``DSAGENT_CONTROLLER_METRICS_PORT``)."""

    def __init__(self) -> None:
        super().__init__("controller")
        self.leader = self.gauge("leader", "1 while this replica holds the Lease.")
        self.passes = self.counter("passes", "Reconcile passes, by result.", "result")
        self.pass_seconds = self.histogram("pass_seconds", "Seconds one pass over every Dataset took.")
        self.datasets = self.counter("reconciles", "Datasets reconciled, by result.", "result")
        self.pack_jobs = self.counter("pack_jobs", "Pack Jobs created for new source listings.")
        self.node_reads = NodeReads(
            self, "Passes' reads of the Nodes, by source: watch (list+watch) or list (the watch not synced or failing)."
        )
        self.pod_reads = NodeReads(
            self,
            "Passes' reads of every pod, by source: watch (list+watch, started by the first pass that reads them) "
            "or list (the watch off, not synced or failing).",
            name="pod_reads",
        )
        self.preparations = self.gauge(
            "preparations",
            "Pods whose datasets are being prepared on the node predicted for them, by phase (1 reserved, 2 fetching).",
            "phase",
        )
        self.preparation_releases = self.counter(
            "preparation_releases",
            "Prepare tasks released because the plan dropped them (bound, gone, predicted elsewhere).",
        )
        self.gone_releases = self.counter(
            "gone_dataset_releases",
            "Agent tasks and preparations released because their Dataset is gone, by kind (warm, replica, prepare).",
            "kind",
        )
        self.versions_by_copies = self.gauge(
            "dataset_versions", "Dataset versions held ready somewhere in the cluster, by copies (1, 2, 3+).", "copies"
        )
        for result in ("ok", "error"):  # series exist before the first error
            self.passes.labels(result=result)
            self.datasets.labels(result=result)
        for kind in ("warm", "replica", "prepare"):
            self.gone_releases.labels(kind=kind)


def serve_metrics(port: int, registry: Any, host: str = "0.0.0.0") -> Any:
    """``/metrics``, ``/healthz`` and ``/readyz`` on ``port`` in a daemon thread; returns the server.

    prometheus_client's own server answered every path with the metrics text, so the
    liveness probe's ``/healthz`` got Prometheus text where every other process answers
    the one probe body (docs/design.md#probes). The controller is alive and ready while
    this thread serves: a standby replica is ready too (it takes over when the leader goes).
    """
    import threading
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer

    from dsplatform import probes

    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if path not in ("/healthz", "/readyz"):
            return metrics(environ, start_response)
        status, body = probes.encoded(probes.OK if path == "/healthz" else probes.READY)
        start_response(f"{status} OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass  # a probe every few seconds is not worth a log line

    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, name="controller-metrics", daemon=True).start()
    return server


__all__ = ["ControllerMetrics", "serve_metrics"]
