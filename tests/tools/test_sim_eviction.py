"""The simulator's eviction call site uses the product's cluster-aware order for ours
(docs/design.md#cluster-eviction): copies counted from the simulated nodes' caches."""

from __future__ import annotations

from typing import Any

import pytest

from tools.sim.engine import CacheEntry, ClusterParams, Simulation
from tools.sim.hooks import RESYNC_S
from tools.sim.workload import Dataset

pytestmark = pytest.mark.slow

A100 = (("dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt", 1.0),)
TB = 10**12


def two_nodes(policy: str) -> Simulation:
    data = [Dataset("a", TB, (0.0,)), Dataset("c", TB, (0.0,))]
    params = ClusterParams(nodes=2, node_types=A100, cache_bytes=int(2.5 * TB), storage_bw=1e9, node_fetch_bw=1e9)
    sim = Simulation(policy, [], data, params, seed=3)
    here, there = sim.nodes
    here.cache[("a", 0)] = CacheEntry("a", 0, TB, last_used=1.0, ready=True)  # the cluster's last copy, older
    here.cache[("c", 0)] = CacheEntry("c", 0, TB, last_used=5.0, ready=True)
    there.cache[("c", 0)] = CacheEntry("c", 0, TB, last_used=5.0, ready=True)
    return sim


@pytest.mark.parametrize(("policy", "kept"), [("ours", "a"), ("ours+time", "a"), ("fluid", "c")])
def test_ours_evicts_the_replicated_version_and_baselines_stay_lru(policy: str, kept: str) -> None:
    sim = two_nodes(policy)
    assert sim._make_room(sim.nodes[0], TB)
    assert [k[0] for k in sim.nodes[0].cache] == [kept]


def test_to_its_keeper_a_replicated_version_is_the_last_copy() -> None:
    # "c" is held by both nodes; node 1 is its keeper (rendezvous hashing, as the controller
    # names it). Node 1 also holds the only copy of "z", older. To any other holder "c"
    # would go first (replicated); to its keeper both are last copies, and LRU takes "z"
    sim = two_nodes("ours")
    keeper = sim.nodes[1]
    keeper.cache[("z", 0)] = CacheEntry("z", 0, TB, last_used=1.0, ready=True)
    sim.copy_counts.get(sim)
    assert sim.copy_counts.keepers == {("c", 0): keeper.name}
    assert sim._make_room(keeper, TB)
    assert [k[0] for k in keeper.cache] == ["c"]


def test_the_counts_are_as_old_as_a_controller_resync() -> None:
    sim = two_nodes("ours")
    assert sim.copy_counts.get(sim) == {("a", 0): 1, ("c", 0): 2}
    del sim.nodes[1].cache[("c", 0)]  # the other node evicted its copy: not seen until the next resync
    sim.now = RESYNC_S / 2
    assert sim.copy_counts.get(sim)[("c", 0)] == 2
    sim.now = RESYNC_S
    assert sim.copy_counts.get(sim) == {("a", 0): 1, ("c", 0): 1}
    # now both are last copies: plain LRU takes the older one
    assert sim._make_room(sim.nodes[0], TB)
    assert [k[0] for k in sim.nodes[0].cache] == ["c"]


def stripe_node() -> Simulation:
    """One node holding a share (recently read) and two last copies (older), all idle."""
    data = [Dataset(n, TB, (0.0,)) for n in ("s", "c", "older")]
    params = ClusterParams(nodes=2, node_types=A100, cache_bytes=3 * TB, storage_bw=1e9, node_fetch_bw=1e9)
    sim = Simulation("ours+stripe+early", [], data, params, seed=3)
    node = sim.nodes[0]
    node.cache[("s", 0)] = CacheEntry("s", 0, TB, last_used=9.0, ready=True, stripe=True)
    node.cache[("c", 0)] = CacheEntry("c", 0, TB, last_used=2.0, ready=True)
    node.cache[("older", 0)] = CacheEntry("older", 0, TB, last_used=1.0, ready=True)
    return sim


def test_a_group_policy_evicts_in_the_agents_order_shares_with_last_copies() -> None:
    # 1.5 TB at the ratio needs two victims: the agent's order ranks the share with the
    # last copies (each the only copy of its bytes), so the two least recently used go and
    # the share, read after both, stays
    sim = stripe_node()
    node = sim.nodes[0]
    assert sim._make_room(node, int(1.5 * TB))
    assert list(node.cache) == [("s", 0)]


def test_the_simulator_evicts_what_the_products_plan_names(monkeypatch: pytest.MonkeyPatch) -> None:
    from dsagent.policy import eviction
    from tools.sim import reads

    plans: list[eviction.Plan] = []

    def plan_for_fetch(*args: Any, **kwargs: Any) -> eviction.Plan:
        plans.append(eviction.plan_for_fetch(*args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(reads, "plan_for_fetch", plan_for_fetch)
    sim = stripe_node()
    node = sim.nodes[0]
    before = set(node.cache)
    assert sim._make_room(node, int(1.5 * TB))
    (plan,) = plans
    assert {(v.name, int(v.digest, 16)) for v in plan.victims} == before - set(node.cache)
    assert [v.striped for v in plan.victims] == [False, False]


def test_a_replica_is_made_only_from_copies_other_nodes_hold() -> None:
    # a whole copy the controller places, or a share given to a node with room, never evicts
    # a share or a last copy: the room it needs is not there, so it is not made
    sim = stripe_node()
    node = sim.nodes[0]
    assert not sim._make_room(node, int(0.5 * TB), replica=True)
    assert len(node.cache) == 3
    sim.nodes[1].cache[("c", 0)] = CacheEntry("c", 0, TB, last_used=2.0, ready=True)  # now held twice
    sim.now = RESYNC_S  # the counts as the next resync publishes them
    sim.copy_counts.get(sim)
    assert sim.copy_counts.keepers[("c", 0)] == sim.nodes[1].name  # to node 0 it is a replicated copy
    assert sim._make_room(node, int(0.5 * TB), replica=True)
    assert sorted(node.cache) == [("older", 0), ("s", 0)]
