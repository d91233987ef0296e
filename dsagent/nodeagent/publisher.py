"""What the agent publishes about its node, as pure functions over plain values.

Two objects (contract: docs/design.md#node-state):

- its ``NodeCache`` (:mod:`dsplatform.wire.nodecache`): the compact inventory JSON (budget
  64 KiB, trimmed by :func:`dsplatform.wire.inventory.compact`), the compact topology JSON
  (budget 32 KiB; left out when larger) and when it was written (:func:`node_state`);
- its Node, two small annotations (:func:`node_annotations`): ``dsagent.io/free-gpus``, the
  indices of free GPUs, published whenever they are known: from the kubelet's pod-resources
  API (``dsagent.nodeplugins.deviceplugin.podresources``, wired in by the CLI) when it
  answers, else only while no pod on the node requests GPUs (every GPU is free); otherwise
  the annotation is removed and the extender falls back to allocatable minus requests. And
  ``dsagent.io/follow-ups``, the namespaces of the running pods that name their follow-up
  job, while there are any (:func:`follow_ups`).

:func:`annotation_patch` turns the Node's current and desired annotations into the smallest
merge patch (None when nothing changed); it also removes the inventory, topology and
published-at annotations an agent of the release before wrote on the Node (the rolling
upgrade: docs/operator-guide/upgrade.md#nodecache). :func:`desired_annotations` is that
release's annotation form, which readers still accept for one release. Who calls it:
:class:`dsagent.nodeagent.clusteragent.ClusterAgent`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dsplatform import published
from dsplatform.gpus import GpuResources, QuantityError, pod_gpus
from dsplatform.wire import inventory as inventory_contract
from dsplatform.wire import nodecache
from dsplatform.wire.podannotations import next_job_of

INVENTORY = inventory_contract.ANNOTATION
TOPOLOGY = published.TOPOLOGY
FREE_GPUS = published.FREE_GPUS
FOLLOW_UPS = published.FOLLOW_UPS
PUBLISHED_AT = published.PUBLISHED_AT
CONTENT = (INVENTORY, TOPOLOGY, FREE_GPUS, FOLLOW_UPS)  # what the node reports; PUBLISHED_AT says when
OWNED = (*CONTENT, PUBLISHED_AT)  # every annotation an agent of this release or the one before wrote
TOPOLOGY_BUDGET = nodecache.TOPOLOGY_MAX_BYTES


def node_state(inventory: Mapping[str, Any] | None, topology_json: str | None) -> dict[str, str]:
    """What the node's ``NodeCache`` should say now (its ``status`` less ``publishedAt`` and
    ``version``, which are stamped when it is written): compared with what was last written,
    so that a write happens only on change."""
    state: dict[str, str] = {}
    if inventory is not None:
        state["inventory"] = inventory_contract.compact(quantized(inventory))
    if topology_json is not None and len(topology_json.encode()) <= TOPOLOGY_BUDGET:
        state["topology"] = topology_json
    return state


def node_annotations(free_gpus: Sequence[int] | None, follow_ups: Sequence[str] = ()) -> dict[str, str]:
    """The annotations this agent keeps on its Node now: the free GPUs, when known; the
    namespaces whose running pods name a follow-up (:func:`follow_ups`), when any do."""
    out = {FREE_GPUS: ",".join(str(i) for i in sorted(free_gpus))} if free_gpus is not None else {}
    if follow_ups:
        out[FOLLOW_UPS] = ",".join(sorted(set(follow_ups))[: published.FOLLOW_UPS_MAX])
    return out


def follow_ups(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """The namespaces of ``pods`` (the node's, not ended) that name their follow-up job
    (``dsagent.io/next-job``), sorted."""
    out = set()
    for pod in pods:
        meta = pod.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        annotations = meta.get("annotations")
        if isinstance(annotations, Mapping) and next_job_of(annotations) is not None:
            out.add(str(meta.get("namespace") or "default"))
    return sorted(out)


FREE_BYTES_QUANTUM = 64 << 20  # at least; 0.5% of the capacity on large disks


def desired_annotations(
    inventory: Mapping[str, Any] | None, topology_json: str | None, free_gpus: Sequence[int] | None
) -> dict[str, str]:
    """The annotations an agent of the release before wrote on its Node (readers of this
    release still accept them: the rolling upgrade; tests build Nodes of that form with it)."""
    desired: dict[str, str] = {}
    if inventory is not None:
        desired[INVENTORY] = inventory_contract.compact(quantized(inventory))
    if topology_json is not None and len(topology_json.encode()) <= TOPOLOGY_BUDGET:
        desired[TOPOLOGY] = topology_json
    if free_gpus is not None:
        desired[FREE_GPUS] = ",".join(str(i) for i in sorted(free_gpus))
    return desired


def quantized(inventory: Mapping[str, Any]) -> dict[str, Any]:
    """The inventory with ``freeBytes`` rounded down, so disk noise does not patch the Node.

    Free space moves by a few bytes all the time (logs, other tenants); publishing it
    exactly would patch the Node at every interval. Rounding down to 0.5% of the
    capacity (at least 64 MiB) keeps real changes visible and never overstates space.
    """
    result = dict(inventory)
    free, capacity = result.get("freeBytes"), result.get("capacityBytes")
    if isinstance(free, int) and isinstance(capacity, int):
        quantum = max(FREE_BYTES_QUANTUM, capacity // 200)
        result["freeBytes"] = free - free % quantum
    return result


def annotation_patch(current: Mapping[str, str] | None, desired: Mapping[str, str]) -> dict[str, str | None] | None:
    """Merge-patch values for ``metadata.annotations``: changed keys, None for stale ones
    (every annotation an agent wrote that ``desired`` leaves out, those of the release before
    included)."""
    current = current or {}
    patch: dict[str, str | None] = {k: v for k, v in desired.items() if current.get(k) != v}
    patch.update({k: None for k in OWNED if k in current and k not in desired})
    return patch or None


def clearing_patch(current: Mapping[str, str] | None) -> dict[str, str | None] | None:
    """The patch removing every annotation the agent owns (graceful shutdown)."""
    patch: dict[str, str | None] = {k: None for k in OWNED if k in (current or {})}
    return patch or None


def blind_clearing_patch() -> dict[str, str | None]:
    """The patch removing every annotation the agent owns, whatever the Node carries now: a
    merge patch's null for an absent key changes nothing, so a stopping agent need not read
    its Node first (one request, not two, against an API server that may be hanging)."""
    return {key: None for key in OWNED}


def free_gpus(gpu_count: int | None, gpu_pods: int) -> list[int] | None:
    """All GPUs when no pod on the node requests GPUs; None (unknown) otherwise."""
    if gpu_count is None or gpu_pods > 0:
        return None
    return list(range(gpu_count))


def gpu_request(pod: Mapping[str, Any], names: GpuResources = GpuResources()) -> int:
    """GPUs a raw pod requests, by the platform's one rule (:func:`dsplatform.gpus.pod_gpus`:
    init containers and sidecars included, the node's configured resource names); a quantity
    it cannot read counts no GPUs, as in the extender."""
    try:
        return pod_gpus(pod.get("spec"), names)
    except QuantityError:
        return 0


def applied(current: Mapping[str, str] | None, patch: Mapping[str, str | None]) -> dict[str, str]:
    """``current`` after ``patch``."""
    result = dict(current or {})
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = value
    return result


def topology_json(topology: Any, mode: str, node: str) -> str:
    """The topology annotation's JSON with the RoCE classes cut by ``mode``; a node whose
    classes cannot be cut that way (subnet mode on NICs without an address yet) publishes
    its topology without classes."""
    from gpu_topology import to_json, topology_to_dict

    try:
        return to_json(topology, mode=mode)
    except Exception as exc:
        logging.getLogger("dsagent.nodeagent").warning(
            "RoCE classes by %s on node %s: %s; publishing the topology without classes", mode, node, exc
        )
        document = topology_to_dict(topology)
        document.pop("classMode", None)
        document["classes"] = []
        return json.dumps(document, separators=(",", ":"))


__all__ = [
    "topology_json",
    "FREE_BYTES_QUANTUM",
    "FOLLOW_UPS",
    "FREE_GPUS",
    "INVENTORY",
    "OWNED",
    "PUBLISHED_AT",
    "TOPOLOGY",
    "annotation_patch",
    "node_annotations",
    "node_state",
    "applied",
    "blind_clearing_patch",
    "clearing_patch",
    "desired_annotations",
    "follow_ups",
    "free_gpus",
    "gpu_request",
    "quantized",
]
