"""The extender's ``/metrics`` over real HTTP, parsed back with ``prometheus_client.parser``."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from scheduler_plugin.app import create_app
from scheduler_plugin.settings import Settings
from scheduler_plugin.testing import args_body, holding, inventory_json, node, pod, topology_json
from tests.scheduler_plugin.server import serving

IMAGENET = [{"name": "imagenet", "source": "s3://datasets/imagenet", "digest": "a" * 32}]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_count_verbs_latency_parse_failures_and_nodes_scored() -> None:
    topo = topology_json()
    nodes = [
        node("a", inventory=inventory_json(datasets={"imagenet": holding()}), topology=topo, free_gpus=[0, 1, 2, 3]),
        node("b", inventory=inventory_json(), topology=topo, free_gpus=[0]),
    ]
    body = args_body(pod(datasets=IMAGENET, gpus=2), nodes, node_cache_capable=False)
    app = create_app(Settings())
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        for _ in range(3):
            assert http.post("/prioritize", content=body).status_code == 200
        assert http.post("/filter", content=body).status_code == 200
        assert http.post("/filter", content=b"{not json").status_code == 400  # not JSON: a 400, still counted
        assert http.post("/prioritize/dataset", content=b"[]").status_code == 400
        response = http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    got = samples(response.text)
    assert got[("dsplatform_extender_request_duration_seconds_count", (("verb", "prioritize/combined"),))] == 3
    assert got[("dsplatform_extender_request_duration_seconds_count", (("verb", "filter"),))] == 2
    assert got[("dsplatform_extender_requests_total", (("outcome", "ok"), ("verb", "filter")))] == 1
    assert got[("dsplatform_extender_requests_total", (("outcome", "error"), ("verb", "filter")))] == 1
    assert got[("dsplatform_extender_parse_failures_total", (("verb", "filter"),))] == 1
    assert got[("dsplatform_extender_parse_failures_total", (("verb", "prioritize/dataset"),))] == 1
    assert got[("dsplatform_extender_nodes_scored_total", (("verb", "prioritize/combined"),))] == 6
    assert got[("dsplatform_extender_nodes_filtered_total", (("result", "passed"),))] == 1
    assert got[("dsplatform_extender_nodes_filtered_total", (("result", "failed"),))] == 1
    assert ("dsplatform_extender_build_info", (("version", "0.1.0"),)) in got
    # a second app counts on its own: nothing served, every verb's series at 0 (pre-initialised)
    from scheduler_plugin.app import _PRIORITIZE
    from scheduler_plugin.metrics import VERBS

    assert set(VERBS) == {"filter"} | {f"prioritize/{which}" for which in _PRIORITIZE.values()}

    fresh = samples(create_app(Settings()).metrics.render().decode())
    counts = {labels: v for (name, labels), v in fresh.items() if name.endswith("_count")}
    assert counts == {(("verb", verb),): 0 for verb in VERBS}
    for verb in VERBS:
        for outcome in ("ok", "error", "unsynced"):
            assert fresh[("dsplatform_extender_requests_total", (("outcome", outcome), ("verb", verb)))] == 0
