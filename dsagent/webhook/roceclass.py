"""One RoCE class per job, enforced at admission (``docs/design.md#roce-class-choice``).

The admission webhook calls :meth:`GpuClassPolicy.decide` for every pod it sees. A worker
asking for ``nvidia.com/gpu: K`` gets that request rewritten into the class resource
``<prefix>/gpu-roce<N>: K`` (prefix ``dsagent.io`` by default), which only the dsagent
device plugin advertises, so the kubelet gives it GPUs of that class and a VF of the
class's NIC:

1. The job is named by the pod's job labels (:mod:`dsplatform.jobs`).
2. The job's class lives in a ``coordination.k8s.io/v1`` Lease in the pod's namespace,
   named after the job (:func:`lease_name`), holder = the class. The first worker finds
   none, takes the cluster-wide vote (:mod:`gpu_topology.placement`) over the classes
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

A pod that already requests a class resource is held to its job's class too (the Lease
wins, with a warning). Nothing here ever blocks a pod: the webhook turns errors into
warnings. The pure part (:func:`gpu_request`, :func:`rewrite`) takes no I/O; the API
part takes an unmodified ``kubernetes`` ApiClient.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from cachetools import TTLCache
from pydantic import AliasChoices, BeforeValidator, Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from dsagent.cluster.apiclient import translated
from dsagent.cluster.lease import Leases, expiry, new_lease, next_transitions
from dsagent.errors import Conflict, DsagentError, SettingsError
from dsagent.webhook.jsonpatch import JSONPatch, escape
from dsplatform import published
from dsplatform.gpus import GPU_RESOURCE, RESOURCE_PREFIX, GpuResources, QuantityError, parse_quantity, pod_gpus
from dsplatform.jobs import DEFAULT_JOB_LABELS, job_key, subnet_required, workers_of
from dsplatform.kubetime import format_micro_time, parse_or_none
from dsplatform.names import is_dns_label, is_resource_name, resource_prefix_problem
from dsplatform.settings import EnvSettings, Flag, InvalidSettings, not_from_env
from dsplatform.units import parse_duration

log = logging.getLogger("dsagent.webhook")

TOPOLOGY_ANNOTATION = published.TOPOLOGY
FREE_GPUS_ANNOTATION = published.FREE_GPUS
CLASS_ANNOTATION = "dsagent.io/gpu-class"
SPLIT_ANNOTATION = "dsagent.io/class-set-split"  # why a multi-worker job spans class layouts
SPLIT = "*"  # a Lease holder: the job is placed across class layouts
JOB_ANNOTATION = "dsagent.io/job"
LEASE_LABEL = "dsagent.io/job-class"
DEFAULT_PREFIX = RESOURCE_PREFIX
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"  # Multus: the pod's extra networks
WEBHOOK_PREFIX = "DSAGENT_WEBHOOK_"  # the webhook's variables (and its GPU classes')


def _job_labels(value: Any) -> tuple[str, ...]:
    """A comma list (``team/job, job-name``); none named: the platform's default labels."""
    items = value.split(",") if isinstance(value, str) else list(value)
    labels = tuple(str(x).strip() for x in items if str(x).strip())
    return labels or DEFAULT_JOB_LABELS


def _lease_ttl(value: Any) -> Any:
    """``DSAGENT_WEBHOOK_JOB_TTL`` is a duration (``2h``), in whole seconds, at least one."""
    return max(1, int(parse_duration(value))) if isinstance(value, str) else value


class GpuClassSettings(EnvSettings):
    """``DSAGENT_WEBHOOK_*`` settings of the GPU class policy (the chart's ``gpuClasses`` values)."""

    model_config = SettingsConfigDict(env_prefix=WEBHOOK_PREFIX, env_ignore_empty=True)

    enabled: Flag = Field(False, validation_alias=AliasChoices("enabled", WEBHOOK_PREFIX + "GPU_CLASSES"))
    gpu_resource: str = GPU_RESOURCE
    # class resources are <prefix>/<class name>, e.g. dsagent.io/gpu-roce1
    prefix: str = Field(DEFAULT_PREFIX, validation_alias=AliasChoices("prefix", WEBHOOK_PREFIX + "CLASS_PREFIX"))
    job_labels: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_job_labels)] = DEFAULT_JOB_LABELS
    # an ownerless job Lease lives this long after its last worker
    lease_ttl_s: Annotated[int, BeforeValidator(_lease_ttl)] = Field(
        3600, validation_alias=AliasChoices("lease_ttl_s", WEBHOOK_PREFIX + "JOB_TTL")
    )
    nodes_ttl_s: float = not_from_env(5.0)  # how long a node listing serves votes
    #: Multus: the NetworkAttachmentDefinition of a class, ``[<namespace>/]<name>`` with
    #: ``{class}`` in it (``dsplatform/dsp-{class}``); empty: no network annotation
    networks: Annotated[str, BeforeValidator(lambda v: v.strip() if isinstance(v, str) else v)] = ""

    @field_validator("gpu_resource")
    @classmethod
    def _gpu_resource(cls, value: str) -> str:
        if not is_resource_name(value):
            raise ValueError(f"GPU resource {value!r} is not an extended resource name (e.g. nvidia.com/gpu)")
        return value

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        problem = resource_prefix_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("lease_ttl_s")
    @classmethod
    def _lease_ttl_s(cls, value: int) -> int:
        if value < 1:
            raise ValueError("the job Lease TTL must be at least one second")
        return value

    @field_validator("networks")
    @classmethod
    def _networks(cls, value: str) -> str:
        if value and ("{class}" not in value or not _is_network(value.replace("{class}", "gpu-roce1"))):
            raise ValueError(
                f"network attachment template {value!r} is not [<namespace>/]<name> with {{class}} in it"
                " (e.g. dsplatform/dsp-{class})"
            )
        return value

    def network(self, gpu_class: str) -> str:
        """The NetworkAttachmentDefinition (``[ns/]name``) of one class."""
        return self.networks.replace("{class}", gpu_class)

    def resource(self, gpu_class: str) -> str:
        return f"{self.prefix}/{gpu_class}"

    @property
    def names(self) -> GpuResources:
        """The GPU resource names these settings configure (what counts as a GPU)."""
        return GpuResources(gpu=self.gpu_resource, prefix=self.prefix)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GpuClassSettings:
        """The settings from ``DSAGENT_WEBHOOK_*``; one :class:`SettingsError` lists every bad one."""
        try:
            return cls.read(environ)
        except InvalidSettings as exc:
            raise SettingsError(exc.message) from None


@dataclass(frozen=True)
class GpuDecision:
    """The GPU part of the webhook's answer."""

    patch: JSONPatch = field(default_factory=list)
    warnings: tuple[str, ...] = ()
    gpu_class: str | None = None


# -- the pure part -----------------------------------------------------------------------


def _is_network(value: str) -> bool:
    """A NetworkAttachmentDefinition reference, ``[<namespace>/]<name>``, each a DNS-1123 label."""
    namespace, _, name = value.rpartition("/")
    return (not namespace or is_dns_label(namespace)) and is_dns_label(name)


def _containers(spec: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    found: list[tuple[str, Mapping[str, Any]]] = []
    for key in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(key) or []):
            if isinstance(container, dict):
                found.append((f"/spec/{key}/{index}", container))
    return found


def _quantity(value: Any) -> int:
    """A container's quantity of a GPU resource by the platform's one rule
    (:func:`dsplatform.gpus.parse_quantity`: ``"4"``, ``4``, ``"4000m"``); unreadable: none,
    as :func:`gpu_request` counts it."""
    try:
        return parse_quantity(value)
    except QuantityError:
        return 0


def gpu_request(pod: Mapping[str, Any], settings: GpuClassSettings) -> int:
    """GPUs the pod asks for, plain or of a class, by the platform's one rule
    (:func:`dsplatform.gpus.pod_gpus`); a quantity it cannot read counts none."""
    try:
        return pod_gpus(pod.get("spec"), settings.names)
    except ValueError:
        return 0


def requested_classes(pod: Mapping[str, Any], prefix: str) -> dict[str, int]:
    """Class resources (``<prefix>/<class>``) the pod already asks for, by class name."""
    found: dict[str, int] = {}
    for _, container in _containers(pod.get("spec") or {}):
        resources = container.get("resources") or {}
        for kind in ("limits", "requests"):
            for name, value in (resources.get(kind) or {}).items():
                if isinstance(name, str) and name.startswith(prefix + "/"):
                    cls = name.split("/", 1)[1]
                    found[cls] = max(found.get(cls, 0), _quantity(value))
    return found


def rewrite(
    pod: Mapping[str, Any], settings: GpuClassSettings, gpu_class: str, *, annotations_exist: bool
) -> JSONPatch:
    """Replace every container's GPU (or other class) resource by ``gpu_class``'s, keeping
    the quantity, and annotate the pod with its class."""
    return rewrite_set(pod, settings, (gpu_class,), annotations_exist=annotations_exist)


def rewrite_set(
    pod: Mapping[str, Any],
    settings: GpuClassSettings,
    classes: Sequence[str],
    *,
    annotations_exist: bool,
    extra_annotations: Mapping[str, str] | None = None,
) -> JSONPatch:
    """Replace every container's GPU (or other class) resource by the resource of the class
    set ``classes``, keeping the quantity, and annotate the pod with its class (set).

    One class: ``<prefix>/gpu-roce1``. Several: the set's own resource, ``<prefix>/gpu-roce1-2``
    (``docs/design.md#class-sets``), which the node's device plugin serves with the worker's
    rail-aligned share of every class of the set, in one Allocate: two class resources in
    one container would get two answers whose ``NVIDIA_VISIBLE_DEVICES`` collide."""
    from gpu_topology.classsets import resource_name, set_key

    target = settings.resource(resource_name(classes))
    ops: JSONPatch = []
    for path, container in _containers(pod.get("spec") or {}):
        resources = container.get("resources") or {}
        for kind in ("limits", "requests"):
            entries = resources.get(kind) or {}
            moved = [
                name
                for name in entries
                if name == settings.gpu_resource or (name.startswith(settings.prefix + "/") and name != target)
            ]
            amount = max((_quantity(entries[name]) for name in moved), default=0)
            for name in moved:
                ops.append({"op": "remove", "path": f"{path}/resources/{kind}/{escape(name)}"})
            if moved and amount > 0:
                value = max(amount, _quantity(entries.get(target, 0)))
                op = "replace" if target in entries else "add"
                ops.append({"op": op, "path": f"{path}/resources/{kind}/{escape(target)}", "value": str(value)})
    if not ops:
        return ops
    notes = {CLASS_ANNOTATION: set_key(classes), **(extra_annotations or {})}
    if annotations_exist:
        for key, text in notes.items():
            ops.append({"op": "add", "path": "/metadata/annotations/" + escape(key), "value": text})
    else:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": notes})
    return ops


def networks_value(annotations: Mapping[str, Any] | None, attachments: Sequence[str]) -> str:
    """The Multus ``k8s.v1.cni.cncf.io/networks`` value: the pod's own entries (comma list or
    JSON list, kept as written) followed by ``attachments`` not already named."""
    existing = (annotations or {}).get(NETWORKS_ANNOTATION)
    text = existing.strip() if isinstance(existing, str) else ""
    if text.startswith("["):
        try:
            entries = json.loads(text)
        except ValueError:
            entries = None
        if isinstance(entries, list):
            named = {
                f"{e.get('namespace')}/{e.get('name')}" if e.get("namespace") else e.get("name")
                for e in entries
                if isinstance(e, dict)
            }
            for item in attachments:
                if item not in named:
                    ns, _, name = item.rpartition("/")
                    entries.append({"name": name, **({"namespace": ns} if ns else {})})
            return json.dumps(entries, separators=(",", ":"))
    own = [part.strip() for part in text.split(",") if part.strip()]
    return ",".join(own + [a for a in attachments if a not in own])


def lease_name(job: str) -> str:
    """A DNS-1123 name for the Lease of job ``namespace/name``: readable, and unique by hash."""
    name = job.split("/", 1)[-1].lower()
    readable = re.sub(r"[^a-z0-9-]+", "-", name).strip("-")[:36].strip("-") or "job"
    return f"dsplatform-job-{readable}-{hashlib.sha256(job.encode()).hexdigest()[:10]}"


def controller_of(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pod's controlling owner reference (its Job, PyTorchJob, ...), if any."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller") and ref.get("uid") and ref.get("name"):
            return {
                "apiVersion": ref.get("apiVersion"),
                "kind": ref.get("kind"),
                "name": ref["name"],
                "uid": ref["uid"],
                "controller": False,
                "blockOwnerDeletion": False,
            }
    return None


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
        from gpu_topology.placement import choose_class, choose_class_by_size

        choice = choose_class(self.free, need) or choose_class_by_size(self.sizes, need)
        return choice.name if choice is not None else None


def read_cluster(nodes: Sequence[Mapping[str, Any]]) -> ClusterView:
    """The classes of schedulable nodes whose agent publishes a readable topology."""
    from gpu_topology import TopologyError
    from gpu_topology.classsets import NodeRoom
    from gpu_topology.placement import node_classes, parse_free_gpus

    sizes: list[Mapping[str, int]] = []
    free: list[Mapping[str, int]] = []
    rooms: list[NodeRoom] = []
    for node in nodes:
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        text = annotations.get(TOPOLOGY_ANNOTATION)
        if not isinstance(text, str):
            continue
        try:
            found = node_classes(json.loads(text), parse_free_gpus(annotations.get(FREE_GPUS_ANNOTATION)))
        except (ValueError, TopologyError):
            continue  # foreign data: the node does not count
        if found.sizes:
            sizes.append(found.sizes)
            if found.free is not None:
                free.append(found.free)
                rooms.append(NodeRoom(found.sizes, found.free))
    return ClusterView(tuple(sizes), tuple(free), tuple(rooms))


class KubeGpuClasses:
    """Nodes and job Leases (:attr:`leases`) through an unmodified ``kubernetes`` ApiClient."""

    def __init__(
        self,
        api_client: Any,
        settings: GpuClassSettings,
        *,
        request_timeout: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        from kubernetes import client

        self.settings = settings
        # Raw JSON both ways (_preload_content=False, dict bodies): the wire format as is.
        self._core: Any = client.CoreV1Api(api_client)
        self.leases = Leases(api_client, request_timeout=request_timeout)
        self._timeout = request_timeout
        self._clock = clock
        self._views: TTLCache[str, ClusterView] = TTLCache(maxsize=1, ttl=settings.nodes_ttl_s, timer=clock)
        self._lock = threading.Lock()

    # nodes
    def cluster(self) -> ClusterView:
        """The published classes of every node, listed at most every ``nodes_ttl_s``."""
        with self._lock:
            view = self._views.get("nodes")
        if view is not None:
            return view
        with translated("list nodes"):
            raw = self._core.list_node(resource_version="0", _preload_content=False, _request_timeout=self._timeout)
        view = read_cluster(json.loads(raw.data).get("items") or [])
        with self._lock:
            self._views["nodes"] = view
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
        if job is not None and workers > 1 and need > 0:
            decided = self._decide_set(pod, namespace, job, need, workers, annotations_exist, dry_run=dry_run)
            if decided is not None:
                return decided
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
    ) -> GpuDecision | None:
        """A multi-worker job's worker: its share of the job's class set; None when the job
        is placed across class layouts (the caller then gives the pod a class of its own,
        and :meth:`decide` adds the reason) or no node can serve any set."""
        s = self.settings
        reasons: list[str] = []

        def choose() -> str | None:
            choice = self.kube.cluster().vote_set(need, workers)
            if choice is None:
                return None
            if choice.holds or subnet_required((pod.get("metadata") or {}).get("annotations")):
                return str(choice.key)
            reasons.append(
                f"no class set can hold {workers} workers of {need} GPUs now (best: {choice.key}, "
                f"{choice.hosts} nodes can take a worker)"
            )
            return SPLIT

        holder = self._job_lease(pod, namespace, job, choose, dry_run=dry_run)
        if holder is None:
            return None
        if holder == SPLIT:
            reason = reasons[0] if reasons else "no class set could hold every worker when the job's first worker came"
            message = f"dsplatform: job {job} is placed across class layouts (subnets): {reason}"
            log.warning("pod %s/%s: %s", namespace, (pod.get("metadata") or {}).get("name"), message)
            own = self.kube.cluster().vote(need)
            if own is None or self.kube.cluster().largest(own) < need:
                patch: JSONPatch = []
                note = {SPLIT_ANNOTATION: reason}
                if annotations_exist:
                    patch = [
                        {"op": "add", "path": "/metadata/annotations/" + escape(SPLIT_ANNOTATION), "value": reason}
                    ]
                else:
                    patch = [{"op": "add", "path": "/metadata/annotations", "value": note}]
                return GpuDecision(patch, (message,), None)
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


__all__ = [
    "CLASS_ANNOTATION",
    "ClusterView",
    "GpuClassPolicy",
    "GpuClassSettings",
    "GpuDecision",
    "KubeGpuClasses",
    "NETWORKS_ANNOTATION",
    "SPLIT",
    "SPLIT_ANNOTATION",
    "controller_of",
    "gpu_request",
    "lease_name",
    "networks_value",
    "read_cluster",
    "requested_classes",
    "rewrite",
    "rewrite_set",
]
