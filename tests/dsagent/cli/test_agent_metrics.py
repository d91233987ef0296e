"""The agent's per-route and per-store metrics as Prometheus scrapes them: a real
``dsagent serve`` caching from a real HTTP bundle store on 127.0.0.1 and a local directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.dsagent.cache.test_metrics import samples
from tests.dsagent.cli.test_agent_process import make_dataset, packed
from tools.support.harness import ADMIN_TOKEN, LoopbackServer

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _value(got: Samples, name: str, **labels: str) -> float:
    return got.get((name, tuple(sorted(labels.items()))), 0.0)


def test_api_latency_is_by_route_template_and_unmatched_paths_share_one_series(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer]
) -> None:
    www, url, _ = loopback
    _, dataset, _ = packed(www, url, "imagenet")
    agent = agent_factory(tcp=True)
    with agent.client(tcp=True, token=ADMIN_TOKEN) as client:
        for task in ("pod-1", "pod-2", "pod-3"):
            assert client.submit_task(task, [dataset], wait=30)["state"] == "ready"
    with httpx.Client(base_url=agent.url, timeout=30, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
        assert http.get("/no/such/route/1").status_code == 404
        assert http.get("/no/such/route/2").status_code == 404
        got = samples(http.get("/metrics").text)
    count = "dsplatform_agent_http_request_duration_seconds_count"
    assert _value(got, count, method="PUT", route="/v1/tasks/{task_id}", status="200") == 3
    assert _value(got, count, method="GET", route="unmatched", status="404") == 2
    assert _value(got, count, method="GET", route="/healthz", status="200") >= 1  # the harness's start-up probe
    routes = {dict(labels).get("route") for name, labels in got if name == count}
    assert not [r for r in routes if r and "pod-" in r], routes  # never a series per task id


def test_store_requests_are_timed_and_their_errors_counted_by_protocol(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], tmp_path: Path
) -> None:
    www, url, _ = loopback
    _, dataset, manifest = packed(www, url, "coco")
    make_dataset(tmp_path / "nfs" / "cifar", 3, 500)
    agent = agent_factory(tcp=True, local_sources=(tmp_path / "nfs",))
    with agent.client(tcp=True, token=ADMIN_TOKEN) as client:
        assert client.submit_task("ok-http", [dataset], wait=30)["state"] == "ready"
        assert (
            client.submit_task("ok-file", [{"name": "cifar", "source": str(tmp_path / "nfs" / "cifar")}], wait=30)[
                "state"
            ]
            == "ready"
        )
        missing = {**dataset, "name": "absent", "bundles": f"{url}/no-store"}
        assert client.submit_task("bad-http", [missing], wait=30)["state"] == "failed"
        got = samples(client.metrics())
    count = "dsplatform_agent_store_request_duration_seconds_count"
    assert _value(got, count, protocol="http") >= 1 + len(manifest.bundles)  # the manifest, then each bundle
    assert _value(got, count, protocol="file") >= 3  # the per-file copy opened each file
    assert _value(got, "dsplatform_agent_store_errors_total", protocol="http", code="not_found") >= 1
    # every allowed protocol is visible before its first request (DSAGENT_PROTOCOLS' default)
    for protocol in ("s3", "gs", "az"):
        assert (count, (("protocol", protocol),)) in got
        assert _value(got, "dsplatform_agent_store_errors_total", protocol=protocol, code="source_unavailable") == 0
        assert ("dsplatform_agent_store_errors_total", (("code", "source_unavailable"), ("protocol", protocol))) in got
