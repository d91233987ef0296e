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
- ``ours+stripe``: a version bigger than a node, one the pod's node cannot make room for,
  or one read for less than an epoch, striped over a group spanning the job's subnet
  (:mod:`tools.sim.stripe`; the group's choice and reads: :mod:`tools.sim.stripereads`),
  filled as it is read, read rank-affine from the first step;
  eviction in the agent's order (other nodes' copies, shares, last copies). ``+early``: whole
  copies too start at once, their local reads following the copy's fetch.

Training reads are aggregated per source over the job's epochs (one transfer per source
and worker, running beside the compute); the order of epochs inside a job is not modelled.
"""

from __future__ import annotations

import math
from dataclasses import replace

from dsagent.policy.eviction import REPLICATED, Candidate, eviction_class, plan_for_fetch
from dsagent.policy.holding import SHARE, Holding, holding
from gpu_topology.scoring import single_numa
from scheduling.timemodel import DEFAULT_BANDWIDTHS, intra_node_bandwidth, t_run
from tools.sim import fluid
from tools.sim.cluster import CacheEntry, Fetch, Holes, Node, Outcome, Worker
from tools.sim.fluid import Split
from tools.sim.policies import JUICEFS, OURS
from tools.sim.stripereads import StripeReads, parts_held
from tools.sim.workload import Dataset, Job

STRIPE = ("ours+stripe", "ours+stripe+early")


class Reads(StripeReads):
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
        for w in workers:  # a team member that did not fetch (it held a share after all) is no team's
            self.copy_team.pop((w.node.index, (job.dataset, self.version_of(job, out.start))), None)

    def _request_data(self, job: Job, worker: Worker, index: int) -> None:
        d = self.datasets[job.dataset]
        out = self.outcomes[job.id]
        key = (d.name, self.version_of(job, out.start))  # a moved job keeps its version
        self.requests += 1
        gpus = sum(len(w.gpus) for w in out.workers) or 1
        share = len(worker.gpus) / gpus
        epochs = out.epochs * out.remaining  # a moved job reads what is left
        first = min(epochs, 1.0) * d.size * share
        later = epochs * d.size * share - first
        if index == 0 and self.policy in STRIPE:
            self._copy_team(out, key, d.size)
        if self.policy == "default":
            self._plan(worker, Split(0.0, 0.0, first), Split(0.0, 0.0, later), kept=False)
            self._data_ready(out)
        elif self.policy in fluid.POLICIES or self.policy in JUICEFS:
            if index == 0:  # the job's pods together: first epochs (filling the cache), then the rest
                self._request_shared_cache(out, key, d)
            self._data_ready(out)
        elif self.policy in STRIPE and self._held_as(worker.node, key, d.size, room=False) is SHARE:
            # the product's decision (dsagent.policy.holding): bigger than a node, or this
            # node holds a share of the version's group (no room on it: _request_ours)
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
        holes: Holes | None = None,
        unkept: float = 0.0,
        peer_after: Fetch | None = None,
    ) -> None:
        """The worker's training reads, counted now and started at the first step; ``holes``:
        of the store's bytes, lost stripe members' (:attr:`tools.sim.cluster.Fetch.holes`),
        and ``unkept`` others no cache keeps (both kept by nobody)."""
        for i, s in enumerate((first, later)):
            self.read_bytes[i] += s.local + s.remote + s.store
            self.read_local[i] += s.local
            self.read_peer[i] += s.remote
            self.read_store[i] += s.store
        total = first + later
        worker.reads = [
            ("local", total.local, (), fuse, after, True, {}, 0.0),
            ("peer", total.remote, sources, fuse, peer_after, True, {}, 0.0),
            ("storage", total.store, (), fuse, None, kept, dict(holes or {}), unkept),
        ]

    def _held_as(self, node: Node, key: tuple[str, int], size: int, *, room: bool = True) -> Holding:
        """How ``node`` holds version ``key``, as the product decides it
        (:func:`dsagent.policy.holding.holding`): a share where it holds one already, else
        whole where the version fits its cache and (``room``) its room (free bytes, the
        version's bytes it holds, and idle copies other nodes hold ready too: the first
        eviction class, the controller's ``spare_bytes``), else a share."""
        entry = node.cache.get(key)
        if entry is not None and entry.stripe:
            return SHARE
        spare = self._room_bytes(node, key) if room else None
        return holding(size, cache_bytes=self.params.cache_bytes, room_bytes=spare)

    def _room_bytes(self, node: Node, key: tuple[str, int]) -> int:
        """What ``node`` can give version ``key`` without evicting the last copy of another
        version or a share: its free bytes, what it holds of ``key``, and its idle whole
        copies that other nodes hold ready too."""
        free = self.params.cache_bytes - node.used_bytes
        spare = sum(
            e.on_disk
            for k, e in node.cache.items()
            if k == key or (e.ready and not e.stripe and not e.in_use and self._others(k, e.ready, node) > 0)
        )
        return int(free + spare)

    # -- ours: a whole copy on the node ---------------------------------------------------

    def _request_ours(
        self, job: Job, worker: Worker, index: int, key: tuple[str, int], d: Dataset, first: float, later: float
    ) -> None:
        node, out = worker.node, self.outcomes[job.id]
        entry = node.cache.get(key)
        if entry is not None and entry.by_task:  # a controller task's copy a pod now uses
            self.task_used_bytes[entry.by_task] = self.task_used_bytes.get(entry.by_task, 0) + entry.size
            entry.by_task = ""
        head = min(1.0, out.epochs * out.remaining)  # of the version, what the job's first epoch reads
        if entry is not None:
            entry.users += 1
            entry.last_used = self.now
            self.touch(node)
            if self._tops_up(entry, head):  # the bundles it lacks, as read
                self._top_up(node, key, entry, head)
            fill = None if entry.ready else self.inflight[(node.index, key)]
            self._plan(worker, Split(first, 0.0, 0.0), Split(later, 0.0, 0.0), after=fill if self.early else None)
            if fill is not None and not self.early:
                fill.waiters.append((job, index))
                return
            worker.hit = fill is None
            self.hits += worker.hit
            self._data_ready(out)
            return
        held = self.policy in STRIPE
        # no room on this node: for a group policy, as the product decides it (a share here)
        if (held and self._held_as(node, key, d.size) is SHARE) or not self._make_room(node, d.size, replica=held):
            if self.policy in STRIPE:  # the cluster's cache, not the store: through a group
                self._read_elsewhere(job, worker, index, key, d, first, later)
                return
            self.uncached_reads += 1  # ours: read from the store every epoch
            self._plan(worker, Split(0.0, 0.0, first), Split(0.0, 0.0, later), kept=False)
            self._data_ready(out)
            return
        node.cache[key] = CacheEntry(d.name, key[1], d.size, self.now, users=1)
        self.touch(node)
        if not self.early:
            self._plan(worker, Split(first, 0.0, 0.0), Split(later, 0.0, 0.0))
            self._fetch_version(node, key, d.size, cached=True, waiter=(job, index))
            return
        self._fetch_version(node, key, d.size, cached=True, waiter=None, demand=head)  # +early: train as bundles land
        fill = self.inflight[(node.index, key)]
        self._plan(worker, Split(first, 0.0, 0.0), Split(later, 0.0, 0.0), after=fill)
        self._data_ready(out)

    def _tops_up(self, entry: CacheEntry, head: float) -> bool:
        """Whether a job reading ``head`` of the version in its first epoch has the node's copy
        ``entry`` fetch more of it (:meth:`_top_up`): under ``+early``, a ready copy holding
        part of it, that lacks more than a byte of what the job reads."""
        return self.early and entry.ready and head * (1.0 - entry.part) * entry.size > 1.0

    def _top_up(self, node: Node, key: tuple[str, int], entry: CacheEntry, head: float) -> None:
        """A copy holding part of the version (its earlier jobs stopped before their first
        epoch ended, :meth:`_tops_up`): what this job's first epoch reads of the rest is read
        from the store (or a peer holding the version whole) now, and kept."""
        more = head * (1.0 - entry.part)
        entry.ready, entry.landed = False, entry.part
        size = self._from_parts(node, key, math.ceil(more * entry.size), None)
        self._fetch_version(node, key, size, cached=True, waiter=None, top_up=True)
        entry.part = min(1.0, entry.part + more)

    def _from_parts(self, node: Node, key: tuple[str, int], size: int, waiter: tuple[Job, int] | None) -> int:
        """Of ``size`` bytes a copy reads as its job reads them, those that other nodes' partial
        copies hold between them (:func:`~tools.sim.stripereads.parts_held`) come from those
        nodes, as the agent asks its peers before the store; returns what is left for the store."""
        parts = self._partial_copies(node, key)
        if not parts:
            return size
        held = math.floor(size * parts_held(parts.values()))
        if held <= 1:
            return size
        if waiter is not None:
            self.outcomes[waiter[0].id].pending += 1  # ready when both parts are in
        self._new_fetch(
            node, key, held, cached=False, waiter=waiter, source="peer", sources=tuple(sorted(parts)), unpack=True
        )
        return size - held

    @property
    def early(self) -> bool:
        """``+early``: training starts when the first bundles are local, its local reads
        following the copy's fetch."""
        return self.policy == "ours+stripe+early"

    def _fetch_version(
        self,
        node: Node,
        key: tuple[str, int],
        size: int,
        *,
        cached: bool,
        waiter: tuple[Job, int] | None,
        demand: float = 1.0,
        top_up: bool = False,
    ) -> None:
        """A fetch by ours' agent, for a pod or a controller task (preparation, replica):
        peer-to-peer first, as the agent does for every fetch: a version another agent holds
        ready is read from it, not from storage (or from a peer still fetching it, bundle by
        bundle, as agents starting together do); its bundle requests are spread over every
        peer that holds it, and where a group holds bundles of it too, those from their
        owners first. ``demand`` (``+early``: the product's storeOnDemand): where the
        version comes from the store, only that part of it, what the job's first epoch reads,
        is read and kept (the copy holds that part); peers fill what they hold."""
        source, after = "storage", None
        sources: tuple[int, ...] = ()
        entry = node.cache.get(key)
        team = self.copy_team.pop((node.index, key), ())
        parted = False  # other nodes' partial copies asked already (once a fetch)
        if not top_up and demand < 1.0 and entry is not None and not self.copies_elsewhere(node, key):
            # another node's copy filling: this one fills from it; the job's other nodes
            # filling their parts of this copy are no such copy
            if not any(k == key and i != node.index and i not in team for (i, k) in self.inflight):
                size = math.ceil(size * demand)  # from the store or the job's other nodes: as read
                entry.part = demand
                size, parted = self._from_parts(node, key, size, waiter), True
        seeds = tuple(sorted(self.ready_copies.get(key, set()) - {node.index})) if self.params.peers else ()
        # a whole copy of it filling outside the team: the team's parts come from it as it lands
        outside = [f for (i, k), f in self.inflight.items() if k == key and i not in team]
        filling = outside[0] if len(outside) == 1 and self._whole_in_flight(outside[0]) else None
        alone = not outside or filling is not None
        if self.params.peers and len(team) > 1 and alone and self._group_bytes(key, node)[0] <= 1.0:
            # copied whole together with the job's other nodes (the agents' swarm): this
            # node's part from the nodes holding it ready (or the one filling it, as its
            # bundles land), else the store; the others' parts from those nodes, no faster
            # than their parts arrive
            own = math.ceil(size / len(team))
            if seeds or filling is not None:
                after = self._new_fetch(
                    node, key, own, cached=cached, waiter=None, source="peer",
                    sources=seeds or (filling.node.index,), unpack=True, part=True,  # type: ignore[union-attr]
                    after=None if seeds else filling,
                )  # fmt: skip
            else:
                # its own part: other nodes' partial copies first (unless asked above, or by the
                # top-up that called), then the store
                stored = own if parted or top_up else self._from_parts(node, key, own, None)
                after = self._new_fetch(node, key, stored, cached=cached, waiter=None, unpack=True, part=True)
            source, sources, size = "peer", tuple(m for m in team if m != node.index), size - own
        elif seeds and (grouped := self._group_bytes(key, node))[0] > 1.0:
            # held whole elsewhere and by a group: the agent asks the group's members first,
            # then the nodes holding it whole (dsagent.cache.striped.stripefetch), so the
            # owners serve the bytes they hold and the whole copies the rest
            have, owners = grouped
            owned = min(float(size), size * have / self.datasets[key[0]].size)
            if size - owned <= 1.0:
                source, sources = "peer", tuple(sorted({*owners, *seeds}))
            else:
                if waiter is not None:
                    self.outcomes[waiter[0].id].pending += 1  # ready when both parts are in
                self._new_fetch(
                    node, key, owned, cached=False, waiter=waiter, source="peer", sources=owners, unpack=True
                )
                source, sources, size = "peer", seeds, math.ceil(size - owned)
        elif seeds:  # the nodes holding it ready (none without peers)
            source, sources = "peer", seeds
        elif self.params.peers and (
            after := next((f for (i, k), f in self.inflight.items() if k == key and i != node.index), None)
        ):
            source, sources = "peer", (after.node.index,)
            held = after.node.cache.get(key)
            if not top_up and entry is not None and held is not None and held.part < 1.0:
                # what that copy is filling from it; what this job reads beyond it, from the store
                target = max(demand, held.part)
                rest = math.ceil(size * target) - math.ceil(size * held.part)
                size, entry.part = math.ceil(size * held.part), target
                if rest > 1:
                    if waiter is not None:
                        self.outcomes[waiter[0].id].pending += 1  # ready when both parts are in
                    self._new_fetch(node, key, rest, cached=cached, waiter=waiter, unpack=True, part=True)
            elif not top_up and self._shares_fill(after, size):
                size = math.ceil(size - self._split_fill(after, node, key, cached))
        elif self.params.peers and (grouped := self._group_bytes(key, node))[0] > 1.0:
            # a group holds bundles of it: those come from their owners, the rest from the store
            have, owners = grouped
            if size - have <= 1.0:
                source, sources = "peer", owners
            else:
                if waiter is not None:
                    self.outcomes[waiter[0].id].pending += 1  # ready when both parts are in
                self._new_fetch(
                    node, key, have, cached=False, waiter=waiter, source="peer", sources=owners, unpack=True
                )
                size = math.ceil(size - have)
        elif not parted and not top_up:  # other nodes' partial copies before the store
            size = self._from_parts(node, key, size, waiter)
        fetch = self._new_fetch(
            node, key, size, cached=cached, waiter=waiter, source=source, sources=sources, unpack=True, after=after
        )
        if cached:
            self.inflight[(node.index, key)] = fetch

    def _shares_fill(self, fill: Fetch, size: int) -> bool:
        """Whether a node fetching ``size`` bytes of a version joins ``fill``, another node's
        fetch of a whole copy from the store, as the agents' swarm does
        (``dsagent/cache/peers/swarm.py``: each agent takes the bundles in its own rotation,
        claims the one it reads, and asks the others first): the whole version, from a
        fetch no other node shares yet."""
        return (
            fill.source == "storage" and not fill.stream and fill.after is None and fill.remaining > 2.0
            and size >= fill.total - 1.0 and self._whole_in_flight(fill)
        )  # fmt: skip

    def _split_fill(self, fill: Fetch, node: Node, key: tuple[str, int], cached: bool) -> float:
        """``node`` joins ``fill`` (:meth:`_shares_fill`): of the bundles ``fill`` has not
        fetched yet, ``node`` reads half from the store (the bytes ``fill`` counted already)
        and ``fill``'s node takes them from ``node`` as they land, so the copy it fills is
        whole no sooner than that half arrives; ``node`` takes the rest, the bundles
        ``fill`` holds or still reads, from ``fill``'s node. Returns the half."""
        half = fill.remaining / 2
        fill.remaining -= half
        fill.total -= half
        own = self._new_fetch(node, key, half, cached=cached, waiter=None, unpack=True, part=True, counted=False)
        back = self._new_fetch(
            fill.node, key, half, cached=False, waiter=None, source="peer", sources=(node.index,), unpack=True,
            after=own,
        )  # fmt: skip
        fill.after = back
        self.after_fetches.append(fill)  # after ``back``: its rate is known when ``fill``'s is set
        return half

    @staticmethod
    def _whole_in_flight(fetch: Fetch) -> bool:
        """A fetch filling a whole copy of its version (not a part of a copy filled in parts)."""
        held = fetch.node.cache.get(fetch.key)
        return not fetch.part and held is not None and not held.stripe and held.part >= 1.0

    def _copy_team(self, out: Outcome, key: tuple[str, int], size: int) -> None:
        """The job's nodes that will copy the version whole together, those holding none of it
        and those whose copy holds part of it (:meth:`_tops_up_or_lacks`): as the controller
        places them (:func:`dsagent.policy.holding.choose_placement`: the job's nodes a
        version fits are members holding it whole), each owns a part of its bundles,
        reads that part from the nodes holding the version ready (the earlier members), else
        the store, and the rest from the other members (docs/design-striping.md#holding)."""
        nodes = [self.nodes[i] for i in dict.fromkeys(w.node.index for w in out.workers)]
        head = min(1.0, out.epochs * out.remaining)
        team = tuple(
            n.index for n in nodes if self._tops_up_or_lacks(n, key, head) and self._held_as(n, key, size) is not SHARE
        )
        if len(team) > 1:
            for i in team:
                self.copy_team[(i, key)] = team

    def _tops_up_or_lacks(self, node: Node, key: tuple[str, int], head: float) -> bool:
        """Whether ``node`` fetches version ``key`` when a job reading ``head`` of it in its
        first epoch starts there: it holds none of it, or (``+early``) a copy holding part of
        it, whose agent fetches the rest of what the job reads (:meth:`_top_up`) in the same
        swarm as the job's other nodes (``dsagent/cache/peers/swarm.py``: every agent fetching
        the version takes its own rotation of the bundles it lacks)."""
        entry = node.cache.get(key)
        return entry is None or (not entry.stripe and self._tops_up(entry, head))

    def _group_bytes(self, key: tuple[str, int], node: Node) -> tuple[float, tuple[int, ...]]:
        """Bytes of the version its group's other members hold on disk, and those members."""
        group = self.stripes.get(key)
        if group is None:
            return 0.0, ()
        owners = tuple(
            m for m in group.members if m in group.holding and m != node.index and group.fill.get(m, 0.0) > 0
        )
        return sum(group.owned[m] * group.fill[m] for m in owners), owners

    def _make_room(
        self,
        node: Node,
        size: int,
        *,
        dry_run: bool = False,
        replica: bool = False,
        keep: tuple[str, int] | None = None,
    ) -> bool:
        """Room for ``size`` bytes by the agent's eviction policy, the product's
        :func:`~dsagent.policy.eviction.plan_for_fetch` over the node's copies as its agent
        sees them: with a group policy (``ours+stripe``) each share marked ``striped`` (no idle
        sweep takes it), and the product's order evicts versions other nodes also hold ready
        first (most other copies first), then the only copies of their bytes, the least
        recently used first (a share ranked as a whole copy of its version here would). A
        ``replica`` (a copy the controller places where the room comes without a last copy:
        a whole copy of a version the cluster holds, a share given to a node with room) is
        made only from the first class, as the controller's room check (the inventory's
        ``spare_bytes``) counts it: it never costs the cluster the last copy of something
        else. ``keep``: a version never chosen, as the agent never evicts a share for its
        own room. In a group's pass the copies its members evict are counted gone
        (:attr:`group_evicted`)."""
        aware = self.policy in OURS
        striped = self.policy in STRIPE
        candidates = [
            Candidate(
                name,
                f"{version:032x}",
                e.on_disk,
                e.last_used,
                in_use=e.in_use or (name, version) == keep,
                fetching=not e.ready,
                copies=self._others((name, version), e.ready, node) if aware else None,
                striped=striped and e.stripe,
            )
            for (name, version), e in node.cache.items()
        ]
        if striped and replica:
            candidates = [c if eviction_class(c) == REPLICATED else replace(c, in_use=True) for c in candidates]
        plan = plan_for_fetch(candidates, size=size, free=self.params.cache_bytes - node.used_bytes)
        if not plan.sufficient:
            return False
        for victim in plan.victims if not dry_run else ():
            key = (victim.name, int(victim.digest, 16))
            if self.group_evicted is not None and node.cache[key].ready and not node.cache[key].stripe:
                self.group_evicted[key] = self.group_evicted.get(key, 0) + 1
            self._forget(node, key)
        return True

    def _others(self, key: tuple[str, int], ready: bool, node: Node) -> int:
        """Other nodes' ready copies of a version as ``node``'s eviction counts them (the
        published counts, up to ``RESYNC_S`` old; none when it is the version's keeper), less
        those a group's pass has already taken: its members are chosen and make room
        together, so no two count on each other's copy and between them evict the
        cluster's last."""
        gone = self.group_evicted.get(key, 0) if self.group_evicted else 0
        return max(0, self.copy_counts.others(self, key, ready, node.name) - gone)

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
        if self.policy in JUICEFS:
            firsts = [self.juicefs.split(key, d.size, w.node.index, head * s) for w, s in zip(out.workers, shares)]
            for one in firsts:
                self.juicefs.fill(key, d.size, one.store, self.now)
            laters = [self.juicefs.split(key, d.size, w.node.index, tail * s) for w, s in zip(out.workers, shares)]
            # spread over the ring: every other member serves its blocks, each member's upload
            # shared among the reads it serves, as Fluid's workers and ours' peers are
            sources: list[tuple[int, ...]] = [self.juicefs.serving(w.node.index) for w in out.workers]
        else:
            rt = self._fluid_runtime(d, out.workers[0].node, [w.node.index for w in out.workers])
            rt.readers += len(out.workers)
            firsts = [self.fluid.split(rt, key[1], d.size, w.node.index, head * s) for w, s in zip(out.workers, shares)]
            for w, one in zip(out.workers, firsts):
                self.fluid.fill(rt, w.node.index, one.store)
                self.fluid.passive_fill(rt, w.node.index, one.remote)
            laters = [self.fluid.split(rt, key[1], d.size, w.node.index, tail * s) for w, s in zip(out.workers, shares)]
            sources = [
                tuple(m for m in rt.workers if m != w.node.index and rt.held.get(m, 0.0) > 0) for w in out.workers
            ]
        for w, one, rest, src in zip(out.workers, firsts, laters, sources):
            # the first epoch's store reads fill the cache; what the later epochs still read
            # from the store is what it could not keep
            self._plan(w, one, rest, fuse=True, sources=src, unkept=rest.store)
            w.hit = one.remote + one.store + rest.remote + rest.store == 0
            self.hits += w.hit

    def _fluid_runtime(self, d: Dataset, node: Node, job_nodes: list[int]) -> fluid.Runtime:
        """The dataset's runtime (created on first use, idle ones scaled in for room); the
        nodes' labels follow its workers (what the webhook's affinity reads)."""
        before = set(self.fluid.runtimes)
        rt, created, _ = self.fluid.runtime(d.name, d.size, node.index, self._fluid_room, self.now, job_nodes)
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

    def _read_elsewhere(
        self, job: Job, worker: Worker, index: int, key: tuple[str, int], d: Dataset, first: float, later: float
    ) -> None:
        """A version that fits one node but not this one now (its room is held by running
        pods' data, or by last copies and shares a whole copy may not evict): read through the
        version's group (formed as for a version bigger than a node), as the product reads
        every version of a Dataset with ``spec.stripe``: the job's node joins with a share
        where it has room for one, and reads the rest from the members. Nodes holding the
        version whole, or still fetching it, feed what the group lacks instead of the store
        (:meth:`_request_stripe`); they serve the pod's every epoch only where no group can
        be formed (no node has room for a share). A group first, because a pod never reads
        another node's copy itself in the product (peers serve agents' fetches, and pods
        hold no peer token: docs/design.md#peers), and the few nodes holding a hot version
        whole, each serving every such reader every epoch at one node's upload, held those
        readers' GPUs idle for hours past their compute (``results-tight``, seed 6)."""
        out = self.outcomes[job.id]
        group = self.stripes.get(key)
        if group is None or (job.id, out.start) not in group.jobs:  # formed or repaired once per start
            group = self._stripe_group(out, key, d.size)
        if group is not None:
            total = first + later
            share = total / (out.epochs * out.remaining * d.size or 1.0)
            self._request_stripe(job, worker, index, key, d, total / (d.size * share or 1.0), share)
            return
        holders = tuple(sorted(self.ready_copies.get(key, set()) - {worker.node.index}))
        filling = None
        if not holders and self.params.peers:  # a copy still being fetched serves what it has
            filling = next((f for (i, k), f in self.inflight.items() if k == key and i != worker.node.index), None)
            holders = (filling.node.index,) if filling is not None else ()
        if holders:
            self._plan(worker, Split(0.0, first, 0.0), Split(0.0, later, 0.0), sources=holders, peer_after=filling)
        else:  # nothing in the cluster's caches: the store every epoch, as ours
            self.uncached_reads += 1
            self._plan(worker, Split(0.0, 0.0, first), Split(0.0, 0.0, later), kept=False)
        self._data_ready(out)

    # -- the first step and the end ----------------------------------------------------------

    def _data_ready(self, out: Outcome) -> None:
        out.pending -= 1
        if out.pending > 0:
            return
        if math.isnan(out.first_step):
            out.first_step = self.now
        job = out.job
        key = (job.dataset, self.version_of(job, out.start))
        n = sum(len(w.gpus) for w in out.workers)
        bw = min(intra_node_bandwidth(w.node.type.topology, w.gpus) for w in out.workers)
        if len(out.workers) > 1:
            net = DEFAULT_BANDWIDTHS.network * (self.params.cross_subnet_factor if out.spans_subnets else 1.0)
            bw = min(bw, net)
        out.end = out.compute_end = self.now + out.delay + t_run(job.profile, n, bw) * out.remaining
        for index, w in enumerate(out.workers):
            for source, size, sources, fuse, after, kept, holes, unkept in w.reads:
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
                        holes=holes,
                        unkept=unkept,
                        pace=self._pace(out, size),
                    )
            w.reads = []
        self.running[job.id] = out
        self.push(out.end, "end", job.id)

    def _pace(self, out: Outcome, size: float) -> float:
        """The most a training read of ``size`` bytes starting now takes per second: its
        bytes over the job's compute left (none once the compute is done: what is left of
        its reads is what its GPUs wait for)."""
        left = out.compute_end - self.now
        return size / left if left > 0 else math.inf

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
        version = self.version_of(out.job, out.start)
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
        if group is not None and out.job.id in group.readers:
            group.users = max(0, group.users - group.readers.pop(out.job.id))
            for seen in [k for k in group.seen if k[0] == out.job.id]:
                del group.seen[seen]
            if group.users == 0:  # nobody reads it: the controller's hold on each member ends
                group.last_read = self.now
                for m in group.members:  # a share, or a whole copy (let go, it keeps it: keep=whole)
                    entry = self.nodes[m].cache.get((d.name, version)) if m >= 0 else None
                    if entry is not None and entry.replica:
                        entry.replica = False
                        entry.last_used = self.now


__all__ = ["STRIPE", "Reads"]
