"""How ``ours+stripe`` pods read a version through a stripe group, and how the group is chosen.

Who calls it: :class:`tools.sim.reads.Reads`, the mix-in over it (its ``_plan``,
``_make_room`` and ``_data_ready`` are the ones these methods call), for a version the
product holds as shares (:func:`dsagent.policy.holding.holding`: bigger than a node, or one
the pod's node cannot make room for; docs/simulator.md). It owns the group of a version
(:meth:`StripeReads._stripe_group`: the members the controller's
:func:`dsagent.policy.holding.choose_placement` answers, each making room in the agent's eviction order) and
each rank's reads through it, rank-affine, filled as read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from dsagent.cache.settings import Settings
from dsagent.policy.holding import WHOLE, choose_placement, holding, worth_whole
from dsagent.policy.stripegroup import Candidate
from tools.sim import stripe
from tools.sim.cluster import CacheEntry, Fetch, Node, Outcome, Worker
from tools.sim.flows import Flows, through_window
from tools.sim.fluid import Split
from tools.sim.workload import Dataset, Job

#: how long an agent keeps a share nobody holds again (``stripe_lease``, the agent's default)
SHARE_LEASE_S = float(Settings.model_fields["stripe_lease"].default)


def parts_held(parts: Iterable[float]) -> float:
    """The part of a version that partial copies holding ``parts`` of it hold between them.
    A copy's bundles are those its jobs read, in any order, so each copy holds a random
    part of the bundles independently of the others: what none of them holds is the product
    of what each lacks."""
    missing = 1.0
    for part in parts:
        missing *= 1.0 - min(1.0, max(0.0, part))
    return 1.0 - missing


class StripeReads(Flows):
    # while a group is chosen and its members make room (:meth:`_stripe_group`): per version,
    # the ready copies the members chosen so far evict, which the published counts do not show
    group_evicted: dict[tuple[str, int], int] | None = None

    def _request_stripe(
        self, job: Job, worker: Worker, index: int, key: tuple[str, int], d: Dataset, epochs: float, share: float
    ) -> None:
        """Rank-affine reads through the version's group, from the first step on: each rank
        reads the bundles its own node owns, and its share of the bundles owned by members
        outside the job; a bundle its owner holds is read from that disk, one it does not
        hold yet is read from the store once, through its owner, which keeps it (each miss
        filled once, only what the job reads: a job reading part of an epoch fills part of
        the group); a lost share (a hole) is read from the store."""
        out, node = self.outcomes[job.id], worker.node
        group = self.stripes.get(key)
        if group is None or (job.id, out.start) not in group.jobs:  # formed or repaired once per start
            group = self._stripe_group(out, key, d.size)
        if group is None:  # no group could be formed: the store every epoch, as ours
            head_bytes = min(epochs, 1.0) * d.size * share
            tail_bytes = epochs * d.size * share - head_bytes
            self.uncached_reads += 1
            self._plan(worker, Split(0.0, 0.0, head_bytes), Split(0.0, 0.0, tail_bytes), kept=False)
            self._data_ready(out)
            return
        group.users += 1
        group.readers[job.id] = group.readers.get(job.id, 0) + 1
        job_nodes = {w.node.index for w in out.workers}
        head, rest = min(epochs, 1.0), max(0.0, epochs - min(epochs, 1.0))
        first, later = Split(0.0, 0.0, 0.0), Split(0.0, 0.0, 0.0)
        holes: dict[int, tuple[float, float]] = {}  # a hole's bundles: read from the store, kept by nobody
        for m, owned in group.owned.items():
            if m in job_nodes and m != node.index:
                continue  # another rank's bundles
            part = owned if m == node.index else owned * share
            if m not in group.holding:
                holes[m] = (part * (head + rest), part)
                first += Split(0.0, 0.0, part * head)
                later += Split(0.0, 0.0, part * rest)
                continue
            was = group.seen.setdefault((job.id, m), group.fill.get(m, 0.0))  # before this job's reads
            now = was + head * (1.0 - was)  # the bundles of this part the first epoch reads, kept by m
            cached = Split(part, 0.0, 0.0) if m == node.index else Split(0.0, part, 0.0)
            moving = group.arriving.pop(m, 0.0) if m == node.index else 0.0  # still on the old owners' disks
            first += Split(
                cached.local * (was - moving) * head,
                (cached.remote * was + part * moving) * head,
                part * (1.0 - was) * head,
            )
            later += Split(cached.local * now * rest, cached.remote * now * rest, part * (1.0 - now) * rest)
            if m == node.index or m not in job_nodes:
                self._grow(
                    group,
                    key,
                    m,
                    min(1.0, group.fill.get(m, 0.0) + head * (part / owned if owned else 0.0) * (1.0 - was)),
                )
                self.touch(self.nodes[m])  # its inventory's held bytes changed
        sources = tuple(m for m in group.members if m not in job_nodes and m in group.holding)
        if moving_from := tuple(m for m in group.members if m in group.holding and m != node.index and m in job_nodes):
            sources = tuple(sorted({*sources, *moving_from}))  # the old owners among the job's nodes
        holders = tuple(sorted(self.ready_copies.get(key, set()) - {node.index}))
        filling = None  # else a whole copy still arriving: its bundles no faster than they land
        if not holders and self.params.peers:
            filling = next((f for (i, k), f in self.inflight.items() if k == key and i != node.index), None)
            holders = (filling.node.index,) if filling is not None else ()
        if holders:  # whole copies elsewhere: what the group lacks comes from them, not the store
            first = Split(first.local, first.remote + first.store, 0.0)
            later = Split(later.local, later.remote + later.store, 0.0)
            sources = tuple(sorted({*sources, *holders}))
            holes = {}
        elif parts := self._partial_copies(node, key):
            # copies holding part of the version (their jobs read part of an epoch): of what
            # the group lacks, what they hold between them comes from them, as the members
            # ask their peers before the store
            held = parts_held(parts.values())
            first = Split(first.local, first.remote + first.store * held, first.store * (1.0 - held))
            later = Split(later.local, later.remote + later.store * held, later.store * (1.0 - held))
            sources = tuple(sorted({*sources, *parts}))
            holes = {m: (b * (1.0 - held), part * (1.0 - held)) for m, (b, part) in holes.items()}
        entry = node.cache.get(key)
        if entry is not None:
            entry.users += 1
            entry.last_used = self.now
        self._plan(worker, first, later, sources=sources, holes=holes, peer_after=filling)
        worker.hit = entry is not None and first.store + later.store == 0
        self.hits += worker.hit
        self._data_ready(out)

    def _grow(self, group: stripe.Group, key: tuple[str, int], m: int, fill: float) -> None:
        """Member ``m`` holds ``fill`` of its share of ``key`` now: a share held
        ``storeOnDemand`` takes the room for the bundles arriving as they arrive, by the
        agent's eviction plan (:meth:`dsagent.cache.striped.sharefill.Share.reserved_bytes`), not
        when the group is formed (its ``part`` is the part on disk, :attr:`Node.used_bytes`)."""
        group.fill[m] = fill
        node = self.nodes[m]
        entry = node.cache.get(key)
        if entry is None or not entry.stripe or fill <= entry.part:
            return
        self._make_room(node, int(entry.size * (fill - entry.part)), keep=key)
        entry.part = fill

    def _partial_copies(self, node: Node, key: tuple[str, int]) -> dict[int, float]:
        """Other nodes' copies holding part of version ``key`` (a whole copy whose jobs read
        part of an epoch under ``storeOnDemand``), by the part each holds: a ready one's, and
        what one fetching more of it held before (``landed``)."""
        if not self.params.peers:
            return {}
        parts = {}
        for n in self.nodes:
            e = n.cache.get(key)
            if n.index == node.index or e is None or e.stripe:
                continue
            held = e.part if e.ready else e.landed
            if held > 0:
                parts[n.index] = held
        return parts

    def _replan_whole(self) -> None:
        """The controller's pass over the versions read through a group: a job's node the
        version now fits, with room made without a last copy (the product's
        :func:`dsagent.policy.holding.choose_placement` marks it ``whole``, as it does at
        every pass, not only when the job started), is asked to hold it whole. Its agent
        fetches the bundles it lacks (the group's owners and peers before the store); the
        rank reads through the window until the copy is whole, its own disk after that
        (:meth:`_read_locally`)."""
        for out in list(self.running.values()):
            job = out.job
            key = (job.dataset, self.version_of(job, out.start))
            group = self.stripes.get(key)
            if group is None or job.id not in group.readers:
                continue
            size = self.datasets[job.dataset].size
            for index, worker in enumerate(out.workers):
                node = worker.node
                entry = node.cache.get(key)
                if entry is not None and not entry.stripe:
                    continue  # held whole already
                room = self._room_bytes(node, key)
                if holding(size, cache_bytes=self.params.cache_bytes, room_bytes=room) is not WHOLE:
                    continue
                held = int(entry.size * group.fill.get(node.index, 0.0)) if entry is not None else 0
                if not worth_whole(int(self._window_bytes(node, key)), size - held):
                    continue
                if not self._make_room(node, size - (entry.on_disk if entry is not None else 0), replica=True):
                    continue
                if entry is None:
                    entry = node.cache[key] = CacheEntry(key[0], key[1], size, self.now, users=1)
                entry.size, entry.stripe, entry.ready, entry.part = size, False, False, 1.0
                entry.last_used = self.now
                self.touch(node)
                self._fetch_version(node, key, max(1, size - held), cached=True, waiter=None)
                self.whole_pending.setdefault((node.index, key), []).append((out, index))
                self.whole_replans += 1

    def _repair_holes(self) -> None:
        """The controller's pass over the groups being read: a slot whose chosen owner could
        not hold its share when the group was formed (a hole, its bundles read from the store
        by every reader, every epoch) is given to a node that has room now (the same choice
        as at the group's forming, :meth:`_taker`), as the controller chooses another
        node at its next pass for a share an agent refused. From then on the readers read
        that slot's bundles through the new owner: the first pass over them from the store,
        kept by it, the rest from its disk."""
        for key, group in self.stripes.items():
            if group.users <= 0:
                continue
            lacking = [m for m in group.members if m not in group.holding and group.owned.get(m, 0.0) > 0]
            reading = [o for o in (self.running.get(j) for j in group.readers) if o is not None]
            if not lacking or not reading:
                continue
            for m in lacking:
                slot, owned = group.members.index(m), int(group.owned[m])
                taker = self._taker(reading[0], group, key, m, owned, refused=False)
                if taker is None:
                    continue
                taker.cache[key] = CacheEntry(
                    key[0], key[1], owned, self.now, ready=True, replica=True, stripe=True, part=0.0
                )
                self.touch(taker)
                group.members = (*group.members[:slot], taker.index, *group.members[slot + 1 :])
                group.owned = {taker.index if k == m else k: v for k, v in group.owned.items()}
                group.holding.add(taker.index)
                group.fill[taker.index] = 0.0
                for f in [f for f in self.fetches if f.key == key and f.stream and m in f.holes]:
                    self._hole_filled(f, m, taker, owned)

    def _lapse_superseded(self) -> None:
        """The controller holds the shares of a Dataset's current version only
        (docs/design-striping.md#superseded): once a newer version appears it renews the old
        version's shares no more, and each member's agent drops its share once the lease has
        lapsed and nobody used it for a lease either: :data:`SHARE_LEASE_S` after the newer
        version appeared or after the group's last reader ended, whichever is later. A member
        holding the version whole keeps its copy (the cache's eviction decides when it goes,
        as for any copy)."""
        for key, group in list(self.stripes.items()):
            versions = self.datasets[key[0]].versions
            if key[1] + 1 >= len(versions) or group.users > 0:
                continue  # current, or read through the group now
            if self.now < max(versions[key[1] + 1], group.last_read) + SHARE_LEASE_S:
                continue  # its lease has not lapsed, or it was read within one
            if any(f.key == key for f in self.fetches):
                continue  # still filled
            for m in group.members:
                node = self.nodes[m] if m >= 0 else None
                entry = node.cache.get(key) if node is not None else None
                if node is not None and entry is not None and entry.stripe and not entry.in_use:
                    self._forget(node, key)
                    self.touch(node)
            del self.stripes[key]
            self.lapsed_shares += 1

    def _hole_filled(self, f: Fetch, m: int, taker: Node, owned: int) -> None:
        """What is left of training read ``f``'s bytes of hole ``m`` is read through ``taker``,
        its slot's new owner: one epoch's worth from the store (kept by it), the rest from its
        disk. Those bytes leave ``f`` and the store's counts (they were counted as the hole's
        when ``f`` started)."""
        whole, per_epoch = f.holes.pop(m)
        left = whole * f.remaining / f.total if f.total > 0 else 0.0
        if math.isfinite(f.pace) and f.remaining > 0:  # fewer bytes over the same steps
            f.pace *= max(0.0, f.remaining - left) / f.remaining
        f.total -= whole
        f.remaining -= left
        self.storage_bytes -= left
        self.storage_by_cause["lost_member"] -= left
        self.storage_uncached_bytes -= left
        self.storage_log.append((self.now, self.storage_bytes))
        later = min(left, self.read_store[1])
        self.read_store[1] -= later
        self.read_store[0] -= left - later
        fill = min(left, per_epoch)
        self.read_store[1] += fill
        self.read_peer[1] += left - fill
        group = self.stripes[f.key]
        self._grow(
            group, f.key, taker.index, min(1.0, group.fill.get(taker.index, 0.0) + (fill / owned if owned else 0.0))
        )
        job, index = f.waiters[0]
        if f.remaining <= 1.0:  # only the hole's bytes were left: this read is done with
            self._close_stream(f)
        for size, source in ((fill, "storage"), (left - fill, "peer")):
            if size > 1.0:
                self._new_fetch(
                    f.node, f.key, size, cached=True, waiter=(job, index), source=source, stream=True,
                    sources=(taker.index,) if source == "peer" else (), pace=self._pace(self.outcomes[job.id], size),
                )  # fmt: skip
        if f.remaining <= 1.0:
            self._stream_done(self.outcomes[job.id])

    def _close_stream(self, f: Fetch) -> None:
        """Take training read ``f`` out of the open transfers before its end (its waiter's
        stream count is the caller's to settle)."""
        self.fetches.remove(f)
        f.open = False
        self._count(f, -1)
        if f in self.after_fetches:
            self.after_fetches.remove(f)

    def _window_bytes(self, node: Node, key: tuple[str, int]) -> float:
        """What ``node``'s readers took of ``key`` through the window so far (the inventory's
        ``windowBytes``): its finished reads from other members, and the open ones' progress."""
        done = self.window_read.get((node.index, key), 0.0)
        return done + sum(
            f.total - f.remaining for f in self.fetches if through_window(f) and f.node is node and f.key == key
        )

    def _read_locally(self, out: Outcome, index: int) -> None:
        """The rank's copy is whole: its open reads through the window (from the group's
        other members) are read from its own disk from now on."""
        if self.running.get(out.job.id) is not out:
            return  # ended (or moved) while its copy was filled
        for f in [f for f in self.fetches if through_window(f) and (out.job, index) in f.waiters]:
            left = f.remaining
            self._window_done(f, f.total - left)
            self._close_stream(f)
            out.streams -= 1
            moved = min(left, self.read_peer[1])  # from the later epochs' window reads
            self.read_peer[1] -= moved
            self.read_local[1] += moved
            self.read_peer[0] -= left - moved
            self.read_local[0] += left - moved
            self.peer_bytes -= left
            self._new_fetch(
                out.workers[index].node, f.key, left, cached=True, waiter=(out.job, index), source="local",
                stream=True, pace=self._pace(out, left),
            )  # fmt: skip

    def _stripe_group(self, out: Outcome, key: tuple[str, int], size: int) -> stripe.Group | None:
        """The version's group, formed or repaired for this job; each member's missing share
        fetched from the store (held while the version is read). Owners are drawn over the
        group's slots (:func:`stripe.owners`); a slot's node is recorded with the group, so a
        member that lost its share and cannot make room again hands its slot, and only its
        slot's bundles, to a node that can (:meth:`_taker`; a hole only when none can)."""
        group = self.stripes.get(key)
        placed = True
        if group is None:
            owners, shareless = self._choose_members(out, key, size)
            if not owners:
                return None
            owned = {**self._slot_owners(key, size, owners), **dict.fromkeys(shareless, 0.0)}
            group = self.stripes[key] = stripe.Group(key, (*owners, *shareless), owned, shareless=set(shareless))
        else:
            placed = self._join(out, group, key, size)
        group.jobs.add((out.job.id, out.start))
        self.group_evicted = {}
        for slot, m in enumerate(group.members):
            node = self.nodes[m] if m >= 0 else None  # m < 0: a slot no node could hold yet
            entry = node.cache.get(key) if node is not None else None
            if entry is not None:
                entry.replica = True  # held by the controller's task while the version is read
                entry.last_used = self.now
                group.holding.add(m)
                continue
            owned = int(group.owned[m])
            if owned <= 0:
                group.holding.add(m)
                continue
            # held storeOnDemand: refused only where evicting could not make the share's room
            if node is None or not self._make_room(node, owned, dry_run=True):
                taker = self._taker(out, group, key, m, owned, refused=True)
                if taker is None:  # a hole: its bundles come from the store
                    continue
                node = taker
                group.holding.discard(m)
                group.members = (*group.members[:slot], node.index, *group.members[slot + 1 :])
                group.owned = {node.index if k == m else k: v for k, v in group.owned.items()}
            # held storeOnDemand: no room is taken now, its bundles take theirs as the readers
            # read them (:meth:`_grow`)
            node.cache[key] = CacheEntry(
                key[0], key[1], owned, self.now, ready=True, replica=True, stripe=True, part=0.0
            )
            self.touch(node)
            group.fill[node.index] = 0.0
            group.holding.add(node.index)
        self.group_evicted = None
        if not placed:  # a slot had lost its share: placed again now that its slot is handed over
            self._join(out, group, key, size)
        return group

    def _join(self, out: Outcome, group: stripe.Group, key: tuple[str, int], size: int) -> bool:
        """A job starts reading the version: the controller's pass places the group again with
        the nodes of the Dataset's pods, whether or not they are members already: the product's
        :func:`dsagent.policy.holding.choose_placement`, called here over every node with the
        nodes of every job reading the version, the earlier members and those of them that
        owned no share (its member count is :func:`dsagent.policy.holding.members_wanted`'s:
        the job's nodes, the whole copies a node reading through the window spreads its reads
        over, and the earlier members still holding their share). Each job node is a member,
        owning a share where it has room for one without evicting a last copy, else none,
        and then a node with room owning in its place. Rendezvous hashing gives each new
        owner about 1/k of the bundles; those the old owners held move over the peers (read
        from there in the new owner's first epoch, not the store). False, with nothing done,
        for a job on members only while a slot has lost its share: the slots can be handed
        over but not taken away, so :meth:`_stripe_group` hands that slot to a node with room
        first (:meth:`_taker`, the bundles the controller's placement without that member
        gives a new owner) and asks again."""
        if all(w.node.index in group.members for w in out.workers) and any(
            m < 0 or m not in group.holding for m in group.members
        ):
            return False
        before = [m for m in group.members if m >= 0]
        readers = [
            w.node.index for o in (self.running.get(j) for j in group.readers) if o is not None for w in o.workers
        ]
        reading = list(dict.fromkeys((*readers, *(w.node.index for w in out.workers))))
        # every node is a candidate, as every agent's inventory is the controller's: a job node
        # with no room for a share joins without one, and a node with room owns in its place
        nodes = [self._candidate(n, key) for n in self.nodes]
        chosen = choose_placement(
            nodes, size_bytes=size, job_nodes=[str(m) for m in reading], before=[str(m) for m in before],
            no_share_before=[str(m) for m in before if m in group.shareless],
        )  # fmt: skip
        shareless = {int(n) for n in chosen.no_share}
        joining = [int(n) for n in chosen.members if int(n) not in group.members]
        owners_new = [m for m in joining if m not in shareless]
        old_owned, old_fill = dict(group.owned), dict(group.fill)
        # the old slots keep their places (HRW moves ~1/k); a member that joined without a
        # share holds no slot, so none of the owners' bundles are handed to it
        slots = [*(m for m in group.members if m not in group.shareless), *owners_new]
        owned = self._slot_owners(key, size, tuple(slots))
        kept = [m for m in before if m in group.holding and old_owned.get(m, 0.0) > 0]
        moved = sum(old_owned[m] * old_fill.get(m, 0.0) for m in kept) / (sum(old_owned[m] for m in kept) or 1.0)
        for m in owners_new:
            node = self.nodes[m]
            entry = node.cache.get(key)
            if entry is not None and not entry.stripe:  # whole, or being fetched whole: it stays whole
                entry.replica = True  # held by the controller's task while the version is read
                group.holding.add(m)
                group.fill[m] = entry.part if entry.ready else 0.0  # a copy still fetched feeds readers as it lands
                continue
            # room for the bundles it takes over from the old owners; the rest as they are read
            room = self._make_room(node, int(owned[m]), dry_run=True, replica=True)
            if not room or not self._make_room(node, int(owned[m] * moved), replica=True):
                shareless.add(m)  # no room after all: it reads through its window
                continue
            node.cache[key] = CacheEntry(
                key[0], key[1], int(owned[m]), self.now, ready=True, replica=True, stripe=True, part=moved
            )
            self.touch(node)
            group.holding.add(m)
            group.fill[m] = moved  # what the old owners held of its bundles: on their disks for now
            group.arriving[m] = moved
        if shareless & set(owners_new):  # a planned owner could not make room: the others own its part
            slots = [m for m in slots if m not in shareless]
            owned = self._slot_owners(key, size, tuple(slots))
        for m in before:  # the old owners keep the rest of their shares
            entry = self.nodes[m].cache.get(key)
            if entry is not None and entry.stripe:
                entry.size = int(owned.get(m, 0.0))
                self.touch(self.nodes[m])
        # a member that owned nothing leaves with its job, as the controller lets it go
        staying = {int(n) for n in chosen.members}
        group.shareless = {m for m in group.shareless if m in staying} | {m for m in joining if m in shareless}
        without = list(dict.fromkeys(m for m in (*group.members, *joining) if m in group.shareless))
        group.members = (*slots, *without)
        group.owned = {**owned, **dict.fromkeys(without, 0.0)}
        return True

    def _candidate(self, node: Node, key: tuple[str, int]) -> Candidate:
        """``node`` as the controller's group choice sees it (its published inventory)."""
        entry = node.cache.get(key)
        return Candidate(
            str(node.index),
            free_bytes=int(self.params.cache_bytes - node.used_bytes),
            held_bytes=entry.on_disk if entry is not None else 0,
            subnet=",".join(sorted(c.name for c in node.type.classes)),
            cache_bytes=int(self.params.cache_bytes),
            spare_bytes=self._room_bytes(node, key),
            holds_whole=entry is not None and not entry.stripe and entry.ready and entry.part >= 1.0,
            in_use_bytes=sum(e.on_disk for e in node.cache.values() if e.in_use),
        )

    def _room_bytes(self, node: Node, key: tuple[str, int]) -> int:
        raise NotImplementedError  # tools.sim.reads.Reads: what the node can give without a last copy

    def _pace(self, out: Outcome, size: float) -> float:
        raise NotImplementedError  # tools.sim.reads.Reads: a training read's most per second

    def _candidates(self, out: Outcome, exclude: set[int]) -> list[Node]:
        """Nodes for a group's slots: the job's own nodes, then its subnet's (the same class
        layout), then any other; the emptiest caches first."""
        job_nodes = [self.nodes[i] for i in dict.fromkeys(w.node.index for w in out.workers) if i not in exclude]
        layout = {c.name for c in out.workers[0].node.type.classes}
        taken = {n.index for n in job_nodes} | exclude
        others = sorted(
            (n for n in self.nodes if n.index not in taken),
            key=lambda n: ({c.name for c in n.type.classes} != layout, n.used_bytes, n.index),
        )
        return job_nodes + others

    def _taker(
        self, out: Outcome, group: stripe.Group, key: tuple[str, int], m: int, owned: int, *, refused: bool
    ) -> Node | None:
        """The node that owns slot ``m``'s bundles (``owned`` bytes) in its place: the one the
        controller's next pass adds, the product's
        :func:`dsagent.policy.holding.choose_placement` over every node with the group's other
        members as ``before`` (and without ``m`` where its agent has just ``refused`` the
        share, as the controller leaves such a node out of that pass), the first it adds
        that can make the room. Where it adds none, it shrinks the group, so that the
        members left own the slot's bundles by rendezvous hashing, which the slots cannot
        express: then the first node that can make the room (a hole's own node first), the
        job's nodes first, then its subnet's, the emptiest first (:meth:`_candidates`,
        :meth:`_first_room`)."""
        others = [x for x in group.members if x >= 0 and x != m]
        running = [o for o in (self.running.get(j) for j in group.readers) if o is not None]
        job = dict.fromkeys(w.node.index for o in (*running, out) for w in o.workers)
        chosen = choose_placement(
            [self._candidate(n, key) for n in self.nodes if not (refused and n.index == m)],
            size_bytes=self.datasets[key[0]].size, job_nodes=[str(i) for i in job],
            before=[str(x) for x in others], no_share_before=[str(x) for x in others if x in group.shareless],
        )  # fmt: skip
        added = (self.nodes[int(n)] for n in chosen.members if n not in chosen.no_share and int(n) not in others)
        taker = next((node for node in added if self._make_room(node, owned, dry_run=True)), None)
        mine = [self.nodes[m]] if m >= 0 and not refused else []  # a hole's chosen owner first, as at the forming
        return taker or self._first_room(mine + self._candidates(out, {*others, m}), owned)

    def _first_room(self, candidates: list[Node], size: int) -> Node | None:
        """The first candidate that can make room for ``size`` bytes without evicting the
        cluster's only copy of anything (versions other nodes hold ready), else the first
        that can make room at all: a share placed where it evicts a last copy or another
        group's share costs the store those bytes again when they are next read."""
        return next((n for n in candidates if self._make_room(n, size, dry_run=True, replica=True)), None) or next(
            (n for n in candidates if self._make_room(n, size, dry_run=True)), None
        )

    def _choose_members(self, out: Outcome, key: tuple[str, int], size: int) -> tuple[tuple[int, ...], set[int]]:
        """The group's owners in slot order, and the job's nodes that join without a share: the
        controller's choice, the product's :func:`dsagent.policy.holding.choose_placement` over
        every node as the controller chooses over every agent's inventory. As many members as
        :func:`dsagent.policy.holding.members_wanted` gives (the job's nodes, or as many as
        hold the version with the agent's headroom and per-member budget, plus the nodes
        holding it whole where the job's nodes read it through the window): the job's own
        nodes first, so each rank reads its own node's share, then the nodes holding it, then
        those with room, the job's subnet first. A job's node with no room for a share
        without evicting a last copy joins without one, and a node with room owns in its
        place. A chosen owner that then cannot make room for its share hands its slot to a
        node that can, else leaves a hole (:meth:`_stripe_group`): its agent refuses the
        share, and the controller chooses another node in its place at its next pass."""
        job_nodes = list(dict.fromkeys(w.node.index for w in out.workers))
        nodes = [self._candidate(n, key) for n in self.nodes]
        chosen = choose_placement(nodes, size_bytes=size, job_nodes=[str(i) for i in job_nodes])
        shareless = {int(n) for n in chosen.no_share}
        return tuple(int(n) for n in chosen.members if int(n) not in shareless), shareless

    def _shares(self, key: tuple[str, int], size: int, slots: int) -> dict[int, float]:
        """Bytes each of ``slots`` slots owns under rendezvous hashing of the version's bundles."""
        memo = self.owner_memo.get((key, (slots,)))
        if memo is None:
            memo = self.owner_memo[(key, (slots,))] = stripe.owners(key, size, tuple(range(slots)))
        return memo

    def _slot_owners(self, key: tuple[str, int], size: int, members: tuple[int, ...]) -> dict[int, float]:
        """Bytes each member owns: the rendezvous share of its slot."""
        shares = self._shares(key, size, len(members))
        return {m: shares[slot] for slot, m in enumerate(members)}
