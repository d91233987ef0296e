"""The fake API server keeps the API server's pod update rules (tools/support/podrules.py):
what a controller may change on a gated pod, over real HTTP with the unmodified client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from tools.support.fake_apiserver import FakeApiServer, make_pod

GATE = {"name": "dsagent.io/deadline-plan"}
PIN = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


@pytest.fixture
def core() -> Iterator[tuple[FakeApiServer, Any]]:
    with FakeApiServer() as server:
        client = server.api_client()
        try:
            yield server, CoreV1Api(client)
        finally:
            client.close()


def patch(core: Any, ops: list[dict[str, Any]]) -> None:
    core.patch_namespaced_pod("p", "default", ops, _content_type="application/json-patch+json")


def test_a_gated_pod_may_be_narrowed_and_released(core: tuple[FakeApiServer, Any]) -> None:
    server, api = core
    pod = make_pod("p", gpus=2, labels={"a": "b"})
    pod["spec"]["schedulingGates"] = [GATE]
    pod["spec"]["affinity"] = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": []}]}}}
    server.create(pod)
    patch(
        api,
        [
            {
                "op": "add",
                "path": f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms/0/matchFields",
                "value": [PIN],
            }
        ],
    )
    patch(api, [{"op": "add", "path": "/spec/nodeSelector", "value": {"zone": "a"}}])
    patch(api, [{"op": "remove", "path": "/spec/schedulingGates/0"}])
    stored = server.get("pods", "p", "default")
    assert stored is not None and "schedulingGates" in stored["spec"] and stored["spec"]["schedulingGates"] == []
    # released: no more narrowing
    with pytest.raises(ApiException) as refused:
        patch(api, [{"op": "add", "path": "/spec/nodeSelector/rack", "value": "r1"}])
    assert refused.value.status == 422


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ([{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "x/y"}}], "only deletion is allowed"),
        (
            [{"op": "replace", "path": "/spec/containers/0/resources/requests/nvidia.com~1gpu", "value": "4"}],
            "may not change",
        ),
        ([{"op": "replace", "path": "/spec/nodeSelector/zone", "value": "b"}], "only additions"),
        (
            [
                {
                    "op": "add",
                    "path": f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms/-",
                    "value": {"matchFields": [PIN]},
                }
            ],
            "no additions/deletions",
        ),
        (
            [
                {
                    "op": "replace",
                    "path": f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms/0/matchFields/0/values/0",
                    "value": "n2",
                }
            ],
            "only additions",
        ),
    ],
)
def test_what_kubernetes_refuses_on_a_gated_pod(
    core: tuple[FakeApiServer, Any], ops: list[dict[str, Any]], message: str
) -> None:
    server, api = core
    pod = make_pod("p", gpus=2)
    pod["spec"]["schedulingGates"] = [GATE]
    pod["spec"]["nodeSelector"] = {"zone": "a"}
    pod["spec"]["affinity"] = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchFields": [PIN]}]}}}
    server.create(pod)
    with pytest.raises(ApiException) as refused:
        patch(api, ops)
    assert refused.value.status == 422 and message in refused.value.body
