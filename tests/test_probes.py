"""One probe body shape for every process (issue 23): the agent, the extender, the webhook
and the controller answer ``/healthz`` and ``/readyz`` with ``{"status": ...}`` (plus
``detail`` when not ready). The agent's, extender's and webhook's are checked over real HTTP
in their own tests; the controller's metrics port is served for real here."""

from __future__ import annotations

import httpx
import pytest

from dsagent.controller.controllermetrics import ControllerMetrics, serve_metrics
from dsplatform import probes


def test_the_controllers_port_answers_probes_in_the_one_shape_and_metrics_beside_them() -> None:
    metrics = ControllerMetrics()
    server = serve_metrics(0, metrics.registry, host="127.0.0.1")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.server_port}", timeout=30) as http:
            health, ready, text = http.get("/healthz"), http.get("/readyz"), http.get("/metrics")
    finally:
        server.shutdown()
        server.server_close()
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    assert health.headers["content-type"] == "application/json"
    assert "dsplatform_controller_passes_total" in text.text


@pytest.mark.parametrize(
    ("status", "detail", "code", "body"),
    [
        ("ok", None, 200, {"status": "ok"}),
        ("ready", None, 200, {"status": "ready"}),
        ("syncing", "no list yet", 503, {"status": "syncing", "detail": "no list yet"}),
        ("stalled", "waited", 503, {"status": "stalled", "detail": "waited"}),
        ("starting", None, 503, {"status": "starting"}),
    ],
)
def test_a_status_has_one_http_code_and_one_body(status: str, detail: str | None, code: int, body: dict) -> None:
    assert probes.http_status(status) == code and probes.body(status, detail) == body


def test_an_unknown_status_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown probe status"):
        probes.body("fine")
