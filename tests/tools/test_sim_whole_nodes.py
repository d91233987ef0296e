"""The simulator keeps whole nodes as the product's extender does: it hands the product's
filter the jobs its queue tried and could not place (docs/design.md#whole-nodes)."""

from __future__ import annotations

from tests.tools.test_sim import TB, cluster, job
from tools.sim.cluster import CacheEntry
from tools.sim.engine import Simulation
from tools.sim.workload import Dataset


def test_a_small_pod_behind_an_unplaced_wide_job_leaves_the_whole_nodes_to_it() -> None:
    data = [Dataset("ds000", TB // 1000, (0.0,))]
    first, wide, small = job(0, 0.0, gpus=4), job(1, 10.0, workers=3, gpus=8), job(2, 20.0, gpus=2)
    sim = Simulation("ours+stripe+early", [first, wide, small], data, cluster(nodes=3), seed=3)
    busy, holder, empty = sim.nodes
    busy.free.difference_update(range(4))  # four GPUs in use: the only node not whole
    version = sim.version_of(small, small.arrival)
    holder.cache[("ds000", version)] = CacheEntry("ds000", version, TB // 1000, 0.0, ready=True)
    sim.waiting[:] = [wide, small]
    for node in sim.nodes:
        sim.touch(node)

    # the wide job not tried yet: nothing is kept, and the small pod goes to its data
    assert sim._waiting().jobs == {}
    assert sim._choose(small, 2, set(), 1) is holder
    # tried and not placed (three whole nodes needed, two free): the small pod, queued
    # behind it, goes to the node in use, not to its data on a whole node
    sim.unschedulable.add(wide.id)
    assert set(sim._waiting().jobs) == {f"sim/job-{wide.id}"}
    assert all(sim._choose(small, 2, set(), 1) is busy for _ in range(10))
    # with no other node to go to, it takes a whole one, its data's
    assert sim._choose(small, 2, {busy.index}, 1) is holder
    # a one-worker job that could not be placed keeps nothing (only wide jobs wait for whole nodes)
    sim.unschedulable = {first.id}
    sim.waiting[:] = [first, small]
    assert sim._waiting().jobs == {}
    assert sim._choose(small, 2, set(), 1) is holder
