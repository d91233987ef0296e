"""Opt-in required dataset affinity, over real HTTP as kube-scheduler sends the request."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from scheduler_plugin.app import create_app
from scheduler_plugin.settings import Settings
from scheduler_plugin.testing import args_body, holding, inventory_json, node, pod, topology_json
from tests.scheduler_plugin.server import serving

IMAGENET = [{"name": "imagenet", "source": "s3://datasets/imagenet", "digest": "a" * 32}]


def cluster() -> list[dict[str, Any]]:
    topo = topology_json()
    return [
        node("holds", inventory=inventory_json(datasets={"imagenet": holding()}), topology=topo, free_gpus=[0, 1]),
        node(
            "stale", inventory=inventory_json(datasets={"imagenet": holding("b" * 32)}), topology=topo, free_gpus=[0, 1]
        ),
        node(
            "fetching",
            inventory=inventory_json(datasets={"imagenet": holding(state="fetching")}),
            topology=topo,
            free_gpus=[0, 1],
        ),
        node("empty", inventory=inventory_json(), topology=topo, free_gpus=[0, 1]),
        node("no-agent", topology=topo, free_gpus=[0, 1]),
    ]


def passed(result: dict[str, Any]) -> list[str]:
    return [n["metadata"]["name"] for n in result["Nodes"]["items"]]


def with_affinity(value: str | None) -> dict[str, Any]:
    obj = pod(datasets=IMAGENET, gpus=1)
    if value is not None:
        obj["metadata"]["annotations"]["dsagent.io/dataset-affinity"] = value
    return obj


@pytest.fixture(scope="module")
def http() -> Any:
    with serving(create_app(Settings())) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def test_required_affinity_fails_every_node_without_the_current_version(http: httpx.Client) -> None:
    result = http.post(
        "/filter", content=args_body(with_affinity("required"), cluster(), node_cache_capable=False)
    ).json()
    assert passed(result) == ["holds"] and result["Error"] == ""
    assert sorted(result["FailedAndUnresolvableNodes"]) == ["empty", "fetching", "no-agent", "stale"]
    assert "requires dataset imagenet" in result["FailedAndUnresolvableNodes"]["stale"]


@pytest.mark.parametrize("value", [None, "preferred", "REQUIRED-ish", "", "{}"])
def test_without_the_opt_in_dataset_affinity_stays_a_preference(http: httpx.Client, value: str | None) -> None:
    result = http.post("/filter", content=args_body(with_affinity(value), cluster(), node_cache_capable=False)).json()
    assert passed(result) == ["holds", "stale", "fetching", "empty", "no-agent"]


def test_required_affinity_without_datasets_filters_nothing(http: httpx.Client) -> None:
    obj = pod(gpus=1)
    obj["metadata"]["annotations"]["dsagent.io/dataset-affinity"] = "Required"
    result = http.post("/filter", content=args_body(obj, cluster(), node_cache_capable=False)).json()
    assert len(passed(result)) == 5
