"""Where a version is held, end to end: the real Dataset controller choosing with
:func:`dsagent.policy.holding.choose_placement` from what four real agents publish, the
agents holding what they are asked, and the rank-aware reader reading it.

- **A version that fits a node** is copied whole onto each node the job trains on, and
  nowhere else; training reads through the window at once, and every epoch once the copies
  are whole reads local disk (at least 90% of its bytes: here all of them). The second copy
  comes from the first over P2P: the store serves each bundle once in all.
- **A version larger than a node's cache** is held as shares over the job's own four nodes,
  and each rank reads its own node's share from local disk: no byte of a bundle its node
  owns goes through the agent.
- **A member that held the version whole keeps it whole** when a later job's nodes change
  the group: its agent is asked whole again and hands no bundle over.
- **Whole copies outlive their job**: once its pods are gone both copies stay, and a later
  job on two other nodes copies the version from them, not from the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dsagent.kube.podenv import STRIPE_WAIT_CONTAINER
from dsplatform.data import AgentEndpoint, StripedDataset
from tests.dsagent.controller.test_stripe_drain_agents import (
    NODES,
    _group,
    _reconcile_until,
    _share,
    _store_reads,
)
from tools.support.fake_apiserver import FakeApiServer, make_pod
from tools.support.harness import ADMIN_TOKEN

pytest.importorskip("aiohttp")
pytestmark = pytest.mark.slow  # four agent processes


def _job(apiserver: FakeApiServer, nodes: tuple[str, ...]) -> None:
    """The job's pods, one on each of ``nodes``, as the webhook wires a striped Dataset that
    starts before the copy is whole: the stripe-wait init container, no caching task."""
    wait = {"name": STRIPE_WAIT_CONTAINER, "image": "dsplatform/dsagent", "command": ["dsctl", "stripe", "wait"]}
    for i, node in enumerate(nodes):
        annotations = {"dsagent.io/datasets": "imgs"}
        pod = make_pod(f"train-{i}", namespace="ml", node_name=node, annotations=annotations, init_containers=[wait])
        apiserver.create(pod)


def _reader(group: Any, node: str, rank: int, job: tuple[str, ...], share_dir: str, epoch: int) -> StripedDataset:
    agent = AgentEndpoint(group.agents[node].url, token=ADMIN_TOKEN, timeout=60)
    return StripedDataset(share_dir, rank=rank, world_size=len(job), rank_nodes=list(job), agent=agent, epoch=epoch)


def _epoch(reader: StripedDataset) -> tuple[int, int]:
    """Reads the rank's samples; (local bytes, bytes through the agent)."""
    before = dict(reader.stats)
    got = sum(len(sample.data) for sample in reader)
    local = reader.stats["local_bytes"] - before["local_bytes"]
    agent = reader.stats["agent_bytes"] - before["agent_bytes"]
    assert local + agent == got
    return local, agent


def test_a_version_that_fits_is_copied_whole_onto_each_job_node_and_read_locally(
    tmp_path: Path, apiserver: FakeApiServer, api_client: Any
) -> None:
    job = ("n1", "n2")
    with _group(tmp_path, apiserver, api_client, stripe="auto") as group:
        _job(apiserver, job)
        digest = group.manifest.digest
        # the first passes: the job's nodes are asked for whole copies
        _reconcile_until(group, apiserver, lambda s: len(s.get("nodes") or []) == len(job))
        shares = {n: _share(group.agents[n], digest) for n in job}
        assert all(s is not None and s["holding"] == "whole" for s in shares.values()), shares
        # training starts at once: an epoch read now reads what is not local yet through the window
        first = [_epoch(_reader(group, n, r, job, shares[n]["shareDir"], 0)) for r, n in enumerate(job)]
        assert sum(local + agent for local, agent in first) == group.manifest.total_bytes

        stripe = _reconcile_until(group, apiserver, lambda s: s.get("state") == "Ready")
        assert [n["node"] for n in stripe["nodes"]] == list(job)  # not spread over n3 and n4
        whole = group.manifest.total_bytes
        assert all(n.get("holding") == "whole" and n["bytesHeld"] == whole for n in stripe["nodes"]), stripe
        assert _share(group.agents["n3"], digest) is None and _share(group.agents["n4"], digest) is None
        # each bundle came from the store once: the other copy took it over P2P
        assert _store_reads(group.store) == {b.digest: 1 for b in group.manifest.bundles}

        for epoch in (1, 2):
            for rank, node in enumerate(job):
                local, agent = _epoch(_reader(group, node, rank, job, shares[node]["shareDir"], epoch))
                assert local >= 0.9 * (local + agent) and agent == 0, (epoch, node, local, agent)


def test_a_version_larger_than_a_node_is_shares_over_the_jobs_nodes_each_rank_reading_its_own(
    tmp_path: Path, apiserver: FakeApiServer, api_client: Any
) -> None:
    # caches of 600 KB: the version (about 576 KB, 1.2x of it 690 KB) fits none of them
    small = {node: {"DSAGENT_CAPACITY": "600KB"} for node in NODES}
    job = NODES  # four ranks, one on each node
    with _group(tmp_path, apiserver, api_client, stripe="auto", node_env=small) as group:
        _job(apiserver, job)
        digest = group.manifest.digest
        stripe = _reconcile_until(group, apiserver, lambda s: s.get("state") == "Ready")
        assert [n["node"] for n in stripe["nodes"]] == list(job)  # the group is the job's own nodes
        assert not any(n.get("holding") == "whole" for n in stripe["nodes"])
        assert sum(n["bytesOwned"] for n in stripe["nodes"]) == group.manifest.total_bytes

        readers = []
        for rank, node in enumerate(job):
            share = _share(group.agents[node], digest)
            assert share is not None and share["holding"] == "share" and share["complete"]
            readers.append((node, _reader(group, node, rank, job, share["shareDir"], 1)))
        for rank, (node, reader) in enumerate(readers):
            layout = reader.layout
            own = sum(
                layout.files(layout.bundles[bi])[i - layout.bundles[bi].first][1]
                for bi, files in reader.assignment.ranks[rank]
                for i in files
                if layout.bundles[bi].owner == node
            )
            local, agent = _epoch(reader)
            # every byte of the bundles its node owns from local disk, none through the agent;
            # only samples the evening of counts moved to it come from the other members
            assert local == own and own > 0, (node, local, own, agent)
            assert local >= agent, (node, local, agent)


def test_a_member_that_held_the_version_whole_keeps_it_whole_when_the_group_changes(
    tmp_path: Path, apiserver: FakeApiServer, api_client: Any
) -> None:
    # a first job copies the version whole onto n1 and n2 and ends; a second job trains on
    # n1 and n3, whose 650 KB cache cannot hold the version whole (1.2x of about 576 KB).
    # The group changes (n3 joins), and n2, no longer a job's node but holding the
    # version whole, stays a member and keeps it whole: its agent keeps every bundle instead
    # of handing over those it does not own. The store still serves each bundle once
    with _group(
        tmp_path, apiserver, api_client, stripe="auto", node_env={"n3": {"DSAGENT_CAPACITY": "650KB"}}
    ) as group:
        digest, whole = group.manifest.digest, group.manifest.total_bytes
        _job(apiserver, ("n1", "n2"))
        _reconcile_until(group, apiserver, lambda s: s.get("state") == "Ready")
        first = {n["node"] for n in _reconcile_until(group, apiserver, lambda s: True)["nodes"]}
        for i in range(2):
            apiserver.delete("pods", f"train-{i}", "ml")
        _job(apiserver, ("n1", "n3"))
        stripe = _reconcile_until(
            group, apiserver,
            lambda s: s.get("state") == "Ready" and {n["node"] for n in s.get("nodes") or []} >= {"n1", "n2", "n3"},
        )  # fmt: skip
        held = {n["node"]: (n.get("holding"), n["bytesHeld"]) for n in stripe["nodes"]}
        assert held["n2"] == ("whole", whole) and held["n1"] == ("whole", whole), (first, held)
        share = _share(group.agents["n2"], digest)
        assert share is not None and share["holding"] == "whole" and share["complete"], share
        assert _store_reads(group.store) == {b.digest: 1 for b in group.manifest.bundles}


def test_whole_copies_stay_cached_after_the_job_ends_and_feed_the_next_jobs_nodes(
    tmp_path: Path, apiserver: FakeApiServer, api_client: Any
) -> None:
    # a first job copies the version whole onto n1 and n2 and ends. The group shrinks, but
    # the node it lets go keeps its copy (released with keep=whole: no lease, the cache's
    # eviction decides), so a second job on n3 and n4, both with room, copies the version
    # from n1 and n2: the store is not read again
    with _group(tmp_path, apiserver, api_client, stripe="auto") as group:
        digest = group.manifest.digest
        _job(apiserver, ("n1", "n2"))
        _reconcile_until(group, apiserver, lambda s: s.get("state") == "Ready")
        for i in range(2):
            apiserver.delete("pods", f"train-{i}", "ml")
        for _ in range(3):  # passes with no pod reading the version
            stripe = _reconcile_until(group, apiserver, lambda s: True)
        assert len(stripe["nodes"]) == 1, stripe  # the size rule's one member
        assert all((_share(group.agents[n], digest) or {}).get("complete") for n in ("n1", "n2"))

        _job(apiserver, ("n3", "n4"))
        stripe = _reconcile_until(
            group, apiserver,
            lambda s: s.get("state") == "Ready" and {n["node"] for n in s.get("nodes") or []} == {"n3", "n4"},
        )  # fmt: skip
        assert all(n.get("holding") == "whole" for n in stripe["nodes"]), stripe
        assert all((_share(group.agents[n], digest) or {}).get("complete") for n in NODES)
        assert _store_reads(group.store) == {b.digest: 1 for b in group.manifest.bundles}
