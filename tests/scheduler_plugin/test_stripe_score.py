"""Partial holdings and stripe shares: the agent's inventory parsed by the extender, and the
pure score over it (a score, never a filter)."""

from __future__ import annotations

import json

import httpx
import pytest

from dsagent.cache import inventory as contract
from dsagent.cache.report import inventory
from scheduler_plugin.app import create_app
from scheduler_plugin.framework import Framework
from scheduler_plugin.plugins.stripe import Held, normalize, raw, share_score
from scheduler_plugin.settings import Settings
from scheduler_plugin.testing import args_body, holding, inventory_json, node, pod, topology_json, two_class_topology
from scheduling.nodeinfo import NodeReader, parse_inventory
from tests.scheduler_plugin.server import serving

DIGEST = "0123456789abcdef0123456789abcdef"
GB = 10**9


def _view(state: str, done: int) -> dict[str, object]:
    return {
        "name": "imgs", "digest": DIGEST, "state": state, "sizeBytes": 8 * GB, "files": 10, "inUse": False,
        "lastUsed": None, "bytesDone": done,
    }  # fmt: skip


def test_the_agent_publishes_held_bytes_and_shares_and_the_extender_reads_them() -> None:
    stripes = {"big": {"digest": DIGEST, "sizeBytes": 40 * GB, "heldBytes": 9 * GB, "members": 4}}
    doc = inventory([_view("fetching", 3 * GB)], {"capacityBytes": 20 * GB, "freeBytes": 5 * GB}, "n1", stripes)
    contract.validate(doc)
    parsed, error = parse_inventory(contract.compact(doc))
    assert error is None and parsed is not None
    assert parsed.datasets["imgs"].held_bytes == 3 * GB and not parsed.datasets["imgs"].ready
    share = parsed.stripes["big"]
    assert (share.digest, share.size_bytes, share.held_bytes, share.members) == (DIGEST, 40 * GB, 9 * GB, 4)


def test_a_ready_copy_says_no_held_bytes_and_bad_stripe_entries_are_skipped() -> None:
    doc = inventory([_view("ready", 8 * GB)], {"capacityBytes": 20 * GB, "freeBytes": 5 * GB}, "n1")
    assert "heldBytes" not in doc["datasets"]["imgs"] and "stripes" not in doc
    doc["stripes"] = {
        "x": {"digest": 7},
        "y": "no",
        "z": {"digest": DIGEST, "sizeBytes": 5, "heldBytes": 9, "members": 2},
    }
    parsed, _ = parse_inventory(json.dumps(doc))
    assert parsed is not None and set(parsed.stripes) == {"z"} and parsed.stripes["z"].held_bytes == 5


def test_a_node_holding_its_ranks_share_scores_full() -> None:
    assert share_score(Held(size_bytes=40 * GB, held_bytes=10 * GB), workers=4) == 1.0
    assert share_score(Held(size_bytes=40 * GB, held_bytes=5 * GB), workers=4) == pytest.approx(0.5)
    assert share_score(Held(size_bytes=40 * GB, held_bytes=40 * GB), workers=4) == 1.0  # capped


def test_copies_being_fetched_count_at_a_discount() -> None:
    fetching = share_score(Held(size_bytes=40 * GB, fetching_bytes=10 * GB), workers=4)
    held = share_score(Held(size_bytes=40 * GB, held_bytes=10 * GB), workers=4)
    assert 0 < fetching < held


def test_group_members_earn_peer_credit_within_their_subnet_only() -> None:
    base = Held(size_bytes=40 * GB, held_bytes=2 * GB, group_member=True, peers_in_subnet=True)
    outsider = Held(size_bytes=40 * GB, held_bytes=2 * GB, group_member=False, peers_in_subnet=True)
    far_member = Held(size_bytes=40 * GB, held_bytes=2 * GB, group_member=True, peers_in_subnet=False)
    assert share_score(base, 4) > share_score(far_member, 4) == share_score(outsider, 4) > 0
    assert share_score(base, 4) < 1.0  # peers never beat local disk


def test_it_stays_a_score_nodes_holding_nothing_are_ranked_not_dropped() -> None:
    nodes = [[Held(40 * GB, 10 * GB)], [Held(40 * GB, 0)], [Held(40 * GB, 0, group_member=True, peers_in_subnet=True)]]
    scores = normalize([raw(n, 4) for n in nodes])
    assert scores[0] == 10 and scores[1] == 0 and 0 < scores[2] < 10
    assert len(scores) == len(nodes)


# -- wired into the extender's prioritize path ---------------------------------------------


def _stripe_inventory(node_name: str, held: int, size: int = 40 * GB) -> str:
    doc = json.loads(inventory_json(node_name))
    doc["stripes"] = {"big": {"digest": DIGEST, "sizeBytes": size, "heldBytes": held, "members": 4}}
    return json.dumps(doc)


def _fetching_inventory(node_name: str, held: int) -> str:
    entry = {**holding(DIGEST, state="fetching", size=40 * GB), "heldBytes": held}
    return inventory_json(node_name, {"big": entry})


def _other_subnet_topology() -> str:
    import dataclasses

    base = two_class_topology()
    nics = tuple(
        dataclasses.replace(n, addresses=(f"10.9.{i}.5/24",), subnets=(f"10.9.{i}.0/24",))
        for i, n in enumerate(base.nics)
    )
    return topology_json(dataclasses.replace(base, nics=nics))


def _nodes() -> list[dict[str, object]]:
    topo = topology_json()
    return [
        node("member-full", inventory=_stripe_inventory("member-full", 10 * GB), topology=topo, free_gpus=range(8)),
        node("member-half", inventory=_stripe_inventory("member-half", 5 * GB), topology=topo, free_gpus=range(8)),
        node(
            "member-alone",  # as much as member-half, but no group peer on its RoCE subnets
            inventory=_stripe_inventory("member-alone", 5 * GB),
            topology=_other_subnet_topology(),
            free_gpus=range(8),
        ),
        node("fetching", inventory=_fetching_inventory("fetching", 4 * GB), topology=topo, free_gpus=range(8)),
        node("nothing", inventory=inventory_json("nothing"), topology=topo, free_gpus=range(8)),
    ]


def _worker(workers: int) -> dict[str, object]:
    obj = pod(datasets=[{"name": "big", "digest": DIGEST}], gpus=8, job="llm")
    obj["metadata"]["annotations"]["dsagent.io/workers"] = str(workers)  # type: ignore[index]
    return obj


def test_the_extender_scores_partial_holdings_and_peer_credit_never_filtering() -> None:
    with serving(create_app(Settings())) as url, httpx.Client(base_url=url, timeout=30) as http:
        body = args_body(_worker(4), _nodes(), node_cache_capable=False)
        answer = http.post("/prioritize/dataset", content=body, headers={"Content-Type": "application/json"})
        assert answer.status_code == 200, answer.text
        scores = {h["Host"]: h["Score"] for h in answer.json()}
        filtered = http.post("/filter", content=args_body(_worker(4), _nodes(), node_cache_capable=False),
                             headers={"Content-Type": "application/json"}).json()  # fmt: skip
    # held / (S / N): 10 of 10 GB, then 5 of 10 GB plus peer credit over the shared subnet,
    # then 5 of 10 GB alone, then a copy being fetched (4 GB at half weight), then nothing
    assert scores["member-full"] == 10 and scores["nothing"] == 0
    assert scores["member-full"] > scores["member-half"] > scores["member-alone"] > scores["fetching"] > 0
    assert len(scores) == 5 and len(filtered["Nodes"]["items"]) == 5  # a score, never a filter


def test_a_smaller_job_needs_more_of_the_version_on_each_node() -> None:
    framework = Framework(Settings())
    reader = NodeReader()
    facts = [reader.read(n) for n in _nodes()]
    four = framework.dataset_scores(framework.read_pod(_worker(4)), facts)
    one = framework.dataset_scores(framework.read_pod(_worker(1)), facts)
    # four workers: each reads 10 GB, so 10 GB held is all of it (raws 1, 0.75, 0.5, 0.2, 0)
    assert four == [10, 7, 5, 2, 0]
    # one worker reads all 40 GB: what is held counts for a quarter as much, and the members
    # with a group peer on their subnet keep most of their score through peer credit
    # (raws 0.625, 0.5625, 0.125, 0.05, 0)
    assert one == [10, 9, 2, 0, 0]


def test_the_names_only_path_takes_partial_holdings_too() -> None:
    from scheduler_plugin.columns import NodeColumns

    reader = NodeReader()
    facts = {n["metadata"]["name"]: reader.read(n) for n in _nodes()}  # type: ignore[index]
    columns = NodeColumns(facts)
    framework = Framework(Settings())
    request = framework.read_pod(_worker(4))
    names = list(facts)
    via_columns = framework.prioritize_selection(request, columns.select(names), lambda: facts.values(), "dataset")
    assert via_columns == framework.dataset_scores(request, list(facts.values()))
    assert via_columns[0] == 10 and 0 < via_columns[3] < 10  # not the all-or-nothing 10/0
    columns.drop("member-full")
    columns.drop("member-half")
    columns.drop("member-alone")
    columns.drop("fetching")
    assert not columns.partly_held(request.datasets)


def test_a_member_earns_peer_credit_from_a_group_member_that_is_no_candidate() -> None:
    """``member-half`` is the only candidate holding a share; its group peer ``busy`` (same
    subnet, no free GPUs) is no candidate. Listed in the inventory's group, it still counts;
    a member whose listed peers are all on other subnets, or one whose inventory lists no
    group, earns no peer credit."""

    def grouped(node_name: str, group: list[str] | None) -> str:
        doc = json.loads(_stripe_inventory(node_name, 5 * GB))
        if group is not None:
            doc["stripes"]["big"]["group"] = group
        return json.dumps(doc)

    topo = topology_json()
    reader = NodeReader()
    busy = reader.read(node("busy", inventory=grouped("busy", ["member-half", "busy"]), topology=topo))
    far = reader.read(node("far", inventory=grouped("far", ["member-half", "far"]), topology=_other_subnet_topology()))
    known = {f.name: f for f in (busy, far)}  # the watch cache's nodes

    def scores(group: list[str] | None, *, cluster: bool = True) -> list[int]:
        framework = Framework(Settings(), node=known.get if cluster else None)
        request = framework.read_pod(_worker(1))
        half = node("member-half", inventory=grouped("member-half", group), topology=topo, free_gpus=range(8))
        # a copy of all 40 GB still arriving: raw 0.5, between the member with peer credit
        # (0.125 held of the one worker's 40 GB, plus half the rest: 0.5625) and without (0.125)
        copy = node("fetching", inventory=_fetching_inventory("fetching", 40 * GB), topology=topo, free_gpus=range(8))
        facts = [reader.read(half), reader.read(copy)]
        return framework.dataset_scores(request, facts)

    assert scores(["member-half", "busy"]) == [10, 8]  # busy serves it over the subnet
    for no_credit in (scores(["member-half", "far"]), scores(None), scores(["member-half", "busy"], cluster=False)):
        assert no_credit == [2, 10]
