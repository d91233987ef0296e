"""Bytes moving at shared rates: every transfer's fair share of what it passes through.

Who calls it: :class:`tools.sim.engine.Simulation` (a mix-in over
:class:`tools.sim.state.SimState`). It owns the transfers (:class:`tools.sim.cluster.Fetch`):
their creation and byte accounting, the rates between two events, progress, and what a
finished transfer means (a ready copy, a filled stripe share, a training read done).

A transfer's rate is the least of the fair shares of what it passes through:

- ``storage``: the node's object-store rate (``store_node_bw``) among its store reads, and
  the store's aggregate (``storage_bw``) among all store reads;
- ``peer``: each serving node's upload (``node_serve_bw``) among the reads it serves,
  summed over its sources (none listed: spread over many nodes, limited by the reader);
- ``storage`` and ``peer`` alike: the reading node's NIC among its network transfers;
- ``local``: the node's disk (``disk_bw``) among its local reads;
- ours' fetches, also the node's unpack rate (``node_fetch_bw``) among its fetches; a
  FUSE read, times ``fuse_factor``; a read of bytes another transfer still brings in
  (``after``), no faster than that one;
- a training read, no faster than the job's steps take its bytes (``pace``): it cannot
  take a shared upload's bandwidth to run ahead of the GPUs.
"""

from __future__ import annotations

import math

from tools.sim.cluster import Fetch, Holes, Node, Outcome
from tools.sim.state import SimState
from tools.sim.workload import Job


def through_window(f: Fetch) -> bool:
    """A training read of another node's bundles: what a group's window serves."""
    return f.stream and f.source == "peer"


class Flows(SimState):
    def _new_fetch(
        self,
        node: Node,
        key: tuple[str, int],
        size: float,
        *,
        cached: bool,
        waiter: tuple[Job, int] | None,
        source: str = "storage",
        stream: bool = False,
        sources: tuple[int, ...] = (),
        unpack: bool = False,
        fuse: bool = False,
        after: Fetch | None = None,
        on_done: str = "",
        holes: Holes | None = None,
        unkept: float = 0.0,
        part: bool = False,
        pace: float = math.inf,
        counted: bool = True,
    ) -> Fetch:
        fetch = Fetch(
            node,
            key,
            float(size),
            cached,
            [waiter] if waiter is not None else [],
            source,
            stream,
            after,
            sources,
            unpack,
            fuse,
            on_done,
            part,
        )
        fetch.total = float(size)
        fetch.holes = dict(holes or {})
        fetch.pace = pace
        self.fetches.append(fetch)
        if after is not None:
            self.after_fetches.append(fetch)
        self._count(fetch, 1)
        if stream:
            assert waiter is not None
            self.outcomes[waiter[0].id].streams += 1
        if source == "local":
            return fetch
        if source == "peer":
            self.peer_bytes += size
            return fetch
        if not counted:  # store bytes another fetch counted already: its share of them, handed over
            return fetch
        self.storage_bytes += size
        lost = sum(b for b, _ in fetch.holes.values())
        self._count_cause(key, float(size), cached, lost, unkept)
        if key not in self.storage_seen:
            self.storage_seen.add(key)
            self.storage_first_bytes += size
        self.storage_uncached_bytes += size if not cached else min(size, lost + unkept)
        self.storage_log.append((self.now, self.storage_bytes))
        return fetch

    def _count_cause(self, key: tuple[str, int], size: float, cached: bool, lost: float, unkept: float) -> None:
        """Store bytes by cause (``STORE_CAUSES``): of a read kept in a cache, the bytes up to
        the version's size the cluster had not kept before are its first fill, the rest a
        fetch again; ``lost`` of the bytes are a lost stripe member's (a hole); a read not
        kept, and ``unkept`` of a kept one, is uncached."""
        by = self.storage_by_cause
        lost = min(size, lost)
        by["lost_member"] += lost
        size -= lost
        unkept = min(size, unkept)
        by["uncached"] += unkept
        size -= unkept
        if not cached:
            by["uncached"] += size
            return
        before = self.storage_kept.get(key, 0.0)
        self.storage_kept[key] = before + size
        first = min(size, max(0.0, self.datasets[key[0]].size - before))
        by["first_fill"] += first
        by["refetch"] += size - first

    def _count(self, f: Fetch, step: int) -> None:
        """Open (``step`` 1) or close (-1) a transfer in the counts the fair shares divide by,
        and mark whose share that changes: its node's transfers, the readers of the nodes it
        reads from, every store read when the store's count changes."""
        c = self.flow_counts
        i = f.node.index
        if f.source == "local":
            c.disk[i] = c.disk.get(i, 0) + step
        else:
            c.net[i] = c.net.get(i, 0) + step
            if f.source == "storage":
                c.store[i] = c.store.get(i, 0) + step
                c.from_storage += step
                c.storage_changed = True
            for s in f.sources:
                c.uploads[s] = c.uploads.get(s, 0) + step
                c.dirty_uploads.add(s)
        if f.unpack:
            c.unpack[i] = c.unpack.get(i, 0) + step
        c.dirty_nodes.add(i)

    def _share(self, f: Fetch) -> float:
        """The transfer's fair share of what it passes through (before ``after``)."""
        p, c = self.params, self.flow_counts
        i = f.node.index
        if f.source == "local":
            r = p.disk_bw / c.disk[i]
        else:
            r = f.node.type.nic_bw / c.net[i]
            if f.source == "storage":
                r = min(r, p.store_node_bw / c.store[i], p.storage_bw / c.from_storage)
            elif f.sources:
                r = min(r, sum(p.node_serve_bw / c.uploads[s] for s in f.sources))
        if f.unpack:
            r = min(r, p.node_fetch_bw / c.unpack[i])
        if f.fuse:
            r *= p.fuse_factor
        return min(r, f.pace)

    def _update_rates(self) -> None:
        """Recompute the shares the last opened and closed transfers changed; the rest stand
        (a share is a function of the open transfers only, so the rates are exactly those a
        full recount gives)."""
        c = self.flow_counts
        if not (c.dirty_nodes or c.dirty_uploads or c.storage_changed):
            return
        nodes, uploads, storage = c.dirty_nodes, c.dirty_uploads, c.storage_changed
        for f in self.fetches:
            if (
                f.node.index in nodes
                or (storage and f.source == "storage")
                or (uploads and f.sources and not uploads.isdisjoint(f.sources))
            ):
                f.base = f.rate = self._share(f)
        c.dirty_nodes, c.dirty_uploads, c.storage_changed = set(), set(), False
        for f in self.after_fetches:
            f.rate = f.base
        for f in self.after_fetches:  # a source passes on bytes it is still fetching no faster than they come
            if f.after is not None and f.after.open:
                f.rate = min(f.rate, f.after.rate)

    def _next_fetch(self) -> float:
        """When the next transfer finishes at the current rates (inf: none open)."""
        if not self.fetches:
            return math.inf
        self._update_rates()
        soonest = min([f.remaining / f.rate for f in self.fetches])
        return self.now + soonest

    def _progress(self, dt: float) -> None:
        if dt <= 0 or not self.fetches:
            return
        for f in self.fetches:
            f.remaining -= f.rate * dt

    def _finish_fetches(self) -> None:
        # done: the last byte, or so little left that finishing it would not move the clock
        # (a few bytes at a fast rate late in a run: ``now + dt == now`` in floating point)
        done = [
            f
            for f in self.fetches
            if f.remaining <= 1.0 or (f.rate > 0 and self.now + f.remaining / f.rate == self.now)
        ]
        if done:
            finished = {id(f) for f in done}
            self.fetches = [f for f in self.fetches if id(f) not in finished]
            for f in done:
                f.open = False
                self._count(f, -1)
            if self.after_fetches:
                self.after_fetches = [f for f in self.after_fetches if f.open]
        for f in done:
            entry = f.node.cache.get(f.key)
            if f.cached and entry is not None and not f.stream and not f.part:
                entry.ready = True
                if not entry.stripe and entry.part >= 1.0:  # a part of a version serves no peer's whole copy
                    f.node.labels.add(f.key[0])
                    self.ready_copies.setdefault(f.key, set()).add(f.node.index)
                    self._drop_old_versions(f.node, f.key)
                self.touch(f.node)
            if self.stripes and through_window(f):
                self._window_done(f, f.total)
            if self.inflight.get((f.node.index, f.key)) is f:
                del self.inflight[(f.node.index, f.key)]
                for out, index in self.whole_pending.pop((f.node.index, f.key), ()):
                    self._read_locally(out, index)
            for job, _ in f.waiters:
                if f.stream:
                    self._stream_done(self.outcomes[job.id])
                else:
                    self._data_ready(self.outcomes[job.id])

    def _window_done(self, f: Fetch, moved: float) -> None:
        """``moved`` bytes of ``f``, a read through a group's window, taken (the inventory's
        ``windowBytes`` of its node and version)."""
        key = (f.node.index, f.key)
        self.window_read[key] = self.window_read.get(key, 0.0) + moved

    # -- provided by tools.sim.reads ----------------------------------------------------

    def _drop_old_versions(self, node: Node, key: tuple[str, int]) -> None:
        raise NotImplementedError

    def _stream_done(self, out: Outcome) -> None:
        raise NotImplementedError

    def _read_locally(self, out: Outcome, index: int) -> None:
        raise NotImplementedError

    def _data_ready(self, out: Outcome) -> None:
        raise NotImplementedError
