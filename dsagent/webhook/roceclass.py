"""One RoCE class per job, enforced at admission (``docs/design.md#roce-class-choice``).

The admission webhook calls :meth:`GpuClassPolicy.decide` for every pod it sees. With
``DSAGENT_WEBHOOK_GPU_CLASSES=on`` (the dsagent device plugin serves every GPU node), a worker
asking for ``nvidia.com/gpu: K`` gets that request rewritten into the class resource
``<prefix>/gpu-roce<N>: K`` (prefix ``dsagent.io`` by default), which only the dsagent
device plugin advertises, so the kubelet gives it GPUs of that class and a VF of the
class's NIC:

1. The job is named by the pod's job labels (:mod:`dsplatform.jobs`).
2. The job's class lives in a ``coordination.k8s.io/v1`` Lease in the pod's namespace,
   named after the job (:func:`lease_name`), holder = the class. The first worker finds
   none, takes the cluster-wide vote (:mod:`gpu_topology.classvote`) over the classes
   and free GPUs the node agents publish on their Nodes, and creates the Lease; creation
   is the only decision point, so when two replicas race, the API server lets one create
   it (the other gets 409 and reads the winner's class). Every replica, and a restarted
   one, reads the same Lease.
3. The Lease is owned by the pod's controller (its Job, PyTorchJob, ...), so it goes with
   the job; a Lease whose owner is another object of that name (a job deleted and created
   again) is replaced. A Lease without owner (a bare pod labelled ``dsagent.io/job``)
   expires ``leaseDurationSeconds`` after its last worker; each later worker renews it.
4. A pod in no job gets the vote's class, without a Lease. A pod whose K GPUs no class
   can hold (a whole-node worker on a node cut into classes) keeps ``nvidia.com/gpu``.

**Multi-worker jobs** (``dsagent.io/workers: N`` > 1, ``docs/design.md#class-sets``) get a
class *set* instead: the Lease holds its key (``gpu-roce1+gpu-roce2``), chosen by
:func:`gpu_topology.classsets.choose_class_set` over the nodes' free GPUs per class, and
each worker's K GPUs are rewritten into the set's resource (``dsagent.io/gpu-roce1-2: K``),
which the device plugin serves with a rail-aligned share of every class of the set.
When no set can hold every worker now and the job does not require one
(``dsagent.io/subnet-placement: required``), the Lease holds ``*``: the job is placed
across class layouts, each worker gets its own class as a single-worker
pod would, and every worker carries the reason in ``dsagent.io/class-set-split`` and an
admission warning.

**With** ``DSAGENT_WEBHOOK_GPU_CLASSES=auto`` the dsagent device plugin serves only the
nodes labelled ``<DSAGENT_WEBHOOK_SERVED_LABEL>=true`` (``dsagent.io/device-plugin``, which
the node agent sets), and a class resource can only run there; so only those nodes count
in every vote, and a class is given only where it matters, between the nodes of one job:

- a pod of no job, or of a single-worker job, keeps its ``nvidia.com/gpu`` request (no
  patch, no warning, no Lease): whichever plugin serves its node gives it GPUs;
- a multi-worker job gets a class set as above when a set of the served nodes holds every
  worker now, or when it requires one (it then waits for room on served nodes);
- otherwise every worker keeps its ``nvidia.com/gpu`` request: the Lease holds ``*`` so that
  all workers decide alike, and each carries the reason in ``dsagent.io/class-set-split``
  (no warning). With no served node at all, or none that has published its free GPUs
  yet, nothing is decided: no Lease, no patch (a later worker decides for the job);
- a pod that already requests a class resource is handled as with ``on``.

A pod that already requests a class resource is held to its job's class too (the Lease
wins, with a warning). Nothing here ever blocks a pod: the webhook turns errors into
warnings. The pure part (:func:`gpu_request`, :func:`rewrite`) takes no I/O; the API
part takes an unmodified ``kubernetes`` ApiClient.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any

from cachetools import TTLCache

from dsagent.errors import Conflict, DsagentError
from dsagent.kube import nodestate
from dsagent.kube.lease import Leases, expiry, new_lease, next_transitions
from dsagent.kube.nodewatch import NodeWatch, current
from dsagent.webhook.gpurequest import (
    NETWORKS_ANNOTATION,
    GpuClassSettings,
    controller_of,
    gpu_request,
    lease_name,
    networks_value,
    requested_classes,
    rewrite,
    rewrite_set,
)
from dsagent.webhook.jsonpatch import JSONPatch, escape
from dsplatform import published
from dsplatform.jobs import job_key, subnet_required, workers_of
from dsplatform.kubetime import format_micro_time, parse_or_none
from dsplatform.wire.nodecache import TOPOLOGY_MAX_BYTES

log = logging.getLogger("dsagent.webhook")

TOPOLOGY_ANNOTATION = published.TOPOLOGY
FREE_GPUS_ANNOTATION = published.FREE_GPUS
SPLIT_ANNOTATION = "dsagent.io/class-set-split"  # why a multi-worker job spans class layouts
SPLIT = "*"  # a Lease holder: the job is placed across class layouts
JOB_ANNOTATION = "dsagent.io/job"
LEASE_LABEL = "dsagent.io/job-class"


@dataclass(frozen=True)
class GpuDecision:
    """The GPU part of the webhook's answer."""

    patch: JSONPatch = field(default_factory=list)
    warnings: tuple[str, ...] = ()
    gpu_class: str | None = None


# -- the API part ------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterView:
    """What the nodes publish: per node, class sizes and (when known) free GPUs per class."""

    sizes: tuple[Mapping[str, int], ...]
    free: tuple[Mapping[str, int], ...]
    rooms: tuple[Any, ...] = ()  # gpu_topology.classsets.NodeRoom per node whose free GPUs are known

    def vote_set(self, need: int, workers: int) -> Any:
        """The class set for ``workers`` workers of ``need`` GPUs
        (:func:`gpu_topology.classsets.choose_class_set`), or None."""
        from gpu_topology.classsets import choose_class_set

        return choose_class_set(self.rooms, need, workers)

    def largest(self, gpu_class: str) -> int:
        return max((s.get(gpu_class, 0) for s in self.sizes), default=0)

    def vote(self, need: int) -> str | None:
        """The vote's class for a worker of ``need`` GPUs; when no node has room now, the
        class most nodes could hold it in; None when no class anywhere can."""
        from gpu_topology.classvote import choose_class, choose_class_by_size

        choice = choose_class(self.free, need) or choose_class_by_size(self.sizes, need)
        return choice.name if choice is not None else None


def read_cluster(nodes: Sequence[Mapping[str, Any]], served_label: str | None = None) -> ClusterView:
    """The classes of schedulable nodes whose agent publishes a readable topology; with
    ``served_label``, only of the nodes labelled ``<served_label>=true`` (``auto`` mode)."""
    from gpu_topology.classsets import NodeRoom
    from gpu_topology.classvote import classes_with_free, parse_free_gpus

    sizes: list[Mapping[str, int]] = []
    free: list[Mapping[str, int]] = []
    rooms: list[NodeRoom] = []
    for node in nodes:
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        if served_label is not None and ((node.get("metadata") or {}).get("labels") or {}).get(served_label) != "true":
            continue  # the dsagent device plugin does not serve it: no class resource runs there
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        text = annotations.get(TOPOLOGY_ANNOTATION)
        if not isinstance(text, str):
            continue
        classes = _published_classes(text) if len(text) <= TOPOLOGY_MAX_BYTES else None
        if classes is None:
            continue  # foreign data: the node does not count
        found = classes_with_free(classes, parse_free_gpus(annotations.get(FREE_GPUS_ANNOTATION)))
        if found.sizes:
            sizes.append(found.sizes)
            if found.free is not None:
                free.append(found.free)
                rooms.append(NodeRoom(found.sizes, found.free))
    return ClusterView(tuple(sizes), tuple(free), tuple(rooms))


@lru_cache(maxsize=256)
def _published_classes(text: str) -> tuple[Any, ...] | None:
    """The classes a published topology document holds (validated), None when it is not one:
    read once per distinct document, as nodes of one kind publish the same one (reading and
    validating it at every node took about 2 ms a node, 33 s a view at 15,000 nodes)."""
    from gpu_topology import TopologyError
    from gpu_topology.contract import classes_from_dict

    try:
        return classes_from_dict(json.loads(text))
    except (ValueError, TopologyError, TypeError, AttributeError):
        return None


class KubeGpuClasses:
    """Nodes and job Leases (:attr:`leases`) through an unmodified ``kubernetes`` ApiClient."""

    def __init__(
        self,
        api_client: Any,
        settings: GpuClassSettings,
        *,
        request_timeout: float = 2.0,
        clock: Callable[[], float] = time.time,
        watch: NodeWatch | None = None,
        reads: Callable[[str], object] | None = None,
    ) -> None:
        from kubernetes import client

        self.settings = settings
        self._watch = watch  # the Nodes kept by list+watch, else listed (:func:`dsagent.kube.nodewatch.current`)
        self._reads = reads  # told where each view read them (the webhook's node_reads metric)
        # Raw JSON both ways (_preload_content=False, dict bodies): the wire format as is.
        self._core: Any = client.CoreV1Api(api_client)
        self._custom: Any = client.CustomObjectsApi(api_client)
        self.leases = Leases(api_client, request_timeout=request_timeout)
        self._timeout = request_timeout
        self._clock = clock
        self._views: TTLCache[str, ClusterView] = TTLCache(maxsize=1, ttl=settings.nodes_ttl_s, timer=clock)
        self.cluster_reads = 0  # views read from the nodes so far
        self._lock = threading.Lock()

    # nodes
    def cluster(self) -> ClusterView:
        """The published classes of every node, read at most every ``nodes_ttl_s``."""
        with self._lock:
            view = self._views.get("nodes")
        if view is not None:
            return view
        list_all = partial(nodestate.list_nodes, self._core, self._custom, timeout=self._timeout, resource_version="0")
        nodes = current(self._watch, list_all, self._reads)
        view = read_cluster(nodes, self.settings.served_label if self.settings.auto else None)
        with self._lock:
            self._views["nodes"] = view
            self.cluster_reads += 1
        return view

    def now(self) -> float:
        return self._clock()


class GpuClassPolicy:
    """Assigns each GPU pod its job's class (see the module docstring)."""

    def __init__(self, settings: GpuClassSettings, kube: KubeGpuClasses) -> None:
        self.settings = settings
        self.kube = kube

    def decide(
        self, pod: Mapping[str, Any], namespace: str, *, annotations_exist: bool, dry_run: bool = False
    ) -> GpuDecision:
        """The patch giving ``pod`` its job's class. ``dry_run`` (an AdmissionReview with
        ``dryRun: true``) reads the job's Lease but never writes one. With ``networks``
        set, a pod given a class (set) also gets the Multus network attachment of every
        class in it (``docs/design.md#vf-networks``)."""
        decision = self._decide(pod, namespace, annotations_exist=annotations_exist, dry_run=dry_run)
        if not self.settings.networks or decision.gpu_class is None or not decision.patch:
            return decision
        from gpu_topology.classsets import parse_set

        classes = parse_set(decision.gpu_class)
        value = networks_value(
            (pod.get("metadata") or {}).get("annotations"), [self.settings.network(c) for c in classes]
        )
        op = {"op": "add", "path": "/metadata/annotations/" + escape(NETWORKS_ANNOTATION), "value": value}
        # the rewrite's last op adds the class annotation (creating the map when absent)
        return GpuDecision([*decision.patch, op], decision.warnings, decision.gpu_class)

    def _decide(
        self, pod: Mapping[str, Any], namespace: str, *, annotations_exist: bool, dry_run: bool = False
    ) -> GpuDecision:
        s = self.settings
        need = gpu_request(pod, s)
        asked = requested_classes(pod, s.prefix)
        if need <= 0 and not asked:
            return GpuDecision()
        meta = pod.get("metadata") or {}
        job = job_key(namespace, meta.get("labels"), s.job_labels)
        own = max(sorted(asked), key=lambda c: asked[c]) if asked else None
        warnings: list[str] = []
        annotations = meta.get("annotations") or {}
        workers = workers_of(annotations)
        # auto: a plain request keeps it unless the job's workers share a class set
        plain = s.auto and not asked
        if plain and (job is None or workers <= 1):
            return GpuDecision()
        if job is not None and workers > 1 and need > 0:
            decided = self._decide_set(
                pod, namespace, job, need, workers, annotations_exist, dry_run=dry_run, plain=plain
            )
            if decided is not None:
                return decided
        if plain:  # no served node to decide over: the job keeps its request
            return GpuDecision()
        if job is None or workers > 1:
            gpu_class = own or self.kube.cluster().vote(need)
        else:
            gpu_class = self.job_class(pod, namespace, job, need, own, dry_run=dry_run)
            if own is not None and gpu_class is not None and own != gpu_class:
                warnings.append(
                    f"dsplatform: job {job} uses GPU class {gpu_class}; the pod's {s.resource(own)} "
                    f"request was changed to {s.resource(gpu_class)}"
                )
        if gpu_class is None:
            return GpuDecision(
                warnings=(
                    f"dsplatform: no node publishes a GPU class that can hold {need} GPUs; "
                    f"the pod keeps its {s.gpu_resource} request",
                )
            )
        if own is None and self.kube.cluster().largest(gpu_class) < need:
            return GpuDecision(
                warnings=(
                    f"dsplatform: {need} GPUs exceed every node's class {gpu_class}; "
                    f"the pod keeps its {s.gpu_resource} request (a whole-node worker)",
                ),
                gpu_class=gpu_class,
            )
        patch = rewrite(pod, s, gpu_class, annotations_exist=annotations_exist)
        if patch:
            log.info(
                "pod %s/%s (job %s): %d GPUs of class %s",
                namespace,
                meta.get("name") or meta.get("generateName"),
                job,
                need,
                gpu_class,
            )
        return GpuDecision(patch, tuple(warnings), gpu_class)

    def _decide_set(
        self,
        pod: Mapping[str, Any],
        namespace: str,
        job: str,
        need: int,
        workers: int,
        annotations_exist: bool,
        *,
        dry_run: bool,
        plain: bool = False,
    ) -> GpuDecision | None:
        """A multi-worker job's worker: its share of the job's class set; None when no node
        can serve any set. When the job is placed across class layouts, the pod gets a class
        of its own with the reason; with ``plain`` (``auto``, a plain request) it keeps its
        request with the reason, and None comes when no served node is there to decide over."""
        s = self.settings
        reasons: list[str] = []
        served = f"the nodes the dsagent device plugin serves ({s.served_label}=true)"

        def choose() -> str | None:
            view = self.kube.cluster()
            if plain and not view.rooms:
                # no served node, or none has published its free GPUs yet (its agent just
                # started): nothing to decide, and the job is not recorded as split for good
                return None
            choice = view.vote_set(need, workers)
            if choice is None:
                if not plain:
                    return None
                reasons.append(f"none of {served} can take a worker of {need} GPUs")
                return SPLIT
            if choice.holds or subnet_required((pod.get("metadata") or {}).get("annotations")):
                return str(choice.key)
            where = f" on {served}" if plain else ""
            reasons.append(
                f"no class set{where} can hold {workers} workers of {need} GPUs now (best: {choice.key}, "
                f"{choice.hosts} nodes can take a worker)"
            )
            return SPLIT

        holder = self._job_lease(pod, namespace, job, choose, dry_run=dry_run)
        if holder is None:
            return None
        if holder == SPLIT and plain:
            reason = (
                reasons[0]
                if reasons
                else f"no class set on {served} could hold every worker when the job's first worker came"
            )
            reason = f"the job keeps its {s.gpu_resource} request: {reason}"
            log.info("pod %s/%s (job %s): %s", namespace, (pod.get("metadata") or {}).get("name"), job, reason)
            return GpuDecision(_annotate(SPLIT_ANNOTATION, reason, annotations_exist=annotations_exist))
        if holder == SPLIT:
            reason = reasons[0] if reasons else "no class set could hold every worker when the job's first worker came"
            message = f"dsplatform: job {job} is placed across class layouts (subnets): {reason}"
            log.warning("pod %s/%s: %s", namespace, (pod.get("metadata") or {}).get("name"), message)
            own = self.kube.cluster().vote(need)
            if own is None or self.kube.cluster().largest(own) < need:
                return GpuDecision(_annotate(SPLIT_ANNOTATION, reason, annotations_exist=annotations_exist), (message,))
            patch = rewrite_set(
                pod, s, (own,), annotations_exist=annotations_exist, extra_annotations={SPLIT_ANNOTATION: reason}
            )
            return GpuDecision(patch, (message,), own)
        from gpu_topology.classsets import parse_set

        classes = parse_set(holder)
        if not classes:
            return None
        patch = rewrite_set(pod, s, classes, annotations_exist=annotations_exist)
        log.info(
            "pod %s/%s (job %s): %d GPUs in class set %s",
            namespace,
            (pod.get("metadata") or {}).get("name"),
            job,
            need,
            holder,
        )
        return GpuDecision(patch, (), holder)

    def job_class(
        self, pod: Mapping[str, Any], namespace: str, job: str, need: int, own: str | None, *, dry_run: bool = False
    ) -> str | None:
        """The job's class from its Lease, creating the Lease (by vote) for its first worker."""
        return self._job_lease(pod, namespace, job, lambda: own or self.kube.cluster().vote(need), dry_run=dry_run)

    def _job_lease(
        self,
        pod: Mapping[str, Any],
        namespace: str,
        job: str,
        choose: Callable[[], str | None],
        *,
        dry_run: bool = False,
    ) -> str | None:
        """The job's Lease holder (its class, or class set), creating the Lease with
        ``choose()`` for its first worker; the API server's create is the one decision."""
        name = lease_name(job)
        owner = controller_of(pod)
        for _ in range(3):
            lease = self.kube.leases.read(namespace, name)
            if lease is not None and not self._stale(lease, owner):
                if not dry_run:
                    self._renew(namespace, lease, owner)
                holder = (lease.get("spec") or {}).get("holderIdentity")
                if isinstance(holder, str) and holder:
                    return holder
            gpu_class = choose()
            if gpu_class is None or dry_run:
                return gpu_class
            body = self._lease(name, job, gpu_class, owner, previous=lease)
            try:
                if lease is None:
                    created = self.kube.leases.create(namespace, body)
                else:
                    created = self.kube.leases.replace(namespace, body)
            except Conflict:
                continue  # another replica decided first: read its class
            log.info("job %s: GPU class %s (Lease %s/%s)", job, gpu_class, namespace, name)
            return str((created.get("spec") or {}).get("holderIdentity") or gpu_class)
        raise DsagentError(f"the Lease {namespace}/{name} of job {job} keeps changing")

    def _lease(
        self, name: str, job: str, gpu_class: str, owner: dict[str, Any] | None, *, previous: dict[str, Any] | None
    ) -> dict[str, Any]:
        now = format_micro_time(self.kube.now())
        meta: dict[str, Any] = {
            "name": name,
            "labels": {LEASE_LABEL: "true", "app.kubernetes.io/managed-by": "dsplatform"},
            "annotations": {JOB_ANNOTATION: job},
        }
        if owner is not None:
            meta["ownerReferences"] = [owner]
        spec: dict[str, Any] = {
            "holderIdentity": gpu_class,
            "leaseDurationSeconds": self.settings.lease_ttl_s,
            "acquireTime": now,
            "renewTime": now,
        }
        if previous is not None:
            meta["resourceVersion"] = (previous.get("metadata") or {}).get("resourceVersion")
            spec["leaseTransitions"] = next_transitions(previous.get("spec"))
        return new_lease(meta, spec)

    def _stale(self, lease: Mapping[str, Any], owner: Mapping[str, Any] | None) -> bool:
        """A Lease of an earlier job of the same name: another owner, or expired without one."""
        owners = (lease.get("metadata") or {}).get("ownerReferences") or []
        if owners:
            return owner is not None and all(o.get("uid") != owner["uid"] for o in owners if isinstance(o, dict))
        until = expiry(lease.get("spec") or {})
        return until is not None and until < self.kube.now()

    def _renew(self, namespace: str, lease: dict[str, Any], owner: Mapping[str, Any] | None) -> None:
        """Extend an ownerless Lease past half its life (best effort: a conflict means a peer did)."""
        if (lease.get("metadata") or {}).get("ownerReferences"):
            return
        spec = lease.get("spec") or {}
        renewed = parse_or_none(spec.get("renewTime"))
        duration = spec.get("leaseDurationSeconds")
        if renewed is None or not isinstance(duration, int) or self.kube.now() - renewed < duration / 2:
            return
        body = json.loads(json.dumps(lease))
        body["spec"]["renewTime"] = format_micro_time(self.kube.now())
        try:
            self.kube.leases.replace(namespace, body)
        except DsagentError as exc:
            log.info("renewing Lease %s/%s: %s", namespace, body["metadata"].get("name"), exc)


def _annotate(key: str, value: str, *, annotations_exist: bool) -> JSONPatch:
    """The patch adding one annotation (creating the map when the pod has none)."""
    if annotations_exist:
        return [{"op": "add", "path": "/metadata/annotations/" + escape(key), "value": value}]
    return [{"op": "add", "path": "/metadata/annotations", "value": {key: value}}]


__all__ = [
    "ClusterView",
    "GpuClassPolicy",
    "GpuDecision",
    "KubeGpuClasses",
    "SPLIT",
    "SPLIT_ANNOTATION",
    "read_cluster",
]
