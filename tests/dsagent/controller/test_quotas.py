"""The controller's tenancy bounds as pure functions (docs/operator-guide/tenancy.md), and the stale-inventory rule."""

from __future__ import annotations

import json

from dsagent.controller.quotas import Ledger, Limits, capped
from dsagent.policy import replication
from dsplatform import published
from dsplatform.kubetime import format_time

GIB = 1 << 30


def test_a_namespaces_pins_stay_within_its_share_bytes_and_tasks() -> None:
    ledger = Ledger(Limits(node_share=0.5, cluster_bytes=100 * GIB, open_tasks=5), {"n1": 100 * GIB, "n2": 100 * GIB})
    one = ledger.admitter("evil", 40 * GIB)
    assert [n for n in ("n1", "n2") if one(n)] == ["n1", "n2"] and one.refused is None
    two = ledger.admitter("evil", 20 * GIB)
    assert not two("n1") and two.refused is not None and two.refused.reason == "NamespaceShare"
    assert "would pin 64.4 GB of node n1's 107 GB cache; at most 50%" in two.refused.message
    assert ledger.admitter("team-a", 50 * GIB)("n1")  # another namespace: its own share
    small = ledger.admitter("evil", 5 * GIB)
    assert small("n1")  # 45 GiB of 100: within the share; 85 GiB in all
    big = ledger.admitter("evil", 20 * GIB)
    assert not big("n2") and big.refused is not None and big.refused.reason == "NamespaceBytes"
    tiny = ledger.admitter("evil", 1)
    assert tiny("n2") and tiny("n2")  # 5 tasks
    assert not tiny("n1") and tiny.refused is not None and tiny.refused.reason == "NamespaceTasks"


def test_an_unknown_capacity_or_a_whole_share_never_refuses() -> None:
    assert Ledger(Limits(node_share=0.5), {"n1": None}).admitter("ns", 10**15)("n1")
    assert Ledger(Limits(node_share=1.0), {"n1": 1}).admitter("ns", 10**15)("n1")


def test_capped_says_why() -> None:
    assert capped(3, 8, "WarmNodesOverLimit", "spec.warm.nodes") == (3, None)
    count, why = capped(10**9, 8, "WarmNodesOverLimit", "spec.warm.nodes")
    assert count == 8 and why is not None and why.reason == "WarmNodesOverLimit" and "1000000000" in why.message


def test_replication_asks_the_admitter_in_rank_order_and_skips_what_it_refuses() -> None:
    rooms = [replication.NodeRoom(f"n{i}", False, (10 - i) * GIB, 1) for i in range(5)]
    asked: list[str] = []

    def admit(node: str) -> bool:
        asked.append(node)
        return node != "n0"

    assert replication.choose(rooms, 2, size_bytes=GIB, admit=admit) == ["n1", "n2"]
    assert asked == ["n0", "n1", "n2"]  # most free first; stops once two are admitted


def test_an_inventory_is_stale_past_its_bound_by_its_stamp() -> None:
    now = 1_800_000_000.0
    assert not published.stale({published.PUBLISHED_AT: format_time(now - 60)}, now, 300)
    assert published.stale({published.PUBLISHED_AT: format_time(now - 301)}, now, 300)
    assert published.stale({published.PUBLISHED_AT: format_time(now + 3600)}, now, 300)  # a clock far ahead
    assert published.stale({published.PUBLISHED_AT: "yesterday"}, now, 300)
    assert not published.stale({}, now, 300)  # no stamp: an older agent, nothing to date it by


def test_an_admitter_is_closed_once_no_node_can_pass() -> None:
    ledger = Ledger(Limits(node_share=0.5, cluster_bytes=10 * GIB, open_tasks=2), {"n1": 100 * GIB, "n2": 10 * GIB})
    big = ledger.admitter("ns", 8 * GIB)
    assert not big("n2") and not big.closed()  # n2's share only: another node may still fit
    assert big("n1") and big.closed()  # 8 of 10 GiB in the cluster: no other 8 GiB fits anywhere
    small = ledger.admitter("ns", GIB)
    assert small("n1") and small.closed()  # two open tasks: the bound
    assert not small("n2") and small.refused is not None and small.refused.reason == "NamespaceTasks"


def test_pods_indexed_by_dataset_give_each_datasets_demand() -> None:
    from dsagent.controller.podfacts import demand, pods_by_dataset
    from tools.support.fake_apiserver import make_pod

    pods = [
        make_pod("a", namespace="ml", annotations={"dsagent.io/datasets": "imagenet,coco"}),
        make_pod(
            "b",
            namespace="ml",
            annotations={"dsagent.io/datasets": json.dumps([{"name": "coco"}])},
            node_name="n1",
            phase="Running",
        ),
        make_pod("c", namespace="vision", annotations={"dsagent.io/datasets": "imagenet"}),
        make_pod("d", namespace="ml"),
    ]
    pods[1]["status"]["startTime"] = format_time(1000.0)
    index = pods_by_dataset(pods)
    for key in [("ml", "imagenet"), ("ml", "coco"), ("vision", "imagenet"), ("vision", "coco")]:
        want = demand(pods, *key, now=1100.0, window_s=3600)
        assert demand(index.get(key, []), *key, now=1100.0, window_s=3600) == want
        assert want == {("ml", "imagenet"): 1, ("ml", "coco"): 2, ("vision", "imagenet"): 1}.get(key, 0)
    assert [p["metadata"]["name"] for p in index[("ml", "coco")]] == ["a", "b"]  # each Dataset's own pods
