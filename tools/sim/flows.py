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
  (``after``), no faster than that one.
"""

from __future__ import annotations

import math

from tools.sim.cluster import Fetch, Node, Outcome
from tools.sim.state import SimState
from tools.sim.workload import Job


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
        )
        self.fetches.append(fetch)
        if stream:
            assert waiter is not None
            self.outcomes[waiter[0].id].streams += 1
        if source == "local":
            return fetch
        if source == "peer":
            self.peer_bytes += size
            return fetch
        self.storage_bytes += size
        if key not in self.storage_seen:
            self.storage_seen.add(key)
            self.storage_first_bytes += size
        if not cached:
            self.storage_uncached_bytes += size
        self.storage_log.append((self.now, self.storage_bytes))
        return fetch

    def _next_fetch(self) -> tuple[float, dict[int, float]]:
        if not self.fetches:
            return math.inf, {}
        p = self.params
        net: dict[int, int] = {}
        store: dict[int, int] = {}
        disk: dict[int, int] = {}
        unpack: dict[int, int] = {}
        uploads: dict[int, int] = {}
        from_storage = 0
        for f in self.fetches:
            i = f.node.index
            if f.source == "local":
                disk[i] = disk.get(i, 0) + 1
            else:
                net[i] = net.get(i, 0) + 1
                if f.source == "storage":
                    store[i] = store.get(i, 0) + 1
                    from_storage += 1
                for s in f.sources:
                    uploads[s] = uploads.get(s, 0) + 1
            if f.unpack:
                unpack[i] = unpack.get(i, 0) + 1
        rates: dict[int, float] = {}
        for f in self.fetches:
            i = f.node.index
            if f.source == "local":
                r = p.disk_bw / disk[i]
            else:
                r = f.node.type.nic_bw / net[i]
                if f.source == "storage":
                    r = min(r, p.store_node_bw / store[i], p.storage_bw / from_storage)
                elif f.sources:
                    r = min(r, sum(p.node_serve_bw / uploads[s] for s in f.sources))
            if f.unpack:
                r = min(r, p.node_fetch_bw / unpack[i])
            if f.fuse:
                r *= p.fuse_factor
            rates[id(f)] = r
        for f in self.fetches:  # a source passes on bytes it is still fetching no faster than they come
            if f.after is not None and id(f.after) in rates:
                rates[id(f)] = min(rates[id(f)], rates[id(f.after)])
        soonest = min(f.remaining / rates[id(f)] for f in self.fetches)
        return self.now + soonest, rates

    def _progress(self, dt: float, rates: dict[int, float]) -> None:
        if dt <= 0 or not rates:
            return
        for f in self.fetches:
            f.remaining -= rates[id(f)] * dt

    def _finish_fetches(self) -> None:
        done = [f for f in self.fetches if f.remaining <= 1.0]
        self.fetches = [f for f in self.fetches if f.remaining > 1.0]
        for f in done:
            entry = f.node.cache.get(f.key)
            if f.cached and entry is not None and not f.stream:
                entry.ready = True
                if not entry.stripe:
                    f.node.labels.add(f.key[0])
                    self.ready_copies.setdefault(f.key, set()).add(f.node.index)
                    self._drop_old_versions(f.node, f.key)
                self.touch(f.node)
            if self.inflight.get((f.node.index, f.key)) is f:
                del self.inflight[(f.node.index, f.key)]
            for job, _ in f.waiters:
                if f.stream:
                    self._stream_done(self.outcomes[job.id])
                else:
                    self._data_ready(self.outcomes[job.id])

    # -- provided by tools.sim.reads ----------------------------------------------------

    def _drop_old_versions(self, node: Node, key: tuple[str, int]) -> None:
        raise NotImplementedError

    def _stream_done(self, out: Outcome) -> None:
        raise NotImplementedError

    def _data_ready(self, out: Outcome) -> None:
        raise NotImplementedError
