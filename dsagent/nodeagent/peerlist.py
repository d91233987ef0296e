"""Cluster mode's peer list: the agents whose node inventories hold a version ready.

Who calls it: :meth:`dsagent.nodeagent.clusterhooks.ClusterHooks.peer_holders`, the peer list
the cache service is built with when the agent has a peer token: :func:`holders_from_nodes`
over a fresh node list and ``NodeCache`` list (docs/design.md#peers). Each node's
``NodeCache`` says what it holds (else, an agent of the release before, its
``dsagent.io/inventory`` annotation: :func:`dsplatform.wire.nodecache.published_annotations`);
its agent is reached at the node's InternalIP on the peer port (the agent's TCP port,
published on the node: hostPort or host network).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from dsagent.cache.servicehooks import PeerHolder
from dsplatform import boundedjson
from dsplatform.wire.inventory import ANNOTATION, holds, loads, stripe_group
from dsplatform.wire.nodecache import NodeState, published_annotations

log = logging.getLogger("dsagent.nodeagent")


def _address(node: Any) -> str | None:
    addresses = getattr(getattr(node, "status", None), "addresses", None) or []
    for kind in ("InternalIP", "ExternalIP"):
        for address in addresses:
            if getattr(address, "type", None) == kind and getattr(address, "address", None):
                return str(address.address)
    return None


def holders_from_nodes(
    nodes: Iterable[Any],
    own_node: str,
    name: str,
    digest: str,
    port: int,
    *,
    shares: bool = True,
    published: Mapping[str, NodeState] | None = None,
) -> list[PeerHolder]:
    """The agents on ``nodes`` (not ``own_node``) whose inventory lists ``name@digest``:
    those holding it ready first, then those fetching it (they serve the bundles they finished),
    then, unless ``shares=False``, the members of its stripe group that hold bundles (each
    serves its own, and the group its inventory lists says which are whose). ``published``:
    node name -> what its ``NodeCache`` publishes (:func:`dsplatform.wire.nodecache.by_node`)."""
    urls: list[PeerHolder] = []
    fetching: list[PeerHolder] = []
    held: list[PeerHolder] = []
    for node in nodes:
        metadata = getattr(node, "metadata", None)
        if metadata is None or metadata.name == own_node:
            continue
        cache = published.get(metadata.name) if published is not None else None
        text = published_annotations(metadata.annotations, cache.published if cache else None).get(ANNOTATION)
        if not text:
            continue
        try:
            inventory = loads(text, what="node inventory")
        except boundedjson.JsonRefused as exc:
            log.debug("node %s has an unreadable inventory: %s", metadata.name, exc)
            continue
        address = _address(node)
        state = holds(inventory, name, digest) if address is not None else None
        if state is not None and address is not None:
            host = f"[{address}]" if ":" in address else address
            group = stripe_group(inventory, name, digest) if state == "share" else ()
            holder = PeerHolder(f"http://{host}:{port}", state, metadata.name, group)
            (urls if state == "ready" else fetching if state == "fetching" else held).append(holder)
    return urls + fetching + held if shares else urls + fetching


__all__ = ["holders_from_nodes"]
