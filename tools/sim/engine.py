"""A discrete-event simulator of a GPU cluster that runs the project's real scheduling code.

Who calls it: ``tools/sim/run.py``, ``tools/sim/sweep.py``, ``python -m tools.sim.deadline``
and the simulator's tests. It owns the event loop; the rest of one simulation is split by
concern, in layers below it (none of them imports the engine, nor a layer above it):

- :mod:`tools.sim.policies`: the policy names and what the deadline variants mean;
- :mod:`tools.sim.cluster`: the parameters and records (nodes, caches, transfers, outcomes);
- :mod:`tools.sim.state`: the state, the node facts the extender reads, the event queue;
- :mod:`tools.sim.placement`: where jobs go -- the product's filter and scores
  (:class:`scheduler_plugin.framework.Framework`), GPU sets (``gpu_topology``), time-model
  plans and migrations; the baselines' scores (:mod:`tools.sim.baselines`);
- :mod:`tools.sim.reads`: what each policy's pods read from where, and when they start --
  no cache, Fluid (:mod:`tools.sim.fluid`), a JuiceFS cache group
  (:mod:`tools.sim.juicefs`), ours with the agent's eviction
  (``dsagent.policy.eviction.plan_for_fetch``) and, striped over a group,
  :mod:`tools.sim.stripe`; the Dataset controller's preparation and replication through
  :mod:`tools.sim.hooks`;
- :mod:`tools.sim.flows`: bytes moving at the fair shares of the rates they pass through
  (:mod:`tools.sim.rates`: every default with its source).

Time is in simulated seconds from 0. Deterministic for a seed: stdlib ``random.Random``
only, ties broken by that generator, dicts iterated in insertion order. The model and
its citations: ``docs/simulator.md``.
"""

from __future__ import annotations

import heapq
import math

from tools.sim.cluster import EPOCH, MEASURED_FETCH_BPS, CacheEntry, ClusterParams, build_nodes, load_node_types
from tools.sim.hooks import RESYNC_S
from tools.sim.placement import Placement
from tools.sim.policies import BASELINES, OURS, OURS_VARIANTS, POLICIES
from tools.sim.reads import Reads


class Simulation(Placement, Reads):
    """One policy over one workload."""

    def run(self) -> Simulation:
        for job in self.jobs:
            self.push(job.arrival, "arrive", job.id)
        by_id = {j.id: j for j in self.jobs}
        while self.events or self.fetches:
            t_event = self.events[0][0] if self.events else math.inf
            t_fetch = self._next_fetch()
            t = min(t_event, t_fetch)
            self._progress(t - self.now)
            self.now = t
            if t_fetch <= t_event:
                self._finish_fetches()
            else:
                _, _, kind, ident = heapq.heappop(self.events)
                if kind == "arrive":
                    self.waiting.append(by_id[ident])
                elif kind == "end" and self.outcomes[ident].compute_end == t:  # not the end before a move
                    self._compute_done(self.outcomes[ident])
            if not self.events or self.events[0][0] > self.now:
                self.schedule()
                if self.prepare:
                    self.next_job(self)
                if self.replication is not None:
                    self.replication(self)
                if self.stripes and self.now - self.replanned_at >= RESYNC_S:
                    self.replanned_at = self.now
                    self._replan_whole()
                    self._repair_holes()
                    self._lapse_superseded()
        return self


__all__ = [
    "BASELINES",
    "EPOCH",
    "MEASURED_FETCH_BPS",
    "OURS",
    "OURS_VARIANTS",
    "POLICIES",
    "CacheEntry",
    "ClusterParams",
    "Simulation",
    "build_nodes",
    "load_node_types",
]
