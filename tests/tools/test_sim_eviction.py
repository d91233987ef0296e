"""The simulator's eviction call site uses the product's cluster-aware order for ours
(docs/design.md#cluster-eviction): copies counted from the simulated nodes' caches."""

from __future__ import annotations

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
