"""Partial holdings and stripe shares: the agent's inventory parsed by the extender, and the
pure score over it (a score, never a filter)."""

from __future__ import annotations

import json

import pytest

from dsagent.cache import inventory as contract
from dsagent.cache.report import inventory
from scheduler_plugin.plugins.stripe import Held, normalize, raw, share_score
from scheduling.nodeinfo import parse_inventory

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
