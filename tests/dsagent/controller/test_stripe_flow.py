"""Stripe groups held by the Dataset controller (docs/design-striping.md#group): on the fake API
server, a Dataset with ``spec.stripe`` gets a group chosen from the node inventories, each
member's agent is asked to hold its share with the group and the peers' URLs, and
``status.stripe`` reports each member's held and owned bytes."""

from __future__ import annotations

import json
from typing import Any

from dsagent.controller.controllersettings import ControllerSettings
from dsagent.controller.reconcile import DatasetController
from dsagent.controller.striping import parse_stripe, stripe_status
from tests.dsagent.controller.test_controller import NS, Clock, agent_pod
from tests.dsagent.harness import ADMIN_TOKEN
from tests.fake_apiserver import FakeApiServer, make_dataset, make_node

DIGEST = "b" * 32
GB = 1 << 30


def _inventory(node: str, *, free: int, held: int = 0) -> str:
    doc: dict[str, Any] = {"version": 1, "node": node, "capacityBytes": 100 * GB, "freeBytes": free, "datasets": {}}
    if held:
        doc["stripes"] = {"big": {"digest": DIGEST, "sizeBytes": 150 * GB, "heldBytes": held, "members": 4}}
    return json.dumps(doc)


def test_spec_stripe_is_auto_or_a_member_count() -> None:
    assert parse_stripe("auto") == "auto" and parse_stripe({"members": 3}) == 3
    assert parse_stripe({"members": 0}) is None and parse_stripe(True) is None and parse_stripe(None) is None


def test_the_controller_chooses_a_group_and_holds_every_members_share(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    frees = {"n1": 60 * GB, "n2": 90 * GB, "n3": 10 * GB, "n4": 80 * GB, "n5": 70 * GB}
    for node, free in frees.items():
        held = 30 * GB if node == "n3" else 0  # n3 holds bundles already: chosen although nearly full
        apiserver.create(make_node(node, annotations={"dsagent.io/inventory": _inventory(node, free=free, held=held)}))
        apiserver.create(agent_pod(node))
    ds = make_dataset("big", namespace="ml", bundles="s3://store/packs", status={"digest": DIGEST, "bytes": 150 * GB})
    ds["spec"]["stripe"] = "auto"
    apiserver.create(ds)
    asked: list[tuple[str, str, str, Any]] = []

    def agent(node: str, method: str, path: str, body: Any, acting_for: str) -> tuple[int, Any] | None:
        assert acting_for == "ml/big"  # every request names its Dataset (docs/operator-guide/tenancy.md)
        asked.append((node, method, path, body))
        done = node == "n3"
        return 200, {"complete": done, "bytesHeld": 30 * GB if done else 0, "bytesOwned": 30 * GB}

    settings = ControllerSettings(namespace=NS, identity="c-1", admin_token=ADMIN_TOKEN, agent_port=7420)
    ctl = DatasetController(api_client, settings, clock=Clock())
    ctl.agent_call = agent
    ctl.reconcile_all()
    stripe = apiserver.get("datasets", "big", "ml")["status"]["stripe"]
    # ceil(1.2 x 150 GB / (0.5 x 100 GB)) = 4 members: the holder first, then the most room
    members = [n["node"] for n in stripe["nodes"]]
    assert members == ["n3", "n2", "n4", "n5"] and stripe["members"] == 4
    assert stripe["state"] == "Filling"
    assert {n["node"]: n["state"] for n in stripe["nodes"]}["n3"] == "ready"
    puts = [(node, body) for node, method, path, body in asked if method == "PUT" and path == "/v1/stripes/big"]
    assert sorted(node for node, _ in puts) == sorted(members)
    body = puts[0][1]
    assert body["members"] == members and body["store"] == "s3://store/packs" and body["digest"] == DIGEST
    assert set(body["peers"]) == set(members) and all(url.startswith("http://") for url in body["peers"].values())
    # the next pass keeps the members (no flapping) and renews every share
    asked.clear()
    ctl.reconcile_all()
    again = apiserver.get("datasets", "big", "ml")["status"]["stripe"]
    assert [n["node"] for n in again["nodes"]] == members
    assert len([a for a in asked if a[1] == "PUT"]) == 4


def test_without_a_packed_version_the_group_waits() -> None:
    answer = stripe_status("big", {"stripe": "auto"}, {}, {}, agent_call=lambda *a: None, agent_urls={"n1": "http://x"})
    assert answer == {"state": "Waiting", "nodes": [], "members": 0}
    off = stripe_status("big", {}, {"bytes": 5}, {}, agent_call=lambda *a: None, agent_urls={})
    assert off["state"] == "Off"


def test_an_unreachable_member_is_reported_never_ready() -> None:
    inventories = {"n1": {"freeBytes": 100, "capacityBytes": 100}}
    answer = stripe_status(
        "big",
        {"stripe": {"members": 1}, "bundles": "s3://s/p"},
        {"bytes": 10},
        inventories,
        agent_call=lambda *a: None,
        agent_urls={"n1": "http://n1"},
    )
    assert answer["state"] == "Filling" and answer["nodes"][0]["state"] == "unreachable"


def _topology(subnet: str) -> str:
    return json.dumps(
        {
            "version": 1,
            "gpus": [{"index": 0, "uuid": "GPU-a", "numaNode": 0, "cpuAffinity": "0-7"}],
            "nics": [{"name": "mlx5_0", "numaNode": 0, "addresses": [f"{subnet}.2/24"], "subnets": [f"{subnet}.0/24"]}],
            "links": {"GPU0": {"mlx5_0": "PIX"}},
        }
    )


def test_the_group_starts_with_the_jobs_nodes_then_their_subnet_and_releases_dropped_members(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    from tests.fake_apiserver import make_pod

    # n1 runs the job; n2 and n3 have the most room but sit on another RoCE subnet than n1;
    # n4 and n5 share n1's subnet
    frees = {"n1": 10 * GB, "n2": 95 * GB, "n3": 90 * GB, "n4": 70 * GB, "n5": 65 * GB}
    subnet = {"n1": "10.1.0", "n2": "10.2.0", "n3": "10.2.0", "n4": "10.1.0", "n5": "10.1.0"}
    for node, free in frees.items():
        annotations = {
            "dsagent.io/inventory": _inventory(node, free=free),
            "dsagent.io/topology": _topology(subnet[node]),
        }
        apiserver.create(make_node(node, annotations=annotations))
        apiserver.create(agent_pod(node))
    apiserver.create(make_node("n6", annotations={"dsagent.io/topology": "{not json"}))  # hostile: ignored
    ds = make_dataset("big", namespace="ml", bundles="s3://store/packs", status={"digest": DIGEST, "bytes": 150 * GB})
    ds["spec"]["stripe"] = {"members": 3}
    apiserver.create(ds)
    apiserver.create(make_pod("train-0", namespace="ml", node_name="n1", annotations={"dsagent.io/datasets": "big"}))
    apiserver.create(make_pod("other-ns", namespace="x", node_name="n2", annotations={"dsagent.io/datasets": "big"}))
    asked: list[tuple[str, str, str]] = []

    def agent(node: str, method: str, path: str, body: Any, acting_for: str) -> tuple[int, Any] | None:
        asked.append((node, method, path))
        if method == "DELETE":
            return 200, {"name": "big", "released": [DIGEST]}
        return 200, {"complete": False, "bytesHeld": 0, "bytesOwned": 50 * GB}

    settings = ControllerSettings(namespace=NS, identity="c-1", admin_token=ADMIN_TOKEN, agent_port=7420)
    ctl = DatasetController(api_client, settings, clock=Clock())
    ctl.agent_call = agent
    ctl.reconcile_all()
    members = [n["node"] for n in apiserver.get("datasets", "big", "ml")["status"]["stripe"]["nodes"]]
    # the job's node although nearly full, then room in its subnet (not the roomier n2, n3)
    assert members == ["n1", "n4", "n5"]
    # fewer members: the dropped one is told to release its share
    apiserver.patch("datasets", "big", {"spec": {"stripe": {"members": 2}}}, "ml")
    asked.clear()
    ctl.reconcile_all()
    stripe = apiserver.get("datasets", "big", "ml")["status"]["stripe"]
    assert [n["node"] for n in stripe["nodes"]] == ["n1", "n4"]
    assert [a for a in asked if a[1] == "DELETE"] == [("n5", "DELETE", f"/v1/stripes/big?digest={DIGEST}")]
    # striping switched off: every member releases its share
    apiserver.patch("datasets", "big", {"spec": {"stripe": None}}, "ml")
    asked.clear()
    ctl.reconcile_all()
    assert sorted(node for node, method, _ in asked if method == "DELETE") == ["n1", "n4"]
    assert apiserver.get("datasets", "big", "ml")["status"]["stripe"]["state"] == "Off"
