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
from dsagent.policy import copies
from dsplatform.wire.inventory import FEATURES, STRIPE_NO_SHARE, STRIPE_ON_DEMAND
from dsplatform.wire.stripehold import HOLDING_WHOLE
from tests.clock import Clock
from tests.dsagent.controller.test_controller import NS, agent_pod
from tools.support.fake_apiserver import FakeApiServer, make_dataset, make_node
from tools.support.harness import ADMIN_TOKEN

DIGEST = "b" * 32
GB = 1 << 30


def _inventory(node: str, *, free: int, held: int = 0, features: tuple[str, ...] = FEATURES) -> str:
    """A node's inventory as an agent of this release publishes it (``features=()``: as one
    of an earlier release, which says nothing of what it understands)."""
    doc: dict[str, Any] = {"version": 1, "node": node, "capacityBytes": 100 * GB, "freeBytes": free, "datasets": {}}
    if features:
        doc["features"] = list(features)
    if held:
        doc["stripes"] = {"big": {"digest": DIGEST, "sizeBytes": 150 * GB, "heldBytes": held, "members": 4}}
    return json.dumps(doc)


def _controller(api_client: Any, agent: Any) -> DatasetController:
    """A controller whose calls to agents go to ``agent(node, method, path, body, acting_for)``."""
    settings = ControllerSettings(namespace=NS, identity="c-1", admin_token=ADMIN_TOKEN, agent_port=7420)
    ctl = DatasetController(api_client, settings, clock=Clock())
    ctl.agent_call = agent
    return ctl


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

    ctl = _controller(api_client, agent)
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
    from tools.support.fake_apiserver import make_pod

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
    asked: list[tuple[str, str, str, Any]] = []

    def agent(node: str, method: str, path: str, body: Any, acting_for: str) -> tuple[int, Any] | None:
        asked.append((node, method, path, body))
        if method == "DELETE":
            return 200, {"name": "big", "released": [DIGEST]}
        return 200, {"complete": False, "bytesHeld": 0, "bytesOwned": 50 * GB}

    ctl = _controller(api_client, agent)
    ctl.reconcile_all()
    nodes = apiserver.get("datasets", "big", "ml")["status"]["stripe"]["nodes"]
    members = [n["node"] for n in nodes]
    # the job's node first although nearly full: a member, but without a share (10 GB free and
    # nothing it could evict for a 60 GB share); then room in its subnet (not the roomier n2,
    # n3), then, for the third owner, room anywhere
    assert members == ["n1", "n4", "n5", "n2"]
    assert [n["node"] for n in nodes if n.get("share") is False] == ["n1"]
    puts = {node: body for node, method, path, body in asked if method == "PUT"}
    assert all(body["noShare"] == ["n1"] and body["members"] == members for body in puts.values())
    # fewer members: the dropped one is told to release its share; n1 stays without one
    apiserver.patch("datasets", "big", {"spec": {"stripe": {"members": 2}}}, "ml")
    asked.clear()
    ctl.reconcile_all()
    stripe = apiserver.get("datasets", "big", "ml")["status"]["stripe"]
    assert [n["node"] for n in stripe["nodes"]] == ["n1", "n4", "n2"]
    assert [n["node"] for n in stripe["nodes"] if n.get("share") is False] == ["n1"]
    # a dropped member keeps a whole copy, if it holds one (keep=whole)
    released = [("n5", "DELETE", f"/v1/stripes/big?digest={DIGEST}&keep=whole")]
    assert [a[:3] for a in asked if a[1] == "DELETE"] == released
    # striping switched off: every member releases its share
    apiserver.patch("datasets", "big", {"spec": {"stripe": None}}, "ml")
    asked.clear()
    ctl.reconcile_all()
    assert sorted(node for node, method, *_ in asked if method == "DELETE") == ["n1", "n2", "n4"]
    assert apiserver.get("datasets", "big", "ml")["status"]["stripe"]["state"] == "Off"


def test_while_an_upgrade_rolls_a_member_of_an_earlier_release_gets_no_shareless_members(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    """The job's nearly full node would join without a share, but n4's agent is of a release
    from before such members (its inventory names no features) and would refuse the field:
    every member owns, as before, until n4 is upgraded."""
    from tools.support.fake_apiserver import make_pod

    frees = {"n1": 10 * GB, "n4": 70 * GB, "n5": 65 * GB}
    for node, free in frees.items():
        inventory = _inventory(node, free=free, features=() if node == "n4" else FEATURES)
        apiserver.create(make_node(node, annotations={"dsagent.io/inventory": inventory}))
        apiserver.create(agent_pod(node))
    ds = make_dataset("big", namespace="ml", bundles="s3://store/packs", status={"digest": DIGEST, "bytes": 150 * GB})
    ds["spec"]["stripe"] = {"members": 3}
    apiserver.create(ds)
    apiserver.create(make_pod("train-0", namespace="ml", node_name="n1", annotations={"dsagent.io/datasets": "big"}))
    puts: dict[str, Any] = {}

    def agent(node: str, method: str, path: str, body: Any, acting_for: str) -> tuple[int, Any] | None:
        if method == "PUT":
            if "noShare" in body and node == "n4":
                return 422, {"detail": "noShare: extra fields not permitted"}  # what that release answers
            puts[node] = body
        return 200, {"complete": False, "bytesHeld": 0, "bytesOwned": 50 * GB}

    ctl = _controller(api_client, agent)
    ctl.reconcile_all()
    nodes = apiserver.get("datasets", "big", "ml")["status"]["stripe"]["nodes"]
    assert sorted(n["node"] for n in nodes) == ["n1", "n4", "n5"]
    assert all("share" not in n and n["state"] == "fetching" for n in nodes)
    assert sorted(puts) == ["n1", "n4", "n5"] and not any("noShare" in body for body in puts.values())
    # n4 upgraded: n1 keeps the share it has started on (a member keeps its part while it
    # stays: no flapping), so the group and the requests stay as they are
    annotations = {"dsagent.io/inventory": _inventory("n4", free=70 * GB)}
    apiserver.patch("nodes", "n4", {"metadata": {"annotations": annotations}})
    before, puts_before = nodes, dict(puts)
    ctl.reconcile_all()
    assert apiserver.get("datasets", "big", "ml")["status"]["stripe"]["nodes"] == before and puts == puts_before


def test_a_dataset_whose_pods_start_before_the_copy_is_whole_reads_the_store_on_demand(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    """``spec.startBeforeWhole``: every member's agent is asked to hold its share
    ``storeOnDemand`` (the store read for what readers read, the peers filling the rest),
    its pods started at once (``readyAfter: 0``); a member of a release from before the
    option (its inventory does not list ``stripeOnDemand``) is asked as before, and without
    ``startBeforeWhole`` no member is."""
    frees = {"n1": 60 * GB, "n2": 90 * GB, "n3": 80 * GB, "n4": 70 * GB}
    for node, free in frees.items():
        features = (STRIPE_NO_SHARE,) if node == "n4" else FEATURES
        annotations = {"dsagent.io/inventory": _inventory(node, free=free, features=features)}
        apiserver.create(make_node(node, annotations=annotations))
        apiserver.create(agent_pod(node))
    ds = make_dataset("big", namespace="ml", bundles="s3://store/packs", status={"digest": DIGEST, "bytes": 150 * GB})
    ds["spec"].update({"stripe": "auto", "startBeforeWhole": True})
    apiserver.create(ds)
    puts: dict[str, Any] = {}

    def agent(node: str, method: str, path: str, body: Any, acting_for: str) -> tuple[int, Any] | None:
        if method == "PUT":
            puts[node] = body
        return 200, {"complete": False, "bytesHeld": 0, "bytesOwned": 40 * GB}

    ctl = _controller(api_client, agent)
    ctl.reconcile_all()
    assert sorted(puts) == ["n1", "n2", "n3", "n4"]
    for node in ("n1", "n2", "n3"):
        assert puts[node]["storeOnDemand"] is True and puts[node]["readyAfter"] == 0, puts[node]
    assert "storeOnDemand" not in puts["n4"] and "readyAfter" not in puts["n4"]
    # the same group either way: only how each member fills changes
    assert len({json.dumps(body["members"]) for body in puts.values()}) == 1

    apiserver.patch("datasets", "big", {"spec": {"startBeforeWhole": False}}, "ml")
    puts.clear()
    ctl.reconcile_all()
    assert sorted(puts) == ["n1", "n2", "n3", "n4"]
    assert not any("storeOnDemand" in body or "readyAfter" in body for body in puts.values())


def test_a_version_that_fits_is_held_whole_on_the_jobs_nodes_and_not_spread(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    from tools.support.fake_apiserver import make_pod

    # 3.2 GB on nodes of 100 GB caches: it fits every node. The job's nodes n1 and n2 share
    # their RoCE subnet with n3; n4 and n5 sit on another. The group is the job's two nodes,
    # each asked to hold the version whole; no other node of the subnet takes a share.
    subnet = {"n1": "10.1.0", "n2": "10.1.0", "n3": "10.1.0", "n4": "10.2.0", "n5": "10.2.0"}
    for node in subnet:
        annotations = {
            "dsagent.io/inventory": _inventory(node, free=90 * GB),
            "dsagent.io/topology": _topology(subnet[node]),
        }
        apiserver.create(make_node(node, annotations=annotations))
        apiserver.create(agent_pod(node))
    ds = make_dataset(
        "big", namespace="ml", bundles="s3://store/packs", status={"digest": DIGEST, "bytes": 3_200_000_000}
    )
    ds["spec"]["stripe"] = "auto"
    apiserver.create(ds)
    for i, node in enumerate(("n1", "n2")):
        pod = make_pod(f"train-{i}", namespace="ml", node_name=node, annotations={"dsagent.io/datasets": "big"})
        apiserver.create(pod)
    puts: dict[str, Any] = {}

    def agent(node: str, method: str, path: str, body: Any, who: str) -> tuple[int, Any]:
        if method != "PUT":
            return 200, {"tasks": []}
        puts[node] = body
        holding = "whole" if body.get("whole") else "share"
        return 200, {"complete": False, "bytesHeld": 0, "bytesOwned": 3_200_000_000, "holding": holding}

    ctl = _controller(api_client, agent)
    ctl.reconcile_all()
    stripe = apiserver.get("datasets", "big", "ml")["status"]["stripe"]
    assert [n["node"] for n in stripe["nodes"]] == ["n1", "n2"] and stripe["members"] == 2
    assert all(n.get("holding") == "whole" for n in stripe["nodes"])
    assert sorted(puts) == ["n1", "n2"] and all(body["whole"] is True for body in puts.values())
    assert all(body["members"] == ["n1", "n2"] for body in puts.values())
    # a version larger than a node (150 GB, 1.2 x 150 > 100): shares over the job's nodes
    # and, as the job's two are too few for the budget (ceil(1.2 x 150 / 50) = 4), the group
    # reaches past them to the window's 16 members: here every node there is; nobody is
    # asked for a whole copy
    puts.clear()
    status = {"digest": DIGEST, "bytes": 150 * GB}
    ds2 = make_dataset("huge", namespace="ml", bundles="s3://store/packs", status=status)
    ds2["spec"]["stripe"] = "auto"
    apiserver.create(ds2)
    for i, node in enumerate(("n4", "n5")):
        pod = make_pod(f"big-{i}", namespace="ml", node_name=node, annotations={"dsagent.io/datasets": "huge"})
        apiserver.create(pod)
    ctl.reconcile_all()
    huge = apiserver.get("datasets", "huge", "ml")["status"]["stripe"]
    assert [n["node"] for n in huge["nodes"]][:2] == ["n4", "n5"] and huge["members"] == 5
    assert not any(body.get("whole") for node, body in puts.items() if node in {n["node"] for n in huge["nodes"]})


class _Agents:
    """Agents as the controller sees them: each member's share completes ``passes`` passes
    after it is first asked to hold a new group; released shares are recorded."""

    def __init__(self, passes: int = 1) -> None:
        self.passes = passes
        self.groups: dict[str, tuple[list[str], int]] = {}  # node -> (members, passes since asked)
        self.asked: list[tuple[str, str, str, Any]] = []

    def __call__(self, node: str, method: str, path: str, body: Any, acting_for: str) -> tuple[int, Any] | None:
        if method == "GET":  # the task lists the controller reads: nothing held but stripe shares
            return 200, {"tasks": [], "preparations": []}
        self.asked.append((node, method, path, body))
        if method == "DELETE":
            self.groups.pop(node, None)
            return 200, {"name": "big", "released": [DIGEST]}
        members, seen = self.groups.get(node, ([], 0))
        seen = seen + 1 if members == body["members"] else 0
        self.groups[node] = (list(body["members"]), seen)
        done = seen >= self.passes
        return 200, {"complete": done, "bytesHeld": 50 * GB if done else 0, "bytesOwned": 50 * GB}

    def calls(self, method: str) -> list[tuple[str, Any]]:
        return [(node, body) for node, m, _, body in self.asked if m == method]


def _three_node_group(apiserver: FakeApiServer, api_client: Any, agents: _Agents, clock: Clock) -> DatasetController:
    for node in ("n1", "n2", "n3", "n4"):
        apiserver.create(make_node(node, annotations={"dsagent.io/inventory": _inventory(node, free=90 * GB)}))
        apiserver.create(agent_pod(node))
    ds = make_dataset("big", namespace="ml", bundles="s3://store/packs", status={"digest": DIGEST, "bytes": 150 * GB})
    ds["spec"]["stripe"] = {"members": 3}
    apiserver.create(ds)
    settings = ControllerSettings(
        namespace=NS, identity="c-1", admin_token=ADMIN_TOKEN, agent_port=7420, stripe_drain_timeout_s=600
    )
    ctl = DatasetController(api_client, settings, clock=clock)
    ctl.agent_call = agents
    for _ in range(agents.passes + 1):
        ctl.reconcile_all()
    assert apiserver.get("datasets", "big", "ml")["status"]["stripe"]["state"] == "Ready"
    return ctl


def _stripe(apiserver: FakeApiServer) -> dict[str, Any]:
    return dict(apiserver.get("datasets", "big", "ml")["status"]["stripe"])


def test_a_draining_member_keeps_its_share_until_the_new_owners_are_complete(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    agents, clock = _Agents(passes=2), Clock()
    ctl = _three_node_group(apiserver, api_client, agents, clock)
    old = [n["node"] for n in _stripe(apiserver)["nodes"]]
    leaving = old[0]
    apiserver.patch("nodes", leaving, {"spec": {"unschedulable": True}})  # kubectl cordon
    agents.asked.clear()
    ctl.reconcile_all()
    stripe = _stripe(apiserver)
    new = [n["node"] for n in stripe["nodes"]]
    assert leaving not in new and len(new) == 3 and stripe["state"] == "Filling"
    assert stripe["drain"]["state"] == "Moving" and stripe["drain"]["nodes"] == [leaving]
    assert stripe["drain"]["deadlineSeconds"] == 600 and stripe["drain"]["members"] == old
    puts = dict(agents.calls("PUT"))
    # the new owners are told the new group and may ask the leaving node (its agent's URL)
    assert all(puts[n]["members"] == new and leaving in puts[n]["peers"] for n in new)
    assert puts[leaving]["members"] == old  # its old share renewed: it serves it meanwhile
    assert agents.calls("DELETE") == []  # nothing released before the new owners are complete
    reasons = [e["reason"] for e in apiserver.list("events")]
    assert "StripeShareMoving" in reasons
    note = next(e["note"] for e in apiserver.list("events") if e["reason"] == "StripeShareMoving")
    assert f"moving share off {leaving}" in note
    clock.now += 30
    ctl.reconcile_all()  # one pass on: the new owners still fetching
    assert agents.calls("DELETE") == [] and _stripe(apiserver)["drain"]["state"] == "Moving"
    clock.now += 30
    ctl.reconcile_all()  # complete now: only then the leaving share is released
    stripe = _stripe(apiserver)
    assert stripe["state"] == "Ready" and stripe["drain"]["state"] == "Moved"
    assert [node for node, _ in agents.calls("DELETE")] == [leaving]
    assert any(e["reason"] == "StripeShareMoved" for e in apiserver.list("events"))
    agents.asked.clear()
    ctl.reconcile_all()  # settled: the leaving node is asked for nothing more
    assert leaving not in {node for node, _, _, _ in agents.asked}


def test_a_drain_that_outlasts_its_bound_releases_and_falls_back_to_the_store(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    agents, clock = _Agents(passes=2), Clock()
    ctl = _three_node_group(apiserver, api_client, agents, clock)
    agents.passes = 10**6  # the new owners never complete
    leaving = [n["node"] for n in _stripe(apiserver)["nodes"]][1]
    taint = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    apiserver.patch("nodes", leaving, {"spec": {"taints": [taint]}})
    ctl.reconcile_all()
    assert _stripe(apiserver)["drain"]["state"] == "Moving" and agents.calls("DELETE") == []
    clock.now += 599
    ctl.reconcile_all()
    assert agents.calls("DELETE") == []
    clock.now += 2
    ctl.reconcile_all()
    drain = _stripe(apiserver)["drain"]
    assert drain["state"] == "TimedOut" and "fell back to the store" in drain["message"]
    assert [node for node, _ in agents.calls("DELETE")] == [leaving]
    warning = next(e for e in apiserver.list("events") if e["reason"] == "StripeShareMoveTimedOut")
    assert warning["type"] == "Warning"


def test_a_crashed_member_is_replaced_at_once_without_waiting(apiserver: FakeApiServer, api_client: Any) -> None:
    agents, clock = _Agents(passes=1), Clock()
    ctl = _three_node_group(apiserver, api_client, agents, clock)
    old = [n["node"] for n in _stripe(apiserver)["nodes"]]
    crashed = old[2]
    apiserver.delete("pods", f"agent-{crashed}", NS)  # its agent is gone
    agents.asked.clear()
    ctl.reconcile_all()
    stripe = _stripe(apiserver)
    new = [n["node"] for n in stripe["nodes"]]
    assert crashed not in new and len(new) == 3 and old[:2] == new[:2]
    assert "drain" not in stripe  # nothing to wait for
    assert crashed not in {node for node, _, _, _ in agents.asked}
    # a stale inventory (the agent not answering for longer than its max age) counts the same
    stale = new[1]
    annotations = {"dsagent.io/published-at": "2020-01-01T00:00:00Z"}
    apiserver.patch("nodes", stale, {"metadata": {"annotations": annotations}})
    ctl.reconcile_all()
    assert stale not in [n["node"] for n in _stripe(apiserver)["nodes"]]
    assert "drain" not in _stripe(apiserver)


def test_draining_reads_cordons_and_drain_taints() -> None:
    from dsagent.kube.leaving import draining

    nodes = [
        {"metadata": {"name": "a"}, "spec": {"unschedulable": True}},
        {
            "metadata": {"name": "b"},
            "spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
        },
        {"metadata": {"name": "c"}, "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]}},
        {"metadata": {"name": "d"}, "spec": {"taints": "hostile"}},
        {"metadata": {"name": "e"}},
    ]
    assert draining(nodes) == {"a", "b"}


def test_the_two_holders_of_a_versions_last_two_copies_do_not_both_count_it_as_room() -> None:
    # n1 and n2 hold idle copies of "other", the only two, with 10 GB free. n1 is its keeper
    # (rendezvous hashing of the two names with the version): to n1 its copy is the last, to
    # n2 a replicated one, room for a 60 GB share. n3 has room; n4 has 70 GB. The three
    # owners are n3, n2 and n4: taking n1 as well would have evicted the last copy.
    other = "c" * 32
    copy = {"digest": other, "sizeBytes": 100 * GB, "state": "ready", "inUse": False}

    def inv(free: int, datasets: dict[str, Any]) -> dict[str, Any]:
        return {"version": 1, "freeBytes": free, "capacityBytes": 200 * GB, "datasets": datasets,
                "features": list(FEATURES)}  # fmt: skip

    invs = {"n1": inv(10 * GB, {"other": copy}), "n2": inv(10 * GB, {"other": copy}),
            "n3": inv(150 * GB, {}), "n4": inv(70 * GB, {})}  # fmt: skip
    answer = stripe_status(
        "big", {"stripe": {"members": 3}, "bundles": "s3://s/p"}, {"bytes": 150 * GB, "digest": DIGEST}, invs,
        agent_call=lambda *a: (200, {"complete": False, "bytesHeld": 0, "bytesOwned": 0}),
        agent_urls={n: f"http://{n}" for n in invs},
    )  # fmt: skip
    assert copies.keepers(invs)[("other", other)] == "n1"
    assert [n["node"] for n in answer["nodes"]] == ["n3", "n2", "n4"]


def test_a_job_nodes_room_counts_the_idle_copies_other_nodes_hold_too() -> None:
    # n1 runs the job with 10 GB free and an idle 100 GB copy of "other"; the share needs
    # 1.2 x 150 GB / 3 = 60 GB. When n2 holds "other" too (and keeps it: n2 is its keeper),
    # n1 can evict its copy: it owns. When n1's copy is the last one (or in use), it joins
    # without a share.
    other = "9" * 32

    def inventories(n1_other: dict[str, Any], n2_holds: bool) -> dict[str, dict[str, Any]]:
        def inv(datasets: dict[str, Any]) -> dict[str, Any]:
            return {"version": 1, "freeBytes": 10 * GB, "capacityBytes": 200 * GB, "datasets": datasets,
                    "features": list(FEATURES)}  # fmt: skip

        copy = {"digest": other, "sizeBytes": 100 * GB, "state": "ready", "inUse": False}
        roomy = {"version": 1, "freeBytes": 150 * GB, "capacityBytes": 200 * GB, "datasets": {},
                 "features": list(FEATURES)}  # fmt: skip
        return {
            "n1": inv({"other": {**copy, **n1_other}}),
            "n2": inv({"other": copy} if n2_holds else {}),
            "n3": roomy, "n4": roomy, "n5": roomy,
        }  # fmt: skip

    def choose(invs: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return stripe_status(
            "big", {"stripe": {"members": 3}, "bundles": "s3://s/p"}, {"bytes": 150 * GB, "digest": DIGEST}, invs,
            agent_call=lambda *a: (200, {"complete": False, "bytesHeld": 0, "bytesOwned": 0}),
            agent_urls={n: f"http://{n}" for n in invs}, job=["n1"],
        )  # fmt: skip

    def shareless(answer: dict[str, Any]) -> list[str]:
        return [n["node"] for n in answer["nodes"] if n.get("share") is False]

    assert shareless(choose(inventories({}, n2_holds=True))) == []
    assert shareless(choose(inventories({}, n2_holds=False))) == ["n1"]
    assert shareless(choose(inventories({"inUse": True}, n2_holds=True))) == ["n1"]


def test_a_member_that_started_on_a_share_is_asked_whole_once_its_window_reads_reach_what_it_lacks() -> None:
    # n1 runs the job; it joined the group on a share of 30 GB (no room for the 150 GB
    # version then). Room appeared (190 GB free): it is asked for a whole copy only once its
    # pods read the 120 GB it lacks through the window; n2, whole before, stays whole. A
    # member whose last answer did not come is not taken as one on a share, and one whose
    # agent counts no window bytes (an earlier release) is made whole once it has room.
    def status(window: int, n1_was: str = "ready", counts: bool = True) -> dict[str, Any]:
        share = {"digest": DIGEST, "sizeBytes": 150 * GB, "heldBytes": 30 * GB, "members": 2}
        n1 = {"version": 1, "freeBytes": 190 * GB, "capacityBytes": 400 * GB, "datasets": {},
              "features": list(FEATURES) if counts else [STRIPE_NO_SHARE, STRIPE_ON_DEMAND],
              "stripes": {"big": {**share, "windowBytes": window} if counts else share}}  # fmt: skip
        n2 = {"version": 1, "freeBytes": 250 * GB, "capacityBytes": 400 * GB, "features": list(FEATURES),
              "datasets": {}, "stripes": {"big": {"digest": DIGEST, "sizeBytes": 150 * GB,
              "heldBytes": 150 * GB, "windowBytes": 0, "members": 2}}}  # fmt: skip
        asked: dict[str, bool] = {}

        def agent(node: str, method: str, path: str, body: Any, acting_for: str) -> tuple[int, Any]:
            asked[node] = body.get("whole") is True
            return 200, {"complete": True, "bytesHeld": 0, "bytesOwned": 0}

        before = {"nodes": [{"node": "n1", "state": n1_was}, {"node": "n2", "state": "ready", "holding": "whole"}]}
        stripe_status(
            "big", {"stripe": "auto", "bundles": "s3://s/p"}, {"bytes": 150 * GB, "digest": DIGEST, "stripe": before},
            {"n1": n1, "n2": n2}, agent_call=agent, agent_urls={"n1": "http://n1", "n2": "http://n2"},
            job=["n1", "n2"],
        )  # fmt: skip
        return asked

    assert status(0) == {"n1": False, "n2": True}
    assert status(120 * GB - 1) == {"n1": False, "n2": True}
    assert status(120 * GB) == {"n1": True, "n2": True}
    assert status(0, n1_was="unreachable") == {"n1": True, "n2": True}
    assert status(0, counts=False) == {"n1": True, "n2": True}


def test_a_member_holding_the_version_whole_keeps_it_whole_and_an_unpacked_copy_is_not_asked_whole() -> None:
    # n2 held the 150 GB version whole for an earlier job (its stripes entry holds every
    # bundle); n1 now runs a job with room for a share only. n2 is asked whole again, so the
    # changed group does not make it drop what it holds. n3 holds an unpacked ready copy of
    # the version (a replica): it holds no bundle, and is not asked to hold it whole
    def inv(free: int, stripes: dict[str, Any], datasets: dict[str, Any]) -> dict[str, Any]:
        return {"version": 1, "freeBytes": free, "capacityBytes": 400 * GB, "features": list(FEATURES),
                "datasets": datasets, "stripes": stripes}  # fmt: skip

    whole = {"big": {"digest": DIGEST, "sizeBytes": 150 * GB, "heldBytes": 150 * GB, "windowBytes": 0, "members": 1}}
    ready = {"big": {"digest": DIGEST, "sizeBytes": 150 * GB, "state": "ready", "files": 1, "inUse": False,
                     "lastUsed": 0}}  # fmt: skip
    invs = {"n1": inv(100 * GB, {}, {}), "n2": inv(100 * GB, whole, {}), "n3": inv(100 * GB, {}, ready)}
    asked: dict[str, bool] = {}

    def agent(node: str, method: str, path: str, body: Any, acting_for: str) -> tuple[int, Any]:
        asked[node] = body.get("whole") is True
        return 200, {"complete": True, "bytesHeld": 0, "bytesOwned": 0}

    before = {"nodes": [{"node": "n2", "state": "ready", "holding": "whole"}]}
    stripe_status(
        "big", {"stripe": "auto", "bundles": "s3://s/p"}, {"bytes": 150 * GB, "digest": DIGEST, "stripe": before},
        invs, agent_call=agent, agent_urls={n: f"http://{n}" for n in invs}, job=["n1"],
    )  # fmt: skip
    assert asked.get("n2") is True and asked.get("n1") is False
    assert asked.get("n3") is not True


def test_a_share_or_copy_of_another_version_is_not_taken_for_this_one() -> None:
    # n2's stripes entry holds every bundle of the version before (an agent lists the newest
    # version it takes part in), n3 holds a ready unpacked copy of it: neither holds this
    # version, so neither is asked to keep it whole, and both count as holding none of it
    old = "0" * 64
    whole_old = {"big": {"digest": old, "sizeBytes": 150 * GB, "heldBytes": 150 * GB, "windowBytes": 0, "members": 1}}
    ready_old = {"big": {"digest": old, "sizeBytes": 150 * GB, "state": "ready", "files": 1, "inUse": False,
                         "lastUsed": 0}}  # fmt: skip

    def inv(stripes: dict[str, Any], datasets: dict[str, Any]) -> dict[str, Any]:
        return {"version": 1, "freeBytes": 100 * GB, "capacityBytes": 400 * GB, "features": list(FEATURES),
                "datasets": datasets, "stripes": stripes}  # fmt: skip

    invs = {"n1": inv({}, {}), "n2": inv(whole_old, {}), "n3": inv({}, ready_old)}
    asked: dict[str, Any] = {}

    def agent(node: str, method: str, path: str, body: Any, acting_for: str) -> tuple[int, Any]:
        asked[node] = body
        return 200, {"complete": False, "bytesHeld": 0, "bytesOwned": 0}

    answer = stripe_status(
        "big", {"stripe": "auto", "bundles": "s3://s/p"}, {"bytes": 150 * GB, "digest": DIGEST}, invs,
        agent_call=agent, agent_urls={n: f"http://{n}" for n in invs}, job=["n1"],
    )  # fmt: skip
    assert not any(body.get("whole") is True for body in asked.values()), asked
    assert all(row.get("holding") != HOLDING_WHOLE for row in answer["nodes"])


def test_a_group_that_lets_a_whole_copy_go_releases_it_kept_and_a_late_inventory_does_not_count_it_short() -> None:
    # a 150 GB version fits n2 and n3, the job's nodes; n1 held it whole for a job that
    # ended and is no longer wanted: it is released with keep=whole (its agent keeps the
    # copy until its cache evicts it). A job's node (n3) whose inventory was published while
    # its copy filled, but whose agent answered the last pass holding every bundle, counts
    # as whole: with n2 reading through the window, it is not taken for one on a share
    def share(held: int) -> dict[str, Any]:
        return {"big": {"digest": DIGEST, "sizeBytes": 150 * GB, "heldBytes": held, "windowBytes": 0, "members": 2}}

    def inv(stripes: dict[str, Any], free: int = 200 * GB) -> dict[str, Any]:
        return {"version": 1, "freeBytes": free, "capacityBytes": 400 * GB, "features": list(FEATURES),
                "datasets": {}, "stripes": stripes}  # fmt: skip

    def run(invs: dict[str, dict[str, Any]], job: list[str]) -> dict[str, list[str]]:
        asked: dict[str, list[str]] = {"whole": [], "released": []}

        def agent(node: str, method: str, path: str, body: Any, acting_for: str) -> tuple[int, Any]:
            if method == "DELETE":
                asked["released"].append(f"{node} {path}")
            elif body.get("whole") is True:
                asked["whole"].append(node)
            return 200, {"complete": True, "bytesHeld": 150 * GB, "bytesOwned": 75 * GB, "holding": HOLDING_WHOLE}

        last = [{"node": n, "state": "ready", "holding": "whole", "bytesHeld": 150 * GB} for n in ("n1", "n3")]
        stripe_status(
            "big", {"stripe": "auto", "bundles": "s3://s/p"},
            {"bytes": 150 * GB, "digest": DIGEST, "stripe": {"nodes": last}}, invs,
            agent_call=agent, agent_urls={n: f"http://{n}" for n in invs}, job=job,
        )  # fmt: skip
        return asked

    invs = {"n1": inv(share(150 * GB)), "n2": inv({}), "n3": inv({})}
    assert run(invs, ["n2", "n3"]) == {
        "whole": ["n3", "n2"],
        "released": [f"n1 /v1/stripes/big?digest={DIGEST}&keep=whole"],
    }
    # n2 has no room: it reads through the window; the whole copies join the group (n1 is
    # one by its inventory, n3 by its last answer though its inventory shows 60 GB)
    invs = {"n1": inv(share(150 * GB)), "n2": inv({}, free=10 * GB), "n3": inv(share(60 * GB))}
    assert sorted(run(invs, ["n2", "n3"])["whole"]) == ["n1", "n3"]


def test_members_still_holding_their_share_stay_when_the_next_job_holds_the_version_whole() -> None:
    # a 150 GB version was held as shares over n1-n3 (50 GB each) for a job that ended; the
    # next job trains on n4, whose 400 GB cache holds it whole. The size rule over n4's cache
    # alone wants one member; but the three still hold their shares, so they stay (none is
    # released) and n4's copy is filled from them, not from the store
    def inv(held: int, free: int) -> dict[str, Any]:
        stripes = {"big": {"digest": DIGEST, "sizeBytes": 150 * GB, "heldBytes": held, "windowBytes": 0, "members": 3}}
        return {"version": 1, "freeBytes": free, "capacityBytes": 400 * GB, "features": list(FEATURES),
                "datasets": {}, "stripes": stripes if held else {}}  # fmt: skip

    def run(invs: dict[str, dict[str, Any]]) -> tuple[list[str], list[str]]:
        released: list[str] = []

        def agent(node: str, method: str, path: str, body: Any, acting_for: str) -> tuple[int, Any]:
            if method == "DELETE":
                released.append(node)
            return 200, {"complete": True, "bytesHeld": 50 * GB, "bytesOwned": 50 * GB}

        last = [{"node": n, "state": "ready", "bytesHeld": 50 * GB, "bytesOwned": 50 * GB} for n in ("n1", "n2", "n3")]
        status = stripe_status(
            "big", {"stripe": "auto", "bundles": "s3://s/p"},
            {"bytes": 150 * GB, "digest": DIGEST, "stripe": {"nodes": last}}, invs,
            agent_call=agent, agent_urls={n: f"http://{n}" for n in invs}, job=["n4"],
        )  # fmt: skip
        return [n["node"] for n in status["nodes"]], released

    invs = {n: inv(50 * GB, 10 * GB) for n in ("n1", "n2", "n3")}
    invs["n4"] = inv(0, 400 * GB)
    assert run(invs) == (["n1", "n2", "n3", "n4"], [])
    # one whose share the cache evicted holds nothing of it: it leaves the group
    invs["n2"] = inv(0, 60 * GB)
    members, released = run(invs)
    assert members == ["n1", "n3", "n4"] and released == ["n2"]


def test_where_too_few_have_room_the_nodes_whose_caches_their_pods_do_not_hold_own() -> None:
    # a 600 GB version on 400 GB caches wants four owners (180 GB each with the headroom).
    # Only the job's node n1 has room without evicting a last copy; n2-n5 are full of 380 GB
    # last copies, n5's in use by its pods. n2-n4 can evict theirs for a share; n5, though it
    # has the most free bytes, cannot, and is not asked for one its agent would refuse
    def inv(free: int, data: dict[str, Any]) -> dict[str, Any]:
        return {"version": 1, "freeBytes": free, "capacityBytes": 400 * GB, "features": list(FEATURES),
                "datasets": data, "stripes": {}}  # fmt: skip

    def copy(in_use: bool) -> dict[str, Any]:
        return {"digest": "c" * 32, "sizeBytes": 380 * GB, "files": 10, "state": "ready", "inUse": in_use,
                "lastUsed": "2026-11-01T00:00:00Z"}  # fmt: skip

    invs = {"n1": inv(300 * GB, {})}
    invs.update({n: inv(10 * GB, {f"d{n}": copy(False)}) for n in ("n2", "n3", "n4")})
    invs["n5"] = inv(20 * GB, {"dn5": copy(True)})  # the most room of the four, all of it its pods' data beside

    def agent(node: str, method: str, path: str, body: Any, acting_for: str) -> tuple[int, Any]:
        return 200, {"complete": True, "bytesHeld": 150 * GB, "bytesOwned": 150 * GB}

    status = stripe_status(
        "big", {"stripe": "auto", "bundles": "s3://s/p"}, {"bytes": 600 * GB, "digest": DIGEST}, invs,
        agent_call=agent, agent_urls={n: f"http://{n}" for n in invs}, job=["n1"],
    )  # fmt: skip
    assert [n["node"] for n in status["nodes"]] == ["n1", "n2", "n3", "n4"]


def test_a_member_whose_agent_refused_its_share_is_replaced_at_the_next_pass() -> None:
    # a 450 GB version over n1 (the job's) and n2, n3 (a Dataset of three members on 400 GB
    # caches); n2's agent answered the last pass "failed", holding none of it (its cache held
    # by pods' data). The next pass asks n4 in its place, not n2 again; a job's node that
    # failed stays (its pods read through it)
    def inv() -> dict[str, Any]:
        return {"version": 1, "freeBytes": 300 * GB, "capacityBytes": 400 * GB, "features": list(FEATURES),
                "datasets": {}, "stripes": {}}  # fmt: skip

    invs = {n: inv() for n in ("n1", "n2", "n3", "n4")}

    def run(last: list[dict[str, Any]]) -> list[str]:
        def agent(node: str, method: str, path: str, body: Any, acting_for: str) -> tuple[int, Any]:
            return 200, {"complete": True, "bytesHeld": 100 * GB, "bytesOwned": 100 * GB}

        status = stripe_status(
            "big", {"stripe": {"members": 3}, "bundles": "s3://s/p"},
            {"bytes": 450 * GB, "digest": DIGEST, "stripe": {"nodes": last}}, invs,
            agent_call=agent, agent_urls={n: f"http://{n}" for n in invs}, job=["n1"],
        )  # fmt: skip
        return [n["node"] for n in status["nodes"]]

    ok = {"state": "ready", "bytesHeld": 100 * GB, "bytesOwned": 100 * GB}
    failed = {"state": "failed", "bytesHeld": 0, "bytesOwned": 0}
    assert run([{"node": "n1", **ok}, {"node": "n2", **ok}, {"node": "n3", **ok}]) == ["n1", "n2", "n3"]
    assert run([{"node": "n1", **ok}, {"node": "n2", **failed}, {"node": "n3", **ok}]) == ["n1", "n3", "n4"]
    assert run([{"node": "n1", **failed}, {"node": "n2", **ok}, {"node": "n3", **ok}]) == ["n1", "n2", "n3"]


def test_the_nodes_rooms_are_read_once_a_pass_however_many_datasets_are_striped(
    apiserver: FakeApiServer, api_client: Any, monkeypatch: Any
) -> None:
    from dsagent.controller import reconcile

    for i, node in enumerate(["n1", "n2", "n3", "n4", "n5"]):
        apiserver.create(
            make_node(node, annotations={"dsagent.io/inventory": _inventory(node, free=(5 + i) * 10 * GB)})
        )
        apiserver.create(agent_pod(node))
    for name in ("big", "bigger", "biggest"):
        ds = make_dataset(
            name, namespace="ml", bundles=f"s3://store/{name}", status={"digest": DIGEST, "bytes": 150 * GB}
        )
        ds["spec"]["stripe"] = "auto"
        apiserver.create(ds)
    made: list[int] = []

    def counted(inventories: Any, *args: Any, **kwargs: Any) -> Any:
        made.append(len(inventories))
        return made_once(inventories, *args, **kwargs)

    made_once = reconcile.striped_pass
    monkeypatch.setattr(reconcile, "striped_pass", counted)
    ctl = _controller(api_client, lambda *a: (200, {"complete": False, "bytesHeld": 0, "bytesOwned": 30 * GB}))
    ctl.reconcile_all()
    ctl.reconcile_all()
    assert made == [5, 5]  # once a pass, for all three Datasets
    groups = {n: [m["node"] for m in apiserver.get("datasets", n, "ml")["status"]["stripe"]["nodes"]]
              for n in ("big", "bigger", "biggest")}  # fmt: skip
    assert all(members == ["n5", "n4", "n3", "n2"] for members in groups.values()), groups  # the most room first
