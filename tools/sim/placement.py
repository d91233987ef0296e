"""Where jobs go: the scheduling round, each policy's node choice, GPUs, gangs and time-model plans.

Who calls it: :class:`tools.sim.engine.Simulation` (a mix-in over
:class:`tools.sim.state.SimState`). It owns no policy: the filter and scores are
:class:`scheduler_plugin.framework.Framework`'s (the baselines': :mod:`tools.sim.baselines`),
the GPUs ``gpu_topology.best_gpu_set``'s (inside the job's RoCE class or class set), the
plans and queue order :mod:`scheduling.timemodel`'s, the moves
:func:`scheduling.migration.plan_migrations`'.

Decision: the answers of the product's GPU choice are memoised per (node type, free GPUs,
count, class) and, within one time-model decision, per (node, count): the same answers
as asking each time, at a fraction of the calls (the deadline variants ask thousands of
times per round).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from gpu_topology import best_gpu_set
from gpu_topology.classsets import NodeRoom, gpus_in_set, single_set_exists, single_set_placement
from scheduler_plugin.filter import Waiting
from scheduling.migration import RunningJob, plan_migrations
from scheduling.podspec import DatasetWant, PodRequest
from scheduling.timemodel import (
    DEFAULT_BANDWIDTHS,
    Decision,
    Plan,
    decide,
    intra_node_bandwidth,
    queue_order,
    t_run,
    wait_for_one_node,
)
from tools.sim import baselines, fluid, policies
from tools.sim.cluster import Node, Worker
from tools.sim.policies import BASELINES
from tools.sim.state import SimState
from tools.sim.workload import Job


class Placement(SimState):
    # -- scheduling -----------------------------------------------------------------------

    def schedule(self) -> None:
        if not self.waiting:
            return
        window = self.waiting[: self.params.queue_scan]
        if self.variant is not None:
            if self.variant.migrate:
                self._migrate()
            self._schedule_by_plans(window)
            return
        for job in window:
            if self._place_gang(job):
                self.waiting.remove(job)
                self.unschedulable.discard(job.id)
            else:
                self.unschedulable.add(job.id)

    def _can_fit(self, per_worker: int, workers: int) -> bool:
        return (
            sum(1 for n in self.nodes if len(n.free) >= per_worker) >= 1
            and sum(len(n.free) // per_worker for n in self.nodes) >= workers
        )

    def _pod(self, job: Job, gpus: int, workers: int | None = None) -> PodRequest:
        """The pod the extender sees: ``workers`` is the job's worker count (its shape's)."""
        profile = job.profile if workers is None else replace(job.profile, workers=workers)
        digest = None if self.policy in fluid.POLICIES else f"{self.version_of(job, self.now):032x}"
        return PodRequest(
            key=f"sim/job-{job.id}",
            namespace="sim",
            datasets=(DatasetWant(job.dataset, digest),),
            gpus=gpus,
            job=f"sim/job-{job.id}",
            time=profile,
            workers=workers if workers is not None else job.workers,
            queue=(0, job.arrival),
        )

    def _choose(self, job: Job, gpus: int, exclude: set[int], workers: int) -> Node | None:
        """The node kube-scheduler would bind one worker to under this policy."""
        candidates = [n for n in self.nodes if len(n.free) >= gpus and n.index not in exclude]
        if not candidates:
            return None
        facts = [self.facts(n) for n in candidates]
        if self.policy in ("default", "juicefs"):  # no data affinity: kube-scheduler's spreading
            scores = baselines.least_allocated(facts)
        elif self.policy == "juicefs+pack":  # no data affinity, GPU pods packed as ours are
            scores = baselines.most_allocated(facts, gpus)
        elif self.policy in fluid.POLICIES:
            scores = baselines.fluid(self._pod(job, gpus), facts, packed=self.policy in fluid.PACKED)
        else:
            pod = self._pod(job, gpus, workers)
            outcome = self.framework.filter(
                pod, [f.name for f in facts], facts, lambda: (self.facts(n) for n in self.nodes), self._waiting()
            )
            passed = set(outcome.passed)
            keep = [i for i, f in enumerate(facts) if f.name in passed]
            candidates = [candidates[i] for i in keep]
            facts = [facts[i] for i in keep]
            if not candidates:
                return None
            extender = self.framework.prioritize(pod, facts, lambda: (self.facts(n) for n in self.nodes))
            # our scheduler adds its NodeResourcesFit (MostAllocated on GPUs, the chart's
            # scheduler.resourceScoring) to the extender's score, as kube-scheduler does
            scores = baselines.with_extender(extender, baselines.most_allocated(facts, gpus))
        best = max(scores)
        top = [n for n, s in zip(candidates, scores) if s == best]
        return top[self.rng.randrange(len(top))]

    def _waiting(self) -> Waiting:
        """The pods kube-scheduler could not place, as the extender's watch cache sees them."""
        tried = self.unschedulable
        return Waiting.of(
            (f"sim/job-{j.id}", j.gpus_per_worker, (0, j.arrival))
            for j in self.waiting
            if j.workers > 1 and j.id in tried
        )

    def _gpus_for(self, job: Job, node: Node, count: int, workers: int = 1) -> tuple[int, ...] | None:
        free = sorted(node.free)
        if len(free) < count:
            return None
        if self.policy in BASELINES:
            return self._nvidia_choice(node, count)
        pod = self._pod(job, count, workers)
        cluster = lambda: (self.facts(n) for n in self.nodes)  # noqa: E731
        job_set = self.framework.job_set(pod, cluster)
        if job_set is not None and job_set.classes:
            classes = {c.name: c.gpus for c in node.type.classes}
            in_set = gpus_in_set(node.type.topology, classes, free, job_set.classes, count)
            if in_set is not None:
                return in_set
        return self._gpus_in_class(node, count, self.framework.job_class(pod, cluster))

    def _gpus_in_class(self, node: Node, count: int, gpu_class: str | None) -> tuple[int, ...] | None:
        """The product's best GPU set of ``count`` on the node, inside ``gpu_class`` where it
        has that many free (memoised: a pure function of the node type, free GPUs, count)."""
        free = node.free
        pool = frozenset(free)
        if gpu_class is not None:
            in_class = frozenset(g for g in free if node.type.class_of.get(g) == gpu_class)
            if len(in_class) >= count:
                pool = in_class
        key = (node.type.id, pool, count)
        if key not in self.gpu_memo:
            best = best_gpu_set(node.type.topology, pool, count)
            self.gpu_memo[key] = tuple(best.gpus) if best else None
        return self.gpu_memo[key]

    def _nvidia_choice(self, node: Node, count: int) -> tuple[int, ...]:
        """What NVIDIA's device plugin gives a pod of the baselines: its GetPreferredAllocation
        is go-gpuallocator's best-effort policy over the node's free GPUs, which
        ``gpu_topology.best_gpu_set`` reproduces (tests/gpu_topology/test_go_gpuallocator.py);
        when it names no set, the kubelet's own pick, the lowest free indices."""
        key = (node.type.id, frozenset(node.free), -count)  # negative: apart from our policies' keys
        if key not in self.gpu_memo:
            best = best_gpu_set(node.type.topology, node.free, count)
            self.gpu_memo[key] = tuple(best.gpus) if best else tuple(sorted(node.free)[:count])
        return self.gpu_memo[key] or ()

    def _place_gang(self, job: Job, shape: Sequence[tuple[Node | None, int]] | None = None) -> bool:
        """Bind every worker or none (gang scheduling). ``shape``: a plan's (node, GPUs)."""
        if shape is None:
            if not self._can_fit(job.gpus_per_worker, job.workers):
                return False
            shape = [(None, job.gpus_per_worker)] * job.workers
        placed: list[Worker] = []
        used: set[int] = set()
        rooms = self._rooms() if len(shape) > 1 else []
        in_set = self._single_set(job, shape, rooms)
        for slot, (fixed, count) in enumerate(shape):
            node = fixed if fixed is not None else self._choose(job, count, used, len(shape))
            gpus = self._gpus_for(job, node, count, len(shape)) if node is not None else None
            if in_set is not None:
                node, gpus = in_set[slot]
            if node is None or gpus is None:
                for w in placed:
                    w.node.free.update(w.gpus)
                    self.touch(w.node)
                self.framework.jobs.forget(f"sim/job-{job.id}")  # nothing placed: choose afresh
                return False
            node.free.difference_update(gpus)
            self.touch(node)
            used.add(node.index)
            classes = frozenset(node.type.class_of.get(g, "none") for g in gpus)
            placed.append(Worker(node, gpus, classes))
        self._start(job, placed)
        out = self.outcomes[job.id]
        if out.spans_subnets:
            out.avoidable = single_set_exists(rooms, [count for _, count in shape])
        return True

    def _single_set(
        self, job: Job, shape: Sequence[tuple[Node | None, int]], rooms: list[NodeRoom]
    ) -> list[tuple[Node, tuple[int, ...] | None]] | None:
        """For our policies, a time-model plan across fixed nodes whose workers would not
        share one class set is moved to nodes that hold it in one set, when some do
        (docs/design.md#class-sets); None: keep the plan's nodes. The deadline variants run
        with the project's rules get it too (the webhook chooses a job's set whatever plans
        it); the design as written (``deadline-design``) does not."""
        if self.policy in BASELINES or len(shape) < 2 or any(n is None for n, _ in shape):
            return None
        if self.variant is not None and self.variant.as_written:
            return None
        sets = set()
        for fixed, count in shape:
            assert fixed is not None
            gpus = self._gpus_for(job, fixed, count, len(shape)) or ()
            sets.add(frozenset(fixed.type.class_of.get(g, "none") for g in gpus))
        if len(sets) == 1:
            return None
        found = single_set_placement(rooms, [count for _, count in shape])
        if found is None:
            return None
        class_set, where = found
        out = []
        for (_, count), index in zip(shape, where):
            node = self.nodes[index]
            classes = {c.name: c.gpus for c in node.type.classes}
            out.append((node, gpus_in_set(node.type.topology, classes, node.free, class_set, count)))
        return out

    def _rooms(self) -> list[NodeRoom]:
        """Every node's class sizes and free GPUs per class, as the class-set rules read them."""
        return [
            NodeRoom(
                {c.name: len(c.gpus) for c in n.type.classes}, {c.name: len(c.gpus & n.free) for c in n.type.classes}
            )
            for n in self.nodes
        ]

    def _schedule_by_plans(self, window: list[Job]) -> None:
        """Steps 3-6 of the deadline design: a plan per waiting job, the queue in the
        design's order, one job placed per round, until nothing more fits."""
        while window:
            free = {n.name: len(n.free) for n in self.nodes if n.free}
            if not free:
                return
            by_name = {n.name: n for n in self.nodes}
            shared: dict[tuple[str, int, str], tuple[float, frozenset[str]]] = {}  # free GPUs hold in a round
            decisions = {job.id: self._decide(job, free, by_name, shared) for job in window}
            order = queue_order((str(j), d) for j, d in decisions.items())
            placed = False
            releases: dict[int, list[tuple[float, int]]] | None = None  # nothing runs or ends in a round
            for ident in order:
                job = next(j for j in window if str(j.id) == ident)
                d = decisions[job.id]
                if d.plan is None:
                    continue
                as_written = self.variant is not None and self.variant.as_written
                if d.plan.cross_node and not as_written:
                    if releases is None:
                        releases = self._releases()
                    if self._better_to_wait(job, d.plan, releases):
                        continue
                if d.plan.cross_node:
                    shape: list[tuple[Node | None, int]] = [(by_name[n], c) for n, c in d.plan.allocation]
                else:
                    shape = [(None, d.plan.n_gpu)]  # the extender picks the node
                if self._place_gang(job, shape):
                    self.outcomes[job.id].plan_gpus = d.plan.n_gpu
                    window.remove(job)
                    self.waiting.remove(job)
                    placed = True
                    break
            if not placed:
                return

    def _releases(self) -> dict[int, list[tuple[float, int]]]:
        """Per node, (expected end, GPUs) of the running jobs' workers on it, soonest first."""
        releases: dict[int, list[tuple[float, int]]] = {}
        for out in self.running.values():
            for w in out.workers:
                releases.setdefault(w.node.index, []).append((out.end, len(w.gpus)))
        for ends in releases.values():
            ends.sort()
        return releases

    def _better_to_wait(self, job: Job, plan: Plan, releases: dict[int, list[tuple[float, int]]] | None = None) -> bool:
        """The time model's wait rule: the earliest time a node will hold the plan's GPUs,
        from the running jobs' expected ends (``releases``: :meth:`_releases`, read once
        per round), and the run time on that node."""
        n = plan.n_gpu
        best_t, best_run = math.inf, math.inf
        if releases is None:
            releases = self._releases()
        for node in self.nodes:
            if len(node.type.topology.gpus) < n:
                continue
            free, t = len(node.free), self.now
            for end, count in releases.get(node.index, ()):
                if free >= n:
                    break
                free, t = free + count, end
            if free >= n and t < best_t:
                ideal = self.ideal_bw.get((node.type.id, n))
                if ideal is None:
                    best = best_gpu_set(node.type.topology, node.type.topology.gpu_indices, n)
                    ideal = self.ideal_bw[(node.type.id, n)] = intra_node_bandwidth(
                        node.type.topology, best.gpus if best else ()
                    )
                best_t, best_run = t, t_run(job.profile, n, ideal)
        return wait_for_one_node(plan, best_run, best_t)

    def _node_bandwidth(self, node: Node, gpus: tuple[int, ...]) -> float:
        """``intra_node_bandwidth`` of a GPU set, memoised per node type (a pure function of both)."""
        key = (node.type.id, gpus)
        bw = self.bw_memo.get(key)
        if bw is None:
            bw = self.bw_memo[key] = intra_node_bandwidth(node.type.topology, gpus)
        return bw

    def _share_of_node(self, node: Node, gpus: tuple[int, ...]) -> tuple[float, frozenset[str]]:
        """A plan's GPUs on one node: their bandwidth and RoCE classes."""
        classes = frozenset(node.type.class_of.get(g, "none") for g in gpus)
        return self._node_bandwidth(node, gpus), classes

    def _decide(
        self,
        job: Job,
        free: dict[str, int],
        by_name: dict[str, Node],
        shared: dict[tuple[str, int, str], tuple[float, frozenset[str]]] | None = None,
    ) -> Decision:
        # the GPUs a plan's share of a node would get: nothing changes while one job is decided,
        # so each (node, count) is asked of the product once (the same answers, far fewer calls)
        # and its bandwidth and classes once too
        chosen: dict[tuple[str, int], tuple[float, frozenset[str]]] = {}
        job_key = f"sim/job-{job.id}"
        single = self.policy not in BASELINES  # _gpus_for's class path for one worker (workers=1)

        # the job's class once known: nothing else sets it while the job is decided, and a
        # repeated read at the same clock changes nothing in the cache (one read stands for all)
        known_class: list[str] = []

        def node_of(name: str, count: int) -> tuple[float, frozenset[str]]:
            got = chosen.get((name, count))
            if got is None:
                node = by_name[name]
                known = None
                if single and chosen:
                    if not known_class:
                        found = self.framework.jobs.get(job_key)
                        if found is not None:
                            known_class.append(found)
                    known = known_class[0] if known_class else None
                if known is not None and len(node.free) >= count:
                    # a function of the node's free GPUs, the count and the class alone: the
                    # same for every job of the round that has this class
                    got = shared.get((name, count, known)) if shared is not None else None
                    if got is None:
                        gpus = self._gpus_in_class(node, count, known) or ()  # the class _gpus_for would read
                        got = self._share_of_node(node, gpus)
                        if shared is not None:
                            shared[(name, count, known)] = got
                else:
                    got = self._share_of_node(node, self._gpus_for(job, node, count) or ())
                chosen[(name, count)] = got
            return got

        def bandwidth_of(allocation: tuple[tuple[str, int], ...]) -> float:
            per_node = [node_of(name, count) for name, count in allocation]
            weakest = min(bw for bw, _ in per_node)
            if len(per_node) == 1:
                return weakest
            factor = self.params.cross_subnet_factor if len({c for _, c in per_node}) > 1 else 1.0
            return min(weakest, DEFAULT_BANDWIDTHS.network * factor)

        d = self.datasets[job.dataset]
        key = (d.name, d.version_at(self.now))

        def start_of(allocation: tuple[tuple[str, int], ...]) -> float:
            """When the dataset is on every node of the plan: at once where a ready copy is,
            else after a fetch sharing storage with the fetches running and the plan's own."""
            missing = sum(1 for n, _ in allocation if not (e := by_name[n].cache.get(key)) or not e.ready)
            if not missing:
                return self.now
            rate = min(self.params.node_fetch_bw, self.params.storage_bw / (len(self.fetches) + missing))
            return self.now + d.size / rate

        # best-fit ties go to nodes holding the data (the extender's dataset affinity)
        pod = self._pod(job, 1)
        holders = [n for n in self.nodes if n.free and job.dataset in self.facts(n).held]
        affinity = self.framework.dataset_scores(pod, [self.facts(n) for n in holders])
        prefer = {n.name: float(a) for n, a in zip(holders, affinity)}
        variant = self.variant
        over_free = variant is not None and variant.over_free
        # plans over the free GPUs (design, step 3.2) or capped at the GPUs asked for (ours+time)
        most = min(policies.MAX_PLAN_GPUS, sum(free.values())) if over_free else job.gpus
        sizes = [job.gpus]
        # the webhook's applied plans: a one-worker job on one node; a multi-worker job as asked
        one_pod = variant is not None and variant.one_pod_only
        if one_pod and job.workers > 1:
            most = job.gpus
        elif self.params.plan_sizes == "pow2" or over_free:
            sizes += [2**k for k in range(10) if 2**k <= most]
        return decide(
            job.profile,
            free,
            bandwidth_of,
            now=self.now,
            max_gpus=max(most, job.gpus),
            sizes=sizes,
            start_of=start_of,
            prefer=prefer,
            formula=variant.formula if variant is not None else "slack-per-gpu",
            as_written=variant is not None and variant.as_written,
            cross_node=not (one_pod and job.workers == 1),
        )

    def _migrate(self) -> None:
        """Step 5 before the round: the product's migration policy over the running jobs that
        checkpoint; a move evicts the job's workers and re-places them, its cost modelled as
        checkpoint + restart + the data re-fetch on a node without the data."""
        running = []
        for out in self.running.values():
            if not out.migratable or out.end <= self.now or math.isnan(out.first_step):
                continue
            began = out.first_step + out.delay
            span = out.end - began
            done = (self.now - began) / span if span > 0 else 1.0
            left = out.remaining * (1.0 - min(1.0, max(0.0, done)))
            if left <= 0.01:
                continue
            allocation = tuple((w.node.name, len(w.gpus)) for w in out.workers)
            running.append(RunningJob(str(out.job.id), out.job.profile, allocation, out.end, left, True))
        if not running:
            return
        by_name = {n.name: n for n in self.nodes}
        free = {n.name: len(n.free) for n in self.nodes if n.free}
        by_id = {str(o.job.id): o for o in self.running.values()}

        def bandwidth_of(moving: RunningJob, allocation: tuple[tuple[str, int], ...]) -> float:
            name, count = allocation[0]
            gpus = self._gpus_for(by_id[moving.name].job, by_name[name], count) or ()
            return intra_node_bandwidth(by_name[name].type.topology, gpus)

        def cost_of(job: RunningJob, target: tuple[tuple[str, int], ...]) -> float:
            d = self.datasets[by_id[job.name].job.dataset]
            key = (d.name, d.version_at(by_id[job.name].start))
            entry = by_name[target[0][0]].cache.get(key)
            refetch = 0 if entry is not None and entry.ready else d.size
            rate = min(self.params.node_fetch_bw, self.params.storage_bw / (len(self.fetches) + 1))
            return policies.move_cost(refetch, rate)

        for move in plan_migrations(running, free, bandwidth_of, cost_of, now=self.now):
            out = by_id[move.job]
            left = next(j.remaining for j in running if j.name == move.job)
            self._release_workers(out)
            self.running.pop(out.job.id, None)
            node = by_name[move.target[0][0]]
            gpus = self._gpus_for(out.job, node, move.target[0][1])
            if gpus is None:  # cannot happen: the policy counted this node's free GPUs
                continue
            node.free.difference_update(gpus)
            self.touch(node)
            classes = frozenset(node.type.class_of.get(g, "none") for g in gpus)
            out.workers = [Worker(node, gpus, classes)]
            out.pending = 1
            out.remaining = left
            out.delay = policies.CHECKPOINT_S + policies.RESTART_S
            out.migrations += 1
            out.spans_subnets = False
            out.end = out.compute_end = math.nan  # the old end event is stale
            self._request_data(out.job, out.workers[0], 0)
