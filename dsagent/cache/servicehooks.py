"""What a layer above lends the node service, given to its constructor.

Who calls it: :class:`dsagent.cache.service.CacheService` takes a :class:`ServiceHooks`
(``CacheService(settings, hooks=...)``) and hands ``peer_holders`` to its
:class:`~dsagent.cache.peers.PeerFetcher`; cluster mode builds them
(``dsagent.nodeagent.clusterhooks.ClusterHooks``, wired by ``dsagent serve --kubernetes``), tests
build their own. What it owns: the questions the service asks the cluster, as plain
async callables, so that the cache layer never imports cluster code:

- ``admit_task(task_id)``: raises a :class:`~dsagent.errors.DsagentError` to refuse a new
  task id (in cluster mode: a pod UID that is no pod on this node);
- ``node_leaving()``: whether this node is leaving (cordoned or drain-tainted,
  :func:`dsagent.kube.leaving.node_leaving`), None when that cannot be read: asked on
  SIGTERM before the stripe hand-off, which a node that stays skips;
- ``peer_holders(name, digest, shares=True)``: the other agents holding ``name@digest``
  (:class:`PeerHolder`: base URL, node, and for a share its stripe group), ready ones
  first, then fetching, then (unless ``shares=False``) those holding a share of its stripe
  group (in cluster mode: from the node inventories, docs/design.md#peers);
- ``pod_wiring(pod_uid)``: the namespace of a pod on this node and the datasets its
  annotation names (:class:`PodWiring`), None for a pod the cluster does not show: what a
  pod may read of a striped version besides what its task names
  (:mod:`dsagent.cache.striped.stripereaders`);
- ``reports_pods``: the layer above tells the stripe shares which Datasets the node's pods
  name (:meth:`~dsagent.cache.striped.stripes.StripeShares.read_by`); until its first
  report no lapsed share is dropped, since a job may still read it.

Why a constructor argument: set on the service by attribute after both were built (the
agent needs the service; the service needs the agent's checks), what a service did would
depend on who had touched it last. The checks
need the agent's pod watch and API client, not the service, so they are built first and
the service is built with them; a service without hooks admits every task and asks only
its configured peers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

AdmitTask = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class PeerHolder:
    """One other agent holding a version: its base URL, how (``ready``, ``fetching`` or
    ``share``), its node's name, and for a share the version's stripe group as that node's
    inventory lists it (empty when it does not: an older agent, or a budget-cut annotation)."""

    url: str
    state: str
    node: str | None = None
    group: tuple[str, ...] = ()


class PeerHolders(Protocol):
    def __call__(self, name: str, digest: str, *, shares: bool = True) -> Awaitable[list[PeerHolder]]: ...


@dataclass(frozen=True)
class NamedDataset:
    """A dataset a pod names (its task or its annotation): the bundle store it names (None:
    the Dataset of that name in the pod's namespace) and the version it pins (None: any)."""

    name: str
    store: str | None = None
    digest: str | None = None


@dataclass(frozen=True)
class PodWiring:
    """What the cluster says of a pod on this node: its namespace and the datasets its
    ``dsagent.io/datasets`` annotation names."""

    namespace: str
    datasets: tuple[NamedDataset, ...] = ()


PodDatasets = Callable[[str], Awaitable["frozenset[str] | None"]]
PodWiringOf = Callable[[str], Awaitable["PodWiring | None"]]
NodeLeaving = Callable[[], Awaitable["bool | None"]]


@dataclass(frozen=True)
class ServiceHooks:
    """The cluster's answers the service asks for; None: not asked (see the module docstring)."""

    admit_task: AdmitTask | None = None
    peer_holders: PeerHolders | None = None
    pod_datasets: PodDatasets | None = None  # the dataset names a pod's annotation asks for (None: unknown pod)
    pod_wiring: PodWiringOf | None = None  # a pod's namespace and the datasets its annotation names (None: unknown)
    node_leaving: NodeLeaving | None = None  # whether this node is cordoned or drain-tainted (None: unknown)
    reports_pods: bool = False  # the Datasets the node's pods name are reported (StripeShares.read_by)


__all__ = [
    "AdmitTask",
    "NamedDataset",
    "PeerHolder",
    "PeerHolders",
    "PodDatasets",
    "PodWiring",
    "PodWiringOf",
    "ServiceHooks",
]
