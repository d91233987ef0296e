"""What each policy's pods read, from where, and when their first step may come.

Who calls it: :class:`tools.sim.engine.Simulation` (a mix-in over
:class:`tools.sim.state.SimState`). It owns a job's data from its start to its release:
every worker reads its share of the dataset (its GPUs over the job's) for the job's
epochs, split into bytes from its own disk, from other nodes and from the store; the
first step waits only for what the policy waits for. The models (docs/simulator.md):

- ``default`` (no cache): the pod reads every epoch from the store as it trains.
- ``fluid*``: :mod:`tools.sim.fluid` (a runtime per dataset, local-first blocks, FUSE).
- ``juicefs``: :mod:`tools.sim.juicefs` (a cache group, blocks on a hash ring, FUSE).
- ``ours`` and variants: the agent's whole copy on the node (P2P first, then the store,
  at the unpack rate), the first step when it is ready, every epoch from local disk; a
  version the node cannot make room for is read from the store every epoch, as a
  direct-mode pod does.
- ``ours+stripe``: a version bigger than a node, striped over a group
  (:mod:`tools.sim.stripe`), read rank-affine; the first step when the node's own share
  is on disk (``+early``: at once, its local reads following the share's fetch).

Training reads are aggregated per source over the job's epochs (one transfer per source
and worker, running beside the compute); the order of epochs inside a job is not modelled.
"""

from __future__ import annotations

import math

from dsagent.cache.eviction import Candidate, plan_for_fetch
from gpu_topology.scoring import single_numa
from scheduling.timemodel import DEFAULT_BANDWIDTHS, intra_node_bandwidth, t_run
from tools.sim import fluid, stripe
from tools.sim.cluster import CacheEntry, Fetch, Node, Outcome, Worker
from tools.sim.flows import Flows
from tools.sim.fluid import Split
from tools.sim.state import OURS
from tools.sim.workload import Dataset, Job

STRIPE = ("ours+stripe", "ours+stripe+early")


class Reads(Flows):
    def _start(self, job: Job, workers: list[Worker]) -> None:
        out = self.outcomes[job.id]
        out.start = self.now
        out.workers = workers
        out.pending = len(workers)
        out.plan_gpus = out.plan_gpus or job.gpus
        if len(workers) > 1:
            out.spans_subnets = len({w.classes for w in workers}) > 1
        if math.isnan(out.first_step):
            self.started_log.append((self.now, job.dataset, len(workers)))
        out.numa_split = sum(1 for w in workers if len(w.gpus) > 1 and not single_numa(w.node.type.topology, w.gpus))
        for index, w in enumerate(workers):
            self._request_data(job, w, index)

    def _request_data(self, job: Job, worker: Worker, index: int) -> None:
        d = self.datasets[job.dataset]
        out = self.outcomes[job.id]
        key = (d.name, d.version_at(out.start))  # a moved job keeps its version
        self.requests += 1
        gpus = sum(len(w.gpus) for w in out.workers) or 1
        share = len(worker.gpus) / gpus
        epochs = out.epochs * out.remaining  # a moved job reads what is left
        first = min(epochs, 1.0) * d.size * share
        later = epochs * d.size * share - first
        if self.policy == "default":
            self._plan(worker, Split(0.0, 0.0, first), Split(0.0, 0.0, later), kept=False)
            self._data_ready(out)
        elif self.policy in fluid.POLICIES or self.policy == "juicefs":
            if index == 0:  # the job's pods together: first epochs (filling the cache), then the rest
                self._request_shared_cache(out, key, d)
            self._data_ready(out)
        elif self.policy in STRIPE and stripe.needs_group(d.size, self.params.cache_bytes):
            self._request_stripe(job, worker, index, key, d, epochs, share)
        else:
            self._request_ours(job, worker, index, key, d, first, later)

    def _plan(
        self,
        worker: Worker,
        first: Split,
        later: Split,
        *,
        fuse: bool = False,
        sources: tuple[int, ...] = (),
        kept: bool = True,
        after: Fetch | None = None,
    ) -> None:
        """The worker's training reads, counted now and started at the first step."""
        for i, s in enumerate((first, later)):
            self.read_bytes[i] += s.local + s.remote + s.store
            self.read_local[i] += s.local
            self.read_peer[i] += s.remote
            self.read_store[i] += s.store
        total = first + later
        worker.reads = [
            ("local", total.local, (), fuse, after, True),
            ("peer", total.remote, sources, fuse, None, True),
            ("storage", total.store, (), fuse, None, kept),
        ]

    # -- ours: a whole copy on the node ---------------------------------------------------

    def _request_ours(
        self, job: Job, worker: Worker, index: int, key: tuple[str, int], d: Dataset, first: float, later: float
    ) -> None:
        node, out = worker.node, self.outcomes[job.id]
        entry = node.cache.get(key)
        if entry is not None and entry.by_task:  # a controller task's copy a pod now uses
            self.task_used_bytes[entry.by_task] = self.task_used_bytes.get(entry.by_task, 0) + entry.size
            entry.by_task = ""
        if entry is not None:
            entry.users += 1
            entry.last_used = self.now
            self.touch(node)
            self._plan(worker, Split(first, 0.0, 0.0), Split(later, 0.0, 0.0))
            if entry.ready:
                self.hits += 1
                worker.hit = True
                self._data_ready(out)
            else:
                self.inflight[(node.index, key)].waiters.append((job, index))
            return
        if not self._make_room(node, d.size):  # no room: read from the store every epoch
            self.uncached_reads += 1
            self._plan(worker, Split(0.0, 0.0, first), Split(0.0, 0.0, later), kept=False)
            self._data_ready(out)
            return
        node.cache[key] = CacheEntry(d.name, key[1], d.size, self.now, users=1)
        self.touch(node)
        self._plan(worker, Split(first, 0.0, 0.0), Split(later, 0.0, 0.0))
        self._fetch_version(node, key, d.size, cached=True, waiter=(job, index))

    def _fetch_version(
        self, node: Node, key: tuple[str, int], size: int, *, cached: bool, waiter: tuple[Job, int] | None
    ) -> None:
        """A fetch by ours' agent, for a pod or a controller task (preparation, replica):
        peer-to-peer first, as the agent does for every fetch: a version another agent holds
        ready is read from it, not from storage (or from a peer still fetching it, bundle by
        bundle, as agents starting together do); its bundle requests are spread over every
        peer that holds it."""
        source, after = "storage", None
        sources: tuple[int, ...] = ()
        if self.params.peers and self.copies_elsewhere(node, key) > 0:
            source, sources = "peer", tuple(sorted(self.ready_copies[key] - {node.index}))
        elif self.params.peers:
            after = next((f for (i, k), f in self.inflight.items() if k == key and i != node.index), None)
            if after is not None:
                source, sources = "peer", (after.node.index,)
        fetch = self._new_fetch(
            node, key, size, cached=cached, waiter=waiter, source=source, sources=sources, unpack=True, after=after
        )
        if cached:
            self.inflight[(node.index, key)] = fetch

    def _make_room(self, node: Node, size: int) -> bool:
        aware = self.policy in OURS
        candidates = [
            Candidate(
                name,
                f"{version:032x}",
                e.size,
                e.last_used,
                in_use=e.in_use,
                fetching=not e.ready,
                copies=self.copy_counts.others(self, (name, version), e.ready) if aware else None,
            )
            for (name, version), e in node.cache.items()
        ]
        plan = plan_for_fetch(candidates, size=size, free=self.params.cache_bytes - node.used_bytes)
        if not plan.sufficient:
            return False
        for victim in plan.victims:
            self._forget(node, (victim.name, int(victim.digest, 16)))
        return True

    def _drop_old_versions(self, node: Node, key: tuple[str, int]) -> None:
        for other in [k for k, e in node.cache.items() if k[0] == key[0] and k[1] < key[1] and not e.in_use]:
            self._forget(node, other)

    # -- the baselines ------------------------------------------------------------------

    def _request_shared_cache(self, out: Outcome, key: tuple[str, int], d: Dataset) -> None:
        """Fluid (the dataset's runtime, created on first use; tools/sim/fluid.py) or the
        JuiceFS group (tools/sim/juicefs.py), read through FUSE from the first step on: the
        pods' first epoch reads what is cached and fills the rest from the store; the
        epochs after it read the cache as the first epoch left it."""
        gpus = sum(len(w.gpus) for w in out.workers) or 1
        epochs = out.epochs * out.remaining
        shares = [len(w.gpus) / gpus * d.size for w in out.workers]
        head, tail = min(epochs, 1.0), max(0.0, epochs - 1.0)
        # ranks read disjoint shares of an epoch: the first epoch's split is the cache as the
        # job found it, its store reads then fill the cache, the later epochs read that
        if self.policy == "juicefs":
            firsts = [self.juicefs.split(key, d.size, w.node.index, head * s) for w, s in zip(out.workers, shares)]
            for one in firsts:
                self.juicefs.fill(key, d.size, one.store, self.now)
            laters = [self.juicefs.split(key, d.size, w.node.index, tail * s) for w, s in zip(out.workers, shares)]
            sources: list[tuple[int, ...]] = [() for _ in out.workers]  # spread over the ring
        else:
            rt = self._fluid_runtime(d, out.workers[0].node)
            rt.readers += len(out.workers)
            firsts = [self.fluid.split(rt, key[1], d.size, w.node.index, head * s) for w, s in zip(out.workers, shares)]
            for w, one in zip(out.workers, firsts):
                self.fluid.fill(rt, w.node.index, one.store)
            laters = [self.fluid.split(rt, key[1], d.size, w.node.index, tail * s) for w, s in zip(out.workers, shares)]
            sources = [
                tuple(m for m in rt.workers if m != w.node.index and rt.held.get(m, 0.0) > 0) for w in out.workers
            ]
        for w, one, rest, src in zip(out.workers, firsts, laters, sources):
            self._plan(w, one, rest, fuse=True, sources=src)
            w.hit = one.remote + one.store + rest.remote + rest.store == 0
            self.hits += w.hit

    def _fluid_runtime(self, d: Dataset, node: Node) -> fluid.Runtime:
        """The dataset's runtime (created on first use, idle ones scaled in for room); the
        nodes' labels follow its workers (what the webhook's affinity reads)."""
        before = set(self.fluid.runtimes)
        rt, created, _ = self.fluid.runtime(d.name, d.size, node.index, self._fluid_room, self.now)
        for name in before - set(self.fluid.runtimes):  # scaled in: labels go with the workers
            for n in self.nodes:
                if name in n.labels:
                    n.labels.discard(name)
                    self.touch(n)
        for w in created:
            self.nodes[w].labels.add(d.name)  # Fluid labels the nodes its cache workers run on
            self.touch(self.nodes[w])
        return rt

    def _fluid_room(self) -> list[tuple[int, int]]:
        """(node index, uncommitted cache bytes) of every node, for a new runtime's workers."""
        return [(n.index, self.params.cache_bytes - self.fluid.committed.get(n.index, 0)) for n in self.nodes]

    # -- ours+stripe ----------------------------------------------------------------------

    def _request_stripe(
        self, job: Job, worker: Worker, index: int, key: tuple[str, int], d: Dataset, epochs: float, share: float
    ) -> None:
        out, node = self.outcomes[job.id], worker.node
        group = self._stripe_group(out, key, d.size) if index == 0 else self.stripes.get(key)
        if group is None:  # no group could be formed: the store every epoch, as ours
            head_bytes = min(epochs, 1.0) * d.size * share
            tail_bytes = epochs * d.size * share - head_bytes
            self.uncached_reads += 1
            self._plan(worker, Split(0.0, 0.0, head_bytes), Split(0.0, 0.0, tail_bytes), kept=False)
            self._data_ready(out)
            return
        group.users += 1
        job_nodes = {w.node.index for w in out.workers}
        owned_here = sum(group.owned.get(m, 0.0) for m in job_nodes)
        mine = group.owned.get(node.index, 0.0) if node.index in group.holding else 0.0
        hole = sum(v for m, v in group.owned.items() if m not in group.holding)  # lost shares: the store
        per_epoch = Split(mine, max(0.0, d.size - owned_here - hole) * share, hole * share)
        head = min(epochs, 1.0)
        first = Split(per_epoch.local * head, per_epoch.remote * head, per_epoch.store * head)
        rest = max(0.0, epochs - head)
        later = Split(per_epoch.local * rest, per_epoch.remote * rest, per_epoch.store * rest)
        sources = tuple(m for m in group.members if m not in job_nodes and m in group.holding)
        fill = self.inflight.get((node.index, key))
        entry = node.cache.get(key)
        if entry is not None:
            entry.users += 1
            entry.last_used = self.now
        early = self.policy == "ours+stripe+early"
        self._plan(worker, first, later, sources=sources, kept=False, after=fill if early else None)
        if fill is not None and not early:
            fill.waiters.append((job, index))
            return
        worker.hit = fill is None and entry is not None
        self.hits += worker.hit
        self._data_ready(out)

    def _stripe_group(self, out: Outcome, key: tuple[str, int], size: int) -> stripe.Group | None:
        """The version's group, formed or repaired for this job: its nodes first, then nodes
        holding bundles, then nodes with room in the job's subnet; each member's missing
        share fetched from the store (held while the version is read)."""
        cache = self.params.cache_bytes
        group = self.stripes.get(key)
        job_nodes = [self.nodes[i] for i in dict.fromkeys(w.node.index for w in out.workers)]
        if group is None:
            need = max(stripe.members_needed(size, cache), len(job_nodes))
            layout = {c.name for c in job_nodes[0].type.classes}
            taken = {n.index for n in job_nodes}
            others = sorted(
                (n for n in self.nodes if n.index not in taken and {c.name for c in n.type.classes} == layout),
                key=lambda n: (-self._evictable(n), n.index),
            )
            candidates = job_nodes + others
            members: list[Node] = []
            for n in candidates:
                if len(members) >= need:
                    break
                if self._evictable(n) >= stripe.HEADROOM * size / need:
                    members.append(n)
            if len(members) < stripe.members_needed(size, cache):
                return None
            ids = tuple(sorted(n.index for n in members))
            group = self.stripes[key] = stripe.Group(key, ids, self._owners(key, size, ids))
        for m in group.members:
            node = self.nodes[m]
            entry = node.cache.get(key)
            if entry is not None:
                entry.replica = True  # held by the controller's task while the version is read
                continue
            owned = int(group.owned[m])
            if owned <= 0:
                group.holding.add(m)
                continue
            if not self._make_room(node, owned):  # a hole: its bundles come from the store
                continue
            node.cache[key] = CacheEntry(key[0], key[1], owned, self.now, replica=True, stripe=True)
            self.touch(node)
            fetch = self._new_fetch(node, key, owned, cached=True, waiter=None, unpack=True, on_done="stripe")
            self.inflight[(m, key)] = fetch
            group.holding.add(m)
        return group

    def _evictable(self, node: Node) -> int:
        return self.params.cache_bytes - sum(e.size for e in node.cache.values() if e.in_use)

    def _owners(self, key: tuple[str, int], size: int, members: tuple[int, ...]) -> dict[int, float]:
        memo = self.owner_memo.get((key, members))
        if memo is None:
            memo = self.owner_memo[(key, members)] = stripe.owners(key, size, members)
        return memo

    # -- the first step and the end ----------------------------------------------------------

    def _data_ready(self, out: Outcome) -> None:
        out.pending -= 1
        if out.pending > 0:
            return
        if math.isnan(out.first_step):
            out.first_step = self.now
        job = out.job
        key = (job.dataset, self.datasets[job.dataset].version_at(out.start))
        for index, w in enumerate(out.workers):
            for source, size, sources, fuse, after, kept in w.reads:
                if size > 1.0:
                    live = after if after is not None and after.remaining > 1.0 else None
                    self._new_fetch(
                        w.node,
                        key,
                        size,
                        cached=kept,
                        waiter=(job, index),
                        source=source,
                        stream=True,
                        sources=sources,
                        fuse=fuse,
                        after=live,
                    )
            w.reads = []
        n = sum(len(w.gpus) for w in out.workers)
        bw = min(intra_node_bandwidth(w.node.type.topology, w.gpus) for w in out.workers)
        if len(out.workers) > 1:
            net = DEFAULT_BANDWIDTHS.network * (self.params.cross_subnet_factor if out.spans_subnets else 1.0)
            bw = min(bw, net)
        out.end = out.compute_end = self.now + out.delay + t_run(job.profile, n, bw) * out.remaining
        self.running[job.id] = out
        self.push(out.end, "end", job.id)

    def _compute_done(self, out: Outcome) -> None:
        """The job's steps are done; it ends when its training reads are done too."""
        if out.streams > 0:
            out.end = math.inf  # still reading: ends at the last read's end
            return
        self._release(out)

    def _stream_done(self, out: Outcome) -> None:
        out.streams -= 1
        if out.streams == 0 and out.end == math.inf:
            out.end = self.now
            self._release(out)

    def _release(self, out: Outcome) -> None:
        self.running.pop(out.job.id, None)
        self._release_workers(out)

    def _release_workers(self, out: Outcome) -> None:
        d = self.datasets[out.job.dataset]
        version = d.version_at(out.start)
        rt = self.fluid.runtimes.get(d.name) if self.policy in fluid.POLICIES else None
        group = self.stripes.get((d.name, version))
        for w in out.workers:
            w.node.free.update(w.gpus)
            if rt is not None:
                rt.readers = max(0, rt.readers - 1)
            for key, e in list(w.node.cache.items()):
                if key[0] == d.name and e.users > 0 and key[1] == version:
                    e.users -= 1
                    e.last_used = self.now
                    newer = [k for k in w.node.cache if k[0] == d.name and k[1] > key[1]]
                    if e.users == 0 and newer:
                        self._forget(w.node, key)  # an old version goes when no task holds it
            self.touch(w.node)
        if group is not None and self.policy in STRIPE and stripe.needs_group(d.size, self.params.cache_bytes):
            group.users = max(0, group.users - len(out.workers))
            if group.users == 0:  # nobody reads it: the controller's hold on each share ends
                for m in group.members:
                    entry = self.nodes[m].cache.get((d.name, version))
                    if entry is not None and entry.stripe:
                        entry.replica = False
                        entry.last_used = self.now


__all__ = ["STRIPE", "Reads"]
