"""How many GPUs a pod requests, and what the GPU resources are called.

Who calls it: the admission webhook's GPU class policy (``dsagent.webhook.roceclass``),
the agent's annotation publisher (``dsagent.nodeagent.publisher``: is any GPU pod on the node),
the controller's preparation (``dsagent.controller.podfacts``: free GPUs per node), the device
plugin and the agent's settings (the names), the scheduler extender (``scheduling.podspec``,
``.nodecache``, ``.migrator``, ``.nodeinfo`` for quantities) and the simulator (through the
extender's framework); ``gpu_topology`` names its classes with :data:`CLASS_STEM`.

What it owns: two facts every one of them must agree on, each stated once here.

- **The names.** The plain GPU resource (:data:`GPU_RESOURCE`, ``nvidia.com/gpu``), and the
  device plugin's resources under a DNS prefix (:data:`RESOURCE_PREFIX`, ``dsagent.io``):
  a RoCE class ``<prefix>/gpu-roce<N>``, a class set ``<prefix>/gpu-roce<N>-<M>...``
  (``docs/design.md#class-sets``) and every GPU of the node, ``<prefix>/gpu-all``.
  :class:`GpuResources` is one configuration of them (each component reads its own
  settings into one).
- **The count** (:func:`pod_gpus`, per resource :func:`gpu_requests`): Kubernetes' effective
  request, per resource: the larger of the app containers' sum (plus every restartable
  "sidecar" init container, ``restartPolicy: Always``, which runs alongside them) and, for
  each regular init container, its request plus the sidecars started before it. A
  container's request is its ``requests`` entry, else its ``limits`` entry (Kubernetes
  defaults an extended resource's request from its limit and requires them equal). The
  pod's GPUs are the sum over its GPU resources.
- **A node's GPUs** (:func:`node_gpus`, from its ``status.allocatable``): the same GPUs are
  advertised under several names (the plain resource by NVIDIA's plugin; the device plugin's
  disjoint classes, their class sets and ``gpu-all``), so the node has the largest of the
  plain count, ``gpu-all`` and the sum of its single classes; a class set never adds GPUs.

Pure: no I/O, tolerant of any shape (a non-dict container or resource map counts nothing);
an unreadable quantity of a GPU resource raises :class:`QuantityError`, which each caller
maps (the extender reports it on the pod, the agent counts no GPUs).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from dsplatform.errors import VocabularyError

#: the plain GPU resource of NVIDIA's device plugin
GPU_RESOURCE = "nvidia.com/gpu"
#: the DNS prefix of the dsagent device plugin's resources
RESOURCE_PREFIX = "dsagent.io"
#: the stem of a RoCE class's name (``gpu-roce1``) and resource (``<prefix>/gpu-roce1``)
CLASS_STEM = "gpu-roce"
#: the whole-node resource (``<prefix>/gpu-all``): every GPU of the node
WHOLE_NODE = "gpu-all"
#: the default class resource prefix, ``dsagent.io/gpu-roce`` (the extender's setting)
CLASS_RESOURCE_PREFIX = f"{RESOURCE_PREFIX}/{CLASS_STEM}"

_CLASS_SUFFIX = re.compile(r"^[0-9]+(-[0-9]+)*$")  # gpu-roce<N>, a class set gpu-roce<N>-<M>...
_QUANTITY = re.compile(r"^([+-]?\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_SUFFIX: dict[str | None, float] = {
    None: 1,
    "m": 0.001,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


class QuantityError(VocabularyError):
    """A resource quantity that is not a Kubernetes quantity."""


@dataclass(frozen=True)
class GpuResources:
    """The configured GPU resource names: ``gpu`` (plain), the class resources
    ``<prefix>/<stem><N>[-<M>...]`` and ``<prefix>/gpu-all``."""

    gpu: str = GPU_RESOURCE
    prefix: str = RESOURCE_PREFIX
    stem: str = CLASS_STEM

    @classmethod
    def of_class_prefix(cls, gpu: str, class_prefix: str) -> GpuResources:
        """From the extender's form, ``<prefix>/<stem>`` (``dsagent.io/gpu-roce``)."""
        prefix, _, stem = class_prefix.rpartition("/")
        return cls(gpu=gpu, prefix=prefix, stem=stem)

    @property
    def class_prefix(self) -> str:
        """``<prefix>/<stem>``: every class and class-set resource starts with it."""
        return f"{self.prefix}/{self.stem}"

    @property
    def whole_node(self) -> str:
        return f"{self.prefix}/{WHOLE_NODE}"

    def class_of(self, resource: str) -> str | None:
        """The class (set) name of a class resource (``dsagent.io/gpu-roce1-2`` -> ``gpu-roce1-2``);
        None for any other resource."""
        head = self.class_prefix
        if resource.startswith(head) and _CLASS_SUFFIX.match(resource[len(head) :]):
            return resource[len(self.prefix) + 1 :]
        return None

    def is_gpu(self, resource: str) -> bool:
        """Whether ``resource`` counts GPUs: the plain one, a class (set), or the whole node."""
        return resource in (self.gpu, self.whole_node) or self.class_of(resource) is not None


def parse_quantity(value: Any) -> int:
    """A Kubernetes quantity as a whole count (rounded up): ``"4"``, ``4``, ``"2k"``."""
    return math.ceil(_exact(value))


def parse_milli(value: Any) -> int:
    """A Kubernetes quantity in thousandths, rounded up: ``"500m"`` -> 500, ``"2"`` -> 2000
    (CPU in millicores)."""
    return math.ceil(_exact(value) * 1000)


def _exact(value: Any) -> Decimal:
    """A quantity's exact value: in decimal, so that ``"16.1k"`` is 16,100, not 16,100.000...2
    (16,101 once rounded up), as it was in binary floating point."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float) and math.isfinite(value):
        return Decimal(repr(value))
    match = _QUANTITY.match(value.strip()) if isinstance(value, str) else None
    if not match:
        raise QuantityError(f"{value!r} is not a quantity", hint='e.g. "4" or "500m"')
    return Decimal(match.group(1)) * Decimal(repr(_SUFFIX[match.group(2)]))


def gpu_requests(spec: Any, names: GpuResources = GpuResources()) -> dict[str, int]:
    """The pod's effective request of each GPU resource it names (zero ones left out).

    ``spec`` is a pod's ``spec`` in the wire format (a dict; anything else requests nothing).
    Raises :class:`QuantityError` on a GPU quantity it cannot read.
    """
    return effective_requests(spec, names.is_gpu, parse_quantity)


def effective_requests(
    spec: Any, counted: Callable[[str], bool], parse: Callable[[Any], int] = parse_quantity
) -> dict[str, int]:
    """The pod's effective request of each resource ``counted`` accepts, each read by ``parse``
    (zero ones left out), as kube-scheduler counts it: the app containers and the restartable
    init containers (sidecars) together, or the largest moment of the init phase, whichever
    is more. Raises :class:`QuantityError` on a quantity it cannot read."""
    spec = spec if isinstance(spec, Mapping) else {}
    app: dict[str, int] = {}
    for container in _containers(spec.get("containers")):
        _add(app, _requests(container, counted, parse))
    sidecars: dict[str, int] = {}  # restartable init containers started so far
    init: dict[str, int] = {}  # the largest moment of the init phase
    for container in _containers(spec.get("initContainers")):
        own = _requests(container, counted, parse)
        if container.get("restartPolicy") == "Always":
            _add(app, own)  # a sidecar runs alongside the app containers
            _add(sidecars, own)
            moment = dict(sidecars)
        else:
            moment = dict(sidecars)
            _add(moment, own)
        for resource, amount in moment.items():
            init[resource] = max(init.get(resource, 0), amount)
    effective = {r: max(app.get(r, 0), init.get(r, 0)) for r in app.keys() | init.keys()}
    return {r: q for r, q in sorted(effective.items()) if q > 0}


def node_gpus(allocatable: Any, names: GpuResources = GpuResources()) -> int | None:
    """The GPUs a node offers, from its ``status.allocatable`` (see the module's rule); None
    when it names no GPU resource. A quantity that cannot be read counts as not named."""
    allocatable = allocatable if isinstance(allocatable, Mapping) else {}
    plain: list[int] = []  # the plain resource, gpu-all: every GPU, each
    classes: list[int] = []  # single classes: disjoint
    for resource, quantity in allocatable.items():
        if not isinstance(resource, str) or not names.is_gpu(resource):
            continue
        try:
            count = parse_quantity(quantity)
        except QuantityError:
            continue
        class_name = names.class_of(resource)
        if class_name is None:
            plain.append(count)
        elif "-" not in class_name[len(names.stem) :]:  # gpu-roce1, not the set gpu-roce1-2
            classes.append(count)
    if not plain and not classes:
        return None
    return max([*plain, sum(classes)])


def pod_gpus(spec: Any, names: GpuResources = GpuResources()) -> int:
    """The GPUs a pod requests: the sum of :func:`gpu_requests` (see the module's rule)."""
    return sum(gpu_requests(spec, names).values())


def _containers(value: Any) -> list[Mapping[str, Any]]:
    return [c for c in value if isinstance(c, Mapping)] if isinstance(value, list) else []


def _requests(
    container: Mapping[str, Any], counted: Callable[[str], bool], parse: Callable[[Any], int]
) -> dict[str, int]:
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return {}
    limits, requests = resources.get("limits"), resources.get("requests")
    merged = {
        **(limits if isinstance(limits, Mapping) else {}),
        **(requests if isinstance(requests, Mapping) else {}),
    }
    return {k: parse(v) for k, v in merged.items() if isinstance(k, str) and counted(k)}


def _add(into: dict[str, int], amounts: Mapping[str, int]) -> None:
    for resource, amount in amounts.items():
        into[resource] = into.get(resource, 0) + amount


__all__ = [
    "CLASS_RESOURCE_PREFIX",
    "CLASS_STEM",
    "GPU_RESOURCE",
    "RESOURCE_PREFIX",
    "WHOLE_NODE",
    "GpuResources",
    "QuantityError",
    "effective_requests",
    "gpu_requests",
    "parse_milli",
    "node_gpus",
    "parse_quantity",
    "pod_gpus",
]
