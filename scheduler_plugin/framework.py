"""Runs the scores and the filter over the candidate nodes and combines the results.

The one coordinator of a scheduling decision: it reads the pod once, fetches each
score's inputs from :class:`~scheduling.nodeinfo.NodeFacts`, calls the pure
functions in :mod:`scheduler_plugin.plugins`, resolves the job's RoCE class, or a
multi-worker job's class set (:mod:`gpu_topology.classsets`, docs/design.md#class-sets),
both kept in :class:`~scheduler_plugin.jobs.JobClasses`, and combines the normalized
scores with the configured weights. The HTTP app calls it; it knows nothing of HTTP.
"""

from __future__ import annotations

import logging
import operator
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import compress, repeat
from typing import Any, TypeVar

from gpu_topology import classvote, roce_subnets
from gpu_topology.classsets import NodeRoom, choose_class_set, parse_set, serves, set_key
from scheduler_plugin import filter as node_filter
from scheduler_plugin.columns import GroupedNodes, Selection
from scheduler_plugin.jobs import JobClasses
from scheduler_plugin.plugins import MAX, dataset, deadline, numa, stripe, subnet
from scheduler_plugin.settings import Settings, Weights
from scheduler_plugin.wire import Clamped, Pod
from scheduling.nodeinfo import NOTHING_HELD, NodeFacts
from scheduling.podspec import PodRequest, read_pod

log = logging.getLogger(__name__)


Cluster = Callable[[], Iterable[NodeFacts]]
GpuKey = tuple[int, "frozenset[int] | None", int]
K = TypeVar("K")
#: Memoized best-fit scores (GPU key, class, need) kept before the memo starts again.
FIT_MEMO_LIMIT = 100_000


SPLIT = "*"  # a job's cached "class set" when no set could hold it: placed across layouts


@dataclass(frozen=True)
class FilterOutcome:
    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    split_reason: str | None = None  # set when the pod's job is placed across class layouts


@dataclass(frozen=True)
class JobSet:
    """A multi-worker job's class set in force (docs/design.md#class-sets); ``classes``
    empty when the job is placed across layouts (``reason`` says why)."""

    classes: tuple[str, ...]
    required: bool = False
    reason: str | None = None


def combine(
    weights: Weights,
    dataset_scores: Sequence[int],
    roce_scores: Sequence[int],
    numa_scores: Sequence[int],
    time_scores: Sequence[int] | None = None,
) -> list[int]:
    """Weighted sum of the normalized scores, rounded and clamped to 0..10."""
    wd, wr, wn, wt = weights.dataset, weights.roce, weights.numa, weights.time
    times = time_scores if time_scores is not None else repeat(0)
    out = []
    for d, r, n, t in zip(dataset_scores, roce_scores, numa_scores, times):
        total = int(wd * d + wr * r + wn * n + wt * t + 0.5)
        out.append(MAX if total > MAX else 0 if total < 0 else total)
    return out


class Framework:
    """Scores and filters candidate nodes for one pod at a time.

    Safe to share between threads: the job memory is locked, and a race on the
    placement memo only computes a value twice.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        jobs: JobClasses | None = None,
        clock: Callable[[], float] = time.time,
        node: Callable[[str], NodeFacts | None] | None = None,
    ) -> None:
        self.settings = settings
        #: any known node's facts by name (the watch cache's), for stripe group members
        #: that are no candidates of a request; None: only the candidates are known
        self.node = node
        self.clock = clock  # wall-clock seconds, the clock of pod deadlines
        self.jobs = jobs if jobs is not None else JobClasses(settings.job_ttl_s)
        self.placements = numa.PlacementMemo()
        self._fits: dict[tuple[GpuKey, str | None, int], float] = {}
        self._subnets: dict[int, frozenset[str]] = {}  # topology id -> its RoCE subnets

    def read_pod(self, pod: Pod) -> PodRequest:
        """The pod's request, with a log line when its data cannot be read."""
        s = self.settings
        request = read_pod(
            pod, job_labels=s.job_labels, gpu_resource=s.gpu_resource, roce_prefix=s.roce_resource_prefix
        )
        for problem in (request.datasets_error, request.gpus_error, request.time_error):
            if problem:
                log.warning("pod %s: %s; scoring it as unparseable", request.key, problem)
        return request

    def prioritize(
        self, pod: PodRequest, nodes: Sequence[NodeFacts | None], cluster: Cluster, which: str = "combined"
    ) -> list[int]:
        """0..10 per node, for one score (``dataset``, ``roce``, ``numa``, ``time``) or ``combined``."""
        if which == "time":
            return self.time_scores(pod, nodes)
        if which == "dataset":
            return self.dataset_scores(pod, nodes)
        if which == "roce":
            return self.roce_scores(pod, nodes, cluster)
        if which == "numa":
            return self.numa_scores(pod, nodes)
        w = self.settings.weights
        if w.time:
            return combine(
                w,
                self.dataset_scores(pod, nodes),
                self.roce_scores(pod, nodes, cluster),
                self.numa_scores(pod, nodes),
                self.time_scores(pod, nodes),
            )
        datasets = self.dataset_scores(pod, nodes) if w.dataset else [0] * len(nodes)
        keys, table = self.gpu_table(pod, nodes, cluster) if w.roce or w.numa else ([None] * len(nodes), {})
        table[None] = (0, 0)
        # Most nodes hold none of the pod's datasets: their combined score depends on the
        # GPU key alone, so it is computed once per distinct key and looked up in C; only
        # the nodes with a dataset score are visited in Python (combine's rule, inlined).
        wd, wr, wn = w.dataset, w.roce, w.numa
        base = {key: combine(w, [0], [r], [n])[0] for key, (r, n) in table.items()}
        scores = list(map(base.__getitem__, keys))
        for index in compress(range(len(datasets)), datasets):
            roce_score, numa_score = table[keys[index]]
            total = int(wd * datasets[index] + wr * roce_score + wn * numa_score + 0.5)
            scores[index] = MAX if total > MAX else 0 if total < 0 else total
        return scores

    def dataset_scores(self, pod: PodRequest, nodes: Sequence[NodeFacts | None]) -> list[int]:
        if pod.datasets_error or not pod.datasets:
            return [0] * len(nodes)
        wants = pod.datasets
        if self._partly_held(pod, nodes):
            return self.share_scores(pod, nodes)
        sizes = None
        if self.settings.partial_datasets:
            sizes = dataset.requested_sizes(wants, (n.inventory for n in nodes if n is not None))
        affinity = dataset.affinity
        if sizes is None:
            # Without partial credit a node lacking any of the datasets scores 0: only the
            # nodes holding all of them (found in C, one membership pass per dataset over
            # the nodes left, without a Python loop over every candidate) are scored.
            held = list(map(getattr, nodes, repeat("held"), repeat(NOTHING_HELD)))
            left: Iterable[int] = range(len(nodes))
            for name in dict.fromkeys(want.name for want in wants):
                left = list(compress(left, map(operator.contains, map(held.__getitem__, left), repeat(name))))
            raws = [0.0] * len(nodes)
            for index in left:
                raws[index] = affinity(wants, nodes[index].inventory)  # type: ignore[union-attr]
            return dataset.normalize(raws)
        return dataset.normalize([affinity(wants, n.inventory, sizes=sizes) if n is not None else 0.0 for n in nodes])

    def _partly_held(self, pod: PodRequest, nodes: Sequence[NodeFacts | None]) -> bool:
        """Whether a candidate holds part of a wanted dataset (a share of a striped version,
        or a copy being fetched: :attr:`Inventory.partial`): then :meth:`share_scores`
        scores the datasets. One membership pass in C per wanted name."""
        nothing: frozenset[str] = frozenset()
        for name in dict.fromkeys(w.name for w in pod.datasets):
            inventories = map(getattr, nodes, repeat("inventory"), repeat(None))
            partial = map(getattr, inventories, repeat("partial"), repeat(nothing))  # None: its default
            if any(map(operator.contains, partial, repeat(name))):
                return True
        return False

    def share_scores(self, pod: PodRequest, nodes: Sequence[NodeFacts | None]) -> list[int]:
        """The dataset score with partial holdings (docs/design-striping.md#scheduler): held
        bytes against ``S / N`` for the pod's ``N``-worker job, copies being fetched at a
        discount, peer credit for stripe members with a group peer in their RoCE subnet
        (a candidate, or a member the inventory's group lists, found by :attr:`node`)."""
        inventories = [n.inventory if n is not None else None for n in nodes]
        names = [n.name if n is not None else "" for n in nodes]
        lookup = self.node

        def subnets_of(name: str) -> frozenset[str]:  # a listed group member, perhaps no candidate
            return self._roce_subnets(lookup(name) if lookup is not None else None)

        helds = stripe.helds(
            pod.datasets, inventories, lambda i: self._roce_subnets(nodes[i]), names=names, subnets_of=subnets_of
        )
        return stripe.scores(helds, pod.workers)

    def _roce_subnets(self, node: NodeFacts | None) -> frozenset[str]:
        """A node's RoCE subnets (its GPU-affine NICs that are up), memoized per topology."""
        if node is None or node.topology is None:
            return frozenset()
        found = self._subnets.get(node.topology_id)
        if found is None:
            found = self._subnets[node.topology_id] = roce_subnets(node.topology)
        return found

    def roce_scores(self, pod: PodRequest, nodes: Sequence[NodeFacts | None], cluster: Cluster) -> list[int]:
        keys, table = self.gpu_table(pod, nodes, cluster, numa_too=False)
        return [table[k][0] if k is not None else 0 for k in keys]

    def numa_scores(self, pod: PodRequest, nodes: Sequence[NodeFacts | None]) -> list[int]:
        keys, table = self.gpu_table(pod, nodes, lambda: (), roce_too=False)
        return [table[k][1] if k is not None else 0 for k in keys]

    def time_scores(self, pod: PodRequest, nodes: Sequence[NodeFacts | None]) -> list[int]:
        """The deadline time model's 0..10 per node; 0 for every node when the pod has no
        usable time annotations (or no GPUs). Computed once per distinct GPU key."""
        job = pod.time
        if job is None or pod.time_error or pod.gpus <= 0 or pod.gpus_error:
            return [0] * len(nodes)
        now = self.clock()
        table: dict[GpuKey | None, int] = {None: 0}
        out = []
        for node in nodes:
            key = node.gpu_key if node is not None else None
            found = table.get(key)
            if found is None and node is not None:
                found = table[key] = deadline.score(job, node.topology, node.free_gpus, pod.gpus, now=now)
            out.append(found or 0)
        return out

    def gpu_table(
        self,
        pod: PodRequest,
        nodes: Sequence[NodeFacts | None],
        cluster: Cluster,
        *,
        roce_too: bool = True,
        numa_too: bool = True,
    ) -> tuple[list[GpuKey | None], dict[GpuKey | None, tuple[int, int]]]:
        """Each node's GPU key, and the (normalized RoCE, NUMA) scores per distinct key.

        Both scores depend only on a node's topology and free GPUs, which a cluster has
        few distinct combinations of; computing them per key keeps 5,000-node requests
        cheap.
        """
        keys: list[GpuKey | None] = list(map(getattr, nodes, repeat("gpu_key"), repeat(None)))
        # One node per distinct key (any one: equal keys score alike), built in C.
        distinct: dict[GpuKey | None, NodeFacts] = dict(zip(keys, nodes))  # type: ignore[arg-type]
        distinct.pop(None, None)
        return keys, self.key_scores(pod, distinct, cluster, roce_too=roce_too, numa_too=numa_too)

    def key_scores(
        self,
        pod: PodRequest,
        distinct: Mapping[K, NodeFacts],
        cluster: Cluster,
        *,
        roce_too: bool = True,
        numa_too: bool = True,
    ) -> dict[K, tuple[int, int]]:
        """The (normalized RoCE, NUMA) scores of each distinct GPU key among the candidates,
        given one node per key; the normalization runs over these keys only."""
        need = pod.gpus
        if need <= 0 or pod.gpus_error:
            return dict.fromkeys(distinct, (0, 0))
        gpu_class = self.job_class(pod, cluster) if roce_too else None
        job_set = self.job_set(pod, cluster) if roce_too else None
        classes = job_set.classes if job_set is not None else ()
        placement = self.placements.score
        fits = [
            (_set_fit(node, classes, need) if classes else self._fit(node.gpu_key, node, gpu_class, need))
            if roce_too
            else 0.0
            for node in distinct.values()
        ]
        return {
            key: (fit, placement(node.topology, node.topology_id, node.free_gpus, need) if numa_too else 0)
            for (key, node), fit in zip(distinct.items(), subnet.normalize(fits))
        }

    def prioritize_selection(
        self, pod: PodRequest, selection: Selection, cluster: Cluster, which: str = "combined"
    ) -> list[int]:
        """:meth:`prioritize` for a names-only request read from the watch cache's columns
        (:mod:`scheduler_plugin.columns`): the same scores, without a Python loop over the
        candidates. The GPU scores are computed once per distinct GPU-key id and looked up
        in C; the dataset score is 10 on the nodes holding every wanted dataset ready and
        current (an intersection of the columns' sets) and 0 elsewhere. Partial credit and
        the time score read every node and take :meth:`prioritize`'s path."""
        w = self.settings.weights
        if (
            which == "time"
            or self.settings.partial_datasets
            or (which == "combined" and w.time)
            or (which in ("combined", "dataset") and selection.columns.partly_held(pod.datasets))
        ):
            return self.prioritize(pod, selection.facts(), cluster, which)
        ids = selection.ids
        if which == "dataset":
            return self._with_holders(pod, selection, [0] * len(ids), {0: 0}, {0: MAX})
        if which == "numa":
            table = self.key_scores(pod, selection.reps, lambda: (), roce_too=False)
        elif which == "roce":
            table = self.key_scores(pod, selection.reps, cluster, numa_too=False)
        elif w.roce or w.numa:
            table = self.key_scores(pod, selection.reps, cluster)
        else:
            table = dict.fromkeys(selection.reps, (0, 0))
        table[0] = (0, 0)  # unknown nodes
        if which == "roce":
            return Clamped(map({i: r for i, (r, _) in table.items()}.__getitem__, ids))
        if which == "numa":
            return Clamped(map({i: n for i, (_, n) in table.items()}.__getitem__, ids))
        # combined: the GPU part per id, looked up in C; then the dataset holders. combine's
        # rule, inlined: it runs once per distinct id, a few hundred times per request.
        wd, wr, wn = w.dataset, w.roce, w.numa
        base, with_data = {}, {}
        for i, (roce_score, numa_score) in table.items():
            total = int(wr * roce_score + wn * numa_score + 0.5)
            base[i] = MAX if total > MAX else 0 if total < 0 else total
            total = int(wd * MAX + wr * roce_score + wn * numa_score + 0.5)
            with_data[i] = MAX if total > MAX else 0 if total < 0 else total
        if not wd:
            return Clamped(map(base.__getitem__, ids))
        return self._with_holders(pod, selection, ids, base, with_data)

    def _with_holders(
        self,
        pod: PodRequest,
        selection: Selection,
        ids: list[int],
        base: dict[int, int],
        with_data: dict[int, int],
    ) -> Clamped:
        """Each candidate's score: ``with_data`` of its id on the nodes whose dataset score
        is 10 (without partial credit the raw scores are ``len(wants)`` or 0, so the best
        nodes are exactly those holding every wanted dataset ready and current), ``base``
        of its id elsewhere. ``ids`` maps each candidate to a key of both tables (all 0:
        one score for every node).

        One pass in C over the candidates: a holder's score is looked up by name, its
        default the id's. When the holders outnumber the candidates (a request naming a
        few of many holders), their positions are found by a pass over the names instead."""
        holders = self._holders(pod, selection)
        if not holders:
            return Clamped(map(base.__getitem__, ids))
        names = selection.names
        if len(holders) <= 2 * len(names):
            # Each holder's id as the columns give it now, all in C: a node whose GPU key
            # changed since the selection was read (a watch event in between) may have an
            # id this request did not score, and scores as a node of unknown GPUs then.
            order = list(holders)
            ids_now = map(selection.columns.gpu.ids.get, order, repeat(0))
            held = dict(zip(order, map(with_data.get, ids_now, repeat(with_data[0]))))
            return Clamped(map(held.get, names, map(base.__getitem__, ids)))
        scores = Clamped(map(base.__getitem__, ids))
        for index in compress(range(len(names)), map(holders.__contains__, names)):
            scores[index] = with_data[ids[index]]
        return scores

    def _holders(self, pod: PodRequest, selection: Selection) -> AbstractSet[str]:
        """The nodes whose dataset score is 10, from the columns' sets (may name nodes
        outside the request)."""
        if pod.datasets_error or not pod.datasets:
            return frozenset()
        columns = selection.columns
        return dataset.holding_all(pod.datasets, columns.ready, columns.ready_at)

    def _fit(self, key: GpuKey, node: NodeFacts, gpu_class: str | None, need: int) -> float:
        """:func:`_node_fit`, memoized: it reads only the node's classes (equal topology ids
        have equal classes), free set and free count, which is its GPU key."""
        memo = (key, gpu_class, need)
        found = self._fits.get(memo)
        if found is None:
            if len(self._fits) >= FIT_MEMO_LIMIT:
                self._fits.clear()
            found = self._fits[memo] = _node_fit(node, gpu_class, need)
        return found

    def job_class(self, pod: PodRequest, cluster: Cluster) -> str | None:
        """The RoCE class this pod's GPUs should come from, or None for "any class".

        A class the pod requests as a resource is a fact (the admission webhook wrote it
        from the job's Lease); otherwise the job's cached class; otherwise, for the first
        worker of a job, the cluster-wide choice, cached for the job's later workers. A
        pod in no job has no peers to share a subnet with: any class (its best fit on
        each node) will do.
        """
        if pod.gpu_class is not None:
            if pod.job is not None and pod.workers <= 1:
                self.jobs.set(pod.job, pod.gpu_class)
            return pod.gpu_class
        if pod.job is None:
            return None
        if pod.workers > 1:
            return None  # a multi-worker job's GPUs come from its class set (job_set)
        known = self.jobs.get(pod.job)
        if known is not None:
            return known
        choice = classvote.choose_class_grouped(_grouped_free_by_class(cluster()), pod.gpus)
        if choice is None:
            return None
        chosen = self.jobs.remember(pod.job, choice.name)
        log.info("job %s: RoCE class %s (votes %s)", pod.job, chosen, dict(choice.votes))
        return chosen

    def job_set(self, pod: PodRequest, cluster: Cluster) -> JobSet | None:
        """The class set of a multi-worker job's pod (docs/design.md#class-sets), or None
        for a pod in no job, a single-worker job or a pod without GPUs.

        The set the pod requests as resources is a fact (the webhook wrote it from the
        job's Lease). Otherwise the job's cached set; otherwise chosen now over the
        cluster's free GPUs (:func:`gpu_topology.classsets.choose_class_set`) and cached:
        a set that holds every worker now; else, for a job that *requires* one subnet
        set, the set it will wait for; else the job is placed across layouts (cached as
        such, so that its later workers are not held to a set its first ones broke).
        """
        if pod.job is None or pod.workers <= 1 or pod.gpus <= 0 or pod.gpus_error:
            return None
        required = pod.subnet_required
        if pod.gpu_classes:
            self.jobs.set(pod.job, set_key(pod.gpu_classes))
            return JobSet(pod.gpu_classes, required)
        known = self.jobs.get(pod.job)
        if known is not None:
            if known == SPLIT:
                return JobSet((), required, "no class set could hold every worker when the job started")
            return JobSet(parse_set(known), required)
        rooms = _grouped_rooms(cluster())
        choice = choose_class_set(rooms, pod.gpus, pod.workers)
        if choice is None:
            return None  # no node has classes that can serve the worker: plain GPU rules
        if choice.holds or required:
            chosen = self.jobs.remember(pod.job, choice.key)
            log.info("job %s: class set %s (%d nodes can take a worker now)", pod.job, chosen, choice.hosts)
            return JobSet((), required) if chosen == SPLIT else JobSet(parse_set(chosen), required)
        reason = (
            f"no class set can hold {pod.workers} workers of {pod.gpus} GPUs now "
            f"(best: {choice.key} on {choice.hosts} nodes); placed across class layouts"
        )
        self.jobs.remember(pod.job, SPLIT)
        log.warning("job %s: %s", pod.job, reason)
        return JobSet((), required, reason)

    def filter(
        self,
        pod: PodRequest,
        names: Sequence[str],
        nodes: Sequence[NodeFacts | None],
        cluster: Cluster | None = None,
        waiting: node_filter.Waiting = node_filter.NO_WAITING,
    ) -> FilterOutcome:
        """Hard facts only; unknown nodes pass. With ``cluster``, a multi-worker job's pod
        is also held to its class set (docs/design.md#class-sets). With ``waiting`` (the
        watch cache's), a node with every GPU free is kept whole for the waiting jobs ahead
        of the pod while another candidate is not kept (docs/design.md#whole-nodes): the
        pod then goes to a node kept for no one, or waits."""
        sizes = dataset.requested_sizes(pod.datasets, (n.inventory for n in nodes if n is not None))
        job_set = self.job_set(pod, cluster) if cluster is not None else None
        classes = job_set.classes if job_set is not None else ()
        asks: frozenset[node_filter.Ask] = frozenset()
        if self.settings.whole_nodes and waiting.jobs and pod.gpus > 0:
            asks = waiting.ahead_of(pod.job or pod.key, pod.queue)
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        held_out: dict[str, node_filter.Failure] = {}
        kept: dict[str, str] = {}  # passed, but kept whole for a job ahead
        others = 0  # candidates not kept whole, passed or not
        # a node is kept or not by its GPU facts and placement key alone: asked once per
        # distinct pair (a call per node tripled a 15,000-node filter's time while a wide job waited)
        kept_by_key: dict[tuple[object, int, bool, object], str | None] = {}
        least = min((ask.gpus for ask in asks), default=0)  # a node with fewer GPUs free is kept for no one
        for name, node in zip(names, nodes):
            whole = None
            if asks and node is not None and node.free_count >= least:
                key = (node.gpu_key, node.allocatable_gpus, node.gpu_facts_known, node.placement)
                if key in kept_by_key:
                    whole = kept_by_key[key]
                else:
                    found = node_filter.kept_whole(pod, node, asks)
                    whole = kept_by_key[key] = found.reason if found is not None else None
            others += whole is None
            failure = node_filter.check(pod, node, sizes)
            if failure is None and classes and node is not None:
                set_failure = node_filter.class_set(pod, node, classes)
                if set_failure is not None:
                    held_out[name] = set_failure
                    continue
            if failure is None:
                passed.append(name)
                if whole is not None:
                    kept[name] = whole
            elif failure.unresolvable:
                unresolvable[name] = failure.reason
            else:
                failed[name] = failure.reason
        keeping = bool(kept) and others > 0  # the pod is offered others: the whole ones are kept
        if keeping:
            passed = [name for name in passed if name not in kept]
            failed.update(kept)
        split_reason = job_set.reason if job_set is not None else None
        if (
            held_out
            and not passed
            and not keeping
            and job_set is not None
            and not job_set.required
            and pod.job is not None
        ):
            # preferred: the set's nodes are gone (taken since the set was chosen); the
            # job goes across layouts rather than wait, and says so
            split_reason = f"no node can serve class set {set_key(classes)} any more; placed across class layouts"
            self.jobs.set(pod.job, SPLIT)
            log.warning("job %s: %s", pod.job, split_reason)
            passed = list(held_out)
        else:
            for name, failure in held_out.items():
                (unresolvable if failure.unresolvable else failed)[name] = failure.reason
        return FilterOutcome(passed, failed, unresolvable, split_reason)


def _grouped_rooms(nodes: Iterable[NodeFacts]) -> list[NodeRoom]:
    """One :class:`NodeRoom` per distinct GPU key, weighted by its node count (given by the
    watch cache's columns when ``nodes`` is a :class:`GroupedNodes`)."""
    if isinstance(nodes, GroupedNodes):
        return [
            NodeRoom(n.class_sizes, n.free_by_class, count) for n, count in zip(nodes, nodes.counts) if n.class_sizes
        ]
    groups: dict[GpuKey, list[Any]] = {}
    for node in nodes:
        group = groups.get(node.gpu_key)
        if group is None:
            groups[node.gpu_key] = [node, 1]
        else:
            group[1] += 1
    return [
        NodeRoom(node.class_sizes, node.free_by_class, count) for node, count in groups.values() if node.class_sizes
    ]


def _grouped_free_by_class(nodes: Iterable[NodeFacts]) -> list[tuple[dict[str, int], int]]:
    """(free_by_class, node count) per distinct GPU key, for the cluster-wide vote.

    Counted in C (``Counter`` over the keys, one node per key from ``dict(zip(...))``):
    the first worker of every job asks for this over all nodes, 5,000 in a big cluster.
    The watch cache's columns count them as nodes change (a :class:`GroupedNodes`).
    """
    if isinstance(nodes, GroupedNodes):
        return [(n.free_by_class, count) for n, count in zip(nodes, nodes.counts) if n.free_by_class]
    listed = nodes if isinstance(nodes, list) else list(nodes)
    keys = list(map(_GPU_KEY, listed))
    counts = Counter(keys)
    groups = [(node.free_by_class, counts[key]) for key, node in dict(zip(keys, listed)).items()]
    return [(free, count) for free, count in groups if free]


_GPU_KEY = operator.attrgetter("gpu_key")


def _set_fit(node: NodeFacts, classes: tuple[str, ...], need: int) -> float:
    """Best-fit raw score of one node in a job's class set (0 when it cannot serve it)."""
    if not serves(node.free_by_class, classes, need):
        return 0.0
    return subnet.fit(sum(node.free_by_class[c] for c in classes), need)


def _node_fit(node: NodeFacts, gpu_class: str | None, need: int) -> float:
    """Best-fit raw score of one node: in the job's class when it has one, else in the
    node's best-fitting class, else over the whole node (pods larger than any class)."""
    by_class = node.free_by_class
    sizes = node.class_sizes
    if gpu_class is not None and by_class:
        if gpu_class not in by_class:
            return 0.0
        if need <= sizes[gpu_class]:
            return subnet.fit(by_class[gpu_class], need)
    elif by_class and need <= max(sizes.values()):
        return max(subnet.fit(free, need) for free in by_class.values())
    return subnet.fit(node.free_count, need)


__all__ = ["SPLIT", "Cluster", "GpuKey", "FilterOutcome", "Framework", "JobSet", "combine"]
