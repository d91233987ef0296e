"""The Nodes as the platform's readers see them: each with what its ``NodeCache`` publishes.

Who calls it: the webhook's RoCE class vote and deadline plans
(:mod:`dsagent.webhook.roceclass`, :mod:`dsagent.webhook.deadlineplan`), and the Dataset
controller (:meth:`dsagent.controller.reconcile.DatasetController.list_nodes`) until its
list+watch of both (:mod:`dsagent.kube.nodewatch`) has listed them; the extender keeps its
own (:mod:`scheduler_plugin.nodecache`). What it owns: listing Nodes
and ``NodeCache`` objects as raw JSON and overlaying them
(:func:`dsplatform.wire.nodecache.overlay`): a node's ``NodeCache`` replaces its inventory,
topology and published-at annotations; a node without one keeps its own (an agent of the
release before: the rolling upgrade, docs/operator-guide/upgrade.md#nodecache). Without the
``NodeCache`` CRD (404: a chart not yet upgraded) the Nodes alone.
"""

from __future__ import annotations

from typing import Any

from dsagent.errors import NotFound
from dsagent.kube.apiclient import loads_list, translated
from dsplatform.wire import nodecache

JSON = dict[str, Any]


def list_caches(custom: Any, *, timeout: float | None, resource_version: str | None = None) -> list[JSON]:
    """Every ``NodeCache`` as raw JSON; none when the CRD is not installed."""
    extra: JSON = {"_request_timeout": timeout} if timeout is not None else {}
    if resource_version is not None:
        extra["resource_version"] = resource_version
    try:
        with translated("list nodecaches"):
            raw = custom.list_cluster_custom_object(
                nodecache.GROUP, nodecache.API_VERSION, nodecache.PLURAL, _preload_content=False, **extra
            )
    except NotFound:
        return []
    items = loads_list(raw.data).get("items")
    return items if isinstance(items, list) else []


def overlaid(nodes: list[JSON], caches: list[JSON]) -> list[JSON]:
    """``nodes`` with their ``NodeCache`` overlaid (:func:`dsplatform.wire.nodecache.overlay`)."""
    states = nodecache.by_node(caches)
    return [dict(nodecache.overlay(node, states.get(_name(node)))) if states else node for node in nodes]


def list_nodes(core: Any, custom: Any, *, timeout: float | None, resource_version: str | None = None) -> list[JSON]:
    """Every Node as raw JSON with its ``NodeCache`` overlaid."""
    extra: JSON = {"_request_timeout": timeout} if timeout is not None else {}
    if resource_version is not None:
        extra["resource_version"] = resource_version
    with translated("list nodes"):
        raw = core.list_node(_preload_content=False, **extra)
    items = loads_list(raw.data).get("items")
    nodes = [n for n in items if isinstance(n, dict)] if isinstance(items, list) else []
    return overlaid(nodes, list_caches(custom, timeout=timeout, resource_version=resource_version))


def _name(node: JSON) -> str:
    meta = node.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, dict) else ""


__all__ = ["list_caches", "list_nodes", "overlaid"]
