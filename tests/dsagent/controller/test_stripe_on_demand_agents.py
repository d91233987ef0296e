"""Store reads on demand, end to end: the real Dataset controller holding a version for pods
that start before the copy is whole (``spec.startBeforeWhole``), four real agents, the
rank-aware reader (docs/design-striping.md#agent).

The controller asks the job's two nodes for whole copies with ``storeOnDemand``: their fills
ask the peers only, so before any reader nothing is read from the store, pass after pass.
A job that stops early reads part of the version on one node: each bundle it reads comes
from the store once in the whole cluster (the node's own from the store, those the other
node owns read by that owner for it), and the other node's copy takes them over P2P. A job
that reads the version to its end leaves both copies whole, each bundle still read from the
store once.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from dsplatform.data import AgentEndpoint, StripedDataset
from tests.dsagent.controller.test_stripe_drain_agents import _group, _reconcile_until, _sent, _share, _store_reads
from tests.dsagent.controller.test_stripe_holding_agents import _job
from tools.support.fake_apiserver import FakeApiServer
from tools.support.harness import ADMIN_TOKEN, eventually

pytest.importorskip("aiohttp")
pytestmark = pytest.mark.slow  # four agent processes

RETRY = {"DSAGENT_STRIPE_ON_DEMAND_RETRY": "300ms"}  # many fill passes within the test


def _held(group: Any, node: str) -> int:
    """How many bundles of the version ``node``'s agent holds (-1: it holds no share of it)."""
    share = _share(group.agents[node], group.manifest.digest)
    return -1 if share is None else int(share["bundlesHeld"])


def _reader(group: Any, node: str, share_dir: str) -> StripedDataset:
    """One rank on ``node`` reading the whole version (a job of one rank)."""
    agent = AgentEndpoint(group.agents[node].url, token=ADMIN_TOKEN, timeout=60)
    return StripedDataset(share_dir, rank=0, world_size=1, rank_nodes=[node], agent=agent, epoch=0)


def test_a_version_whose_pods_start_before_it_is_whole_is_read_from_the_store_as_far_as_it_is_read(
    tmp_path: Path, apiserver: FakeApiServer, api_client: Any
) -> None:
    job = ("n1", "n2")
    with _group(tmp_path, apiserver, api_client, stripe="auto", env=RETRY) as group:
        apiserver.patch("datasets", "imgs", {"spec": {"startBeforeWhole": True}}, "ml")
        _job(apiserver, job)
        digest = group.manifest.digest
        bundles = [b.digest for b in group.manifest.bundles]
        _reconcile_until(group, apiserver, lambda s: len(s.get("nodes") or []) == len(job))
        shares = {n: _share(group.agents[n], digest) or {} for n in job}
        for node, share in shares.items():
            assert share.get("holding") == "whole" and share["storeOnDemand"], (node, share)
            assert share["readyEnough"], share  # its pods start at once
        # the fills settle (many passes, each asking the peers) and the controller renews: no store read
        for _ in range(5):
            group.ctl.reconcile_all()
            time.sleep(0.5)
        assert _store_reads(group.store) == {}
        assert all(_held(group, n) == 0 for n in job)
        assert _share(group.agents["n3"], digest) is None and _share(group.agents["n4"], digest) is None
        # held on demand, its status says so: serving as far as it is read, not falling behind
        stripe = _reconcile_until(group, apiserver, lambda s: len(s.get("nodes") or []) == len(job))
        assert stripe["state"] == "OnDemand" and {n["state"] for n in stripe["nodes"]} == {"onDemand"}, stripe

        # a job that stops before its first epoch ends: a third of the samples on n1
        reader = _reader(group, "n1", shares["n1"]["shareDir"])
        got = list(itertools.islice(iter(reader), len(reader) // 3))
        assert got and reader.stats["agent_bytes"] > 0
        read = _store_reads(group.store)
        assert 0 < len(read) < len(bundles) and set(read.values()) == {1}, read  # each once in the cluster
        eventually(lambda: _held(group, "n2") == len(read), what="n2's copy")  # over P2P
        time.sleep(1.5)  # passes after: nothing more arrives, and nothing is read
        assert all(_held(group, n) == len(read) for n in job)
        assert _store_reads(group.store) == read
        sent = _sent(group.agents["n1"]) | _sent(group.agents["n2"])
        assert {b[:12] for b in read} <= sent  # each went to the other node over P2P

        # a job that reads it to its end: both copies whole, each bundle from the store once in all
        again = _reader(group, "n1", shares["n1"]["shareDir"])
        assert sum(len(sample.data) for sample in again) == group.manifest.total_bytes
        stripe = _reconcile_until(group, apiserver, lambda s: s.get("state") == "Ready")
        whole = group.manifest.total_bytes
        assert all(n.get("holding") == "whole" and n["bytesHeld"] == whole for n in stripe["nodes"]), stripe
        assert _store_reads(group.store) == dict.fromkeys(bundles, 1)
