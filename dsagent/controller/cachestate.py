"""What ``kubectl get datasets`` and ``kubectl describe dataset`` show: the Dataset's phase,
its cache across the cluster, its conditions, and the Events a change is worth.

Who calls it: the reconcile loop (:mod:`dsagent.controller.reconcile`), once per Dataset and
pass, with the nodes' inventories already parsed. What it owns, as pure functions of their
inputs (no API, no clock):

- :func:`holdings`: per node, how much of the current version it holds and in which state
  (a ready copy, a copy being fetched with the bytes it has so far, a failed one, a share
  of a striped version); ``status.readyNodes`` are its ready ones; :func:`held_versions`
  is the same for one node at every digest it lists;
- :func:`cache_status`: ``status.phase``, ``status.cache`` (cached bytes, percentages,
  nodes ready / fetching / failed, and the nodes whose stripe share holds every bundle: the
  group's whole copies and those kept after the group let them go) and
  ``status.conditions`` (``Ready``, ``Packing``, ``Degraded``) following the Kubernetes
  API conventions: a condition's ``lastTransitionTime`` moves only when its status flips;
- :func:`changes`: the Events between the last status and the new one (cached on a node,
  caching started, failed, no longer cached, ready, packed, pack failed).

Phases, in the order they are decided: ``Packing`` (a pack Job runs and no version is
served yet), ``Failed`` (the pack failed and no version is served), ``Pending`` (no
version known yet), ``Ready`` (at least one node holds the current version whole, or a
striped version's group holds every byte), ``Caching`` (nodes are fetching it), and
``NotCached`` (known, held nowhere: the first pod's node will fetch it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from dsplatform.wire.inventory import versions_of, whole_share

JSON = dict[str, Any]

#: node names listed in status.cache's lists at most (the counts are always whole)
NODES_LISTED = 64


class Holding(NamedTuple):
    """One node's part of the current version (a tuple of plain values: the collector stops
    tracking it, however many a pass keeps)."""

    state: str  # "ready", "fetching", "failed" or "share" (a striped version's share)
    held_bytes: int
    size_bytes: int
    whole: bool = False  # a share holding every bundle: a whole copy (a member's, or one kept)


def holdings(inventories: Mapping[str, Mapping[str, Any]], name: str, digest: str | None) -> dict[str, Holding]:
    """Per node, what its inventory says of ``name`` at ``digest`` (nodes holding nothing left out).
    ``inventories`` may be every node's or only those listing ``name``: the answer is the same.

    Inventories are another party's JSON: a field of the wrong type counts as absent."""
    if not digest:
        return {}
    out: dict[str, Holding] = {}
    for node, inv in inventories.items():
        found = holding(inv, name, digest)
        if found is not None:
            out[node] = found
    return out


def held_versions(inventory: Mapping[str, Any], name: str) -> dict[str, Holding]:
    """Digest -> :func:`holding` of ``name`` at that digest, for every digest the inventory
    lists ``name`` at (a copy or a stripe share): what :func:`holdings` answers for this node
    at any digest, worked out once per inventory rather than once per Dataset."""
    found = [v.get("digest") for v in versions_of(inventory, name)]
    stripes = inventory.get("stripes")
    share = stripes.get(name) if isinstance(stripes, Mapping) else None
    if isinstance(share, Mapping):
        found.append(share.get("digest"))
    out: dict[str, Holding] = {}
    for digest in found:
        if isinstance(digest, str) and digest and digest not in out:
            held = holding(inventory, name, digest)
            if held is not None:
                out[digest] = held
    return out


def holding(inv: Mapping[str, Any], name: str, digest: str) -> Holding | None:
    """What one node's inventory says of ``name`` at ``digest``; None when it holds none of it."""
    mine = [v for v in versions_of(inv, name) if v.get("digest") == digest]
    if mine:
        states = {v.get("state") for v in mine}
        size = _whole(next((v.get("sizeBytes") for v in mine if _whole(v.get("sizeBytes"))), 0))
        if "ready" in states:
            return Holding("ready", size, size)
        if "fetching" in states:
            held = _whole(next((v.get("heldBytes") for v in mine if v.get("state") == "fetching"), 0))
            return Holding("fetching", min(held, size) if size else held, size)
        if "failed" in states:
            return Holding("failed", 0, size)
    stripes = inv.get("stripes")
    share = stripes.get(name) if isinstance(stripes, Mapping) else None
    if isinstance(share, Mapping) and share.get("digest") == digest:
        return Holding(
            "share", _whole(share.get("heldBytes")), _whole(share.get("sizeBytes")), whole_share(inv, name, digest)
        )
    return None


def cache_status(
    held: Mapping[str, Holding],
    *,
    digest: str | None,
    size_bytes: int | None,
    pack_state: str | None,
    previous: Mapping[str, Any],
    generation: int | None,
    now: str,
) -> JSON:
    """``phase``, ``cache`` and ``conditions`` for the status (see the module docstring)."""
    by_state: dict[str, list[str]] = {"ready": [], "fetching": [], "failed": [], "share": []}
    whole: list[str] = []
    cached = best = largest = in_shares = 0
    for node, h in held.items():  # one walk: it runs for every Dataset every pass
        if h.state in by_state:
            by_state[h.state].append(node)
        if h.whole:
            whole.append(node)
        cached += h.held_bytes
        best, largest = max(best, h.held_bytes), max(largest, h.size_bytes)
        if h.state == "share":
            in_shares += h.held_bytes
    size = size_bytes or largest
    ready, fetching, failed = sorted(by_state["ready"]), sorted(by_state["fetching"]), sorted(by_state["failed"])
    shares, whole = by_state["share"], sorted(whole)
    striped_whole = bool(shares) and size > 0 and in_shares >= size
    cluster_bytes = size if ready else min(size, in_shares) if shares else best
    cache: JSON = {
        "cachedBytes": cached,
        "cachedPercent": _percent(cluster_bytes, size),  # of one whole copy, anywhere in the cluster
        "bestNodePercent": _percent(best, size),  # the most one node holds
        "nodesReady": len(ready),
        "nodesFetching": len(fetching),
        "nodesFailed": len(failed),
        "fetchingNodes": fetching[:NODES_LISTED],
        "failedNodes": failed[:NODES_LISTED],
    }
    if shares:
        cache["stripeMembers"] = len(shares)
        cache["nodesWholeShare"] = len(whole)  # a share holding every bundle: a member's, or one kept
        cache["wholeShareNodes"] = whole[:NODES_LISTED]
    packing = pack_state in ("Pending", "Running")
    pack_failed = pack_state in ("Failed", "SourceUnreadable")
    if packing and not digest:
        phase = "Packing"
    elif pack_failed and not digest:
        phase = "Failed"
    elif not digest:
        phase = "Pending"
    elif ready or striped_whole:
        phase = "Ready"
    elif fetching or shares:
        phase = "Caching"
    else:
        phase = "NotCached"
    is_ready = phase == "Ready"
    degraded = bool(failed) or pack_failed
    conditions = [
        _condition(
            previous, "Ready", is_ready, generation, now,
            reason="Cached" if is_ready else phase,
            message=(
                f"{len(ready)} node(s) hold {_short(digest)} whole" if ready
                else f"{len(whole)} node(s) hold {_short(digest)} whole as a stripe share" if whole
                else "the stripe group holds every byte" if striped_whole
                else f"{len(fetching)} node(s) fetching" if fetching
                else "no node holds the current version"
            ),
        ),
        _condition(
            previous, "Packing", packing, generation, now,
            reason="PackJobRunning" if packing else "PackJobIdle",
            message="a pack Job is packing the source" if packing else "no pack Job is running",
        ),
        _condition(
            previous, "Degraded", degraded, generation, now,
            reason="PackFailed" if pack_failed else "CacheFailed" if failed else "AsExpected",
            message=(
                "the last pack failed or its source was unreadable: see status.pack" if pack_failed
                else f"caching failed on {len(failed)} node(s): {', '.join(failed[:5])}" if failed
                else "nothing has failed"
            ),
        ),
    ]  # fmt: skip
    return {"phase": phase, "cache": cache, "conditions": conditions}


def changes(previous: Mapping[str, Any], status: Mapping[str, Any], digest: str | None) -> list[tuple[str, str, str]]:
    """``(type, reason, note)`` of each Event between the ``previous`` status and this one."""
    events: list[tuple[str, str, str]] = []
    before: Mapping[str, Any] = previous["cache"] if isinstance(previous.get("cache"), Mapping) else {}
    now: Mapping[str, Any] = status["cache"] if isinstance(status.get("cache"), Mapping) else {}
    same_version = previous.get("digest") == digest
    was_ready = set(_names(previous.get("readyNodes"))) if same_version else set()
    is_ready = set(_names(status.get("readyNodes")))
    was_fetching = set(_names(before.get("fetchingNodes"))) if same_version else set()
    was_failed = set(_names(before.get("failedNodes"))) if same_version else set()
    short = _short(digest)
    events += _per_node(
        "Normal", "Caching", set(_names(now.get("fetchingNodes"))) - was_fetching - was_ready,
        lambda where: f"caching {short} on {where}",
    )  # fmt: skip
    events += _per_node(
        "Normal", "Cached", is_ready - was_ready, lambda where: f"{short} is cached and verified on {where}"
    )
    events += _per_node(
        "Warning", "CacheFailed", set(_names(now.get("failedNodes"))) - was_failed,
        lambda where: f"caching {short} failed on {where}: its agent's log and 'dsctl status' there say why; "
        "the pod's Events carry the error code and hint",
    )  # fmt: skip
    events += _per_node(
        "Normal", "Evicted", was_ready - is_ready, lambda where: f"{short} is no longer cached on {where}"
    )
    if status.get("phase") == "Ready" and previous.get("phase") != "Ready":
        events.append(
            ("Normal", "Ready", f"{_short(digest)} is ready on {len(is_ready) or 'its stripe group'} node(s)")
        )
    pack_before = _pack_state(previous)
    pack_now = _pack_state(status)
    if pack_now != pack_before:
        if pack_now == "Running":
            events.append(("Normal", "Packing", "a pack Job is packing the source into bundles"))
        elif pack_now == "Succeeded":
            events.append(("Normal", "Packed", f"packed as {_short(digest)}"))
        elif pack_now == "Failed":
            events.append(("Warning", "PackFailed", "the pack Job failed: 'kubectl logs job/...' (see status.pack)"))
    return events


#: a change on more nodes than this in one pass is one Event naming the first of them and
#: the count (a version warmed onto a thousand nodes, or a controller's first pass over a
#: cluster that holds it: one Event, not a thousand API writes)
NODE_EVENTS = 5


def _per_node(kind: str, reason: str, nodes: set[str], note: Callable[[str], str]) -> list[tuple[str, str, str]]:
    """One Event a node for up to :data:`NODE_EVENTS` nodes, else one for them all."""
    ordered = sorted(nodes)
    if len(ordered) <= NODE_EVENTS:
        return [(kind, reason, note(f"node {node}")) for node in ordered]
    named = ", ".join(ordered[:NODE_EVENTS])
    return [(kind, reason, note(f"{len(ordered):,} nodes ({named} and {len(ordered) - NODE_EVENTS:,} more)"))]


def _condition(
    previous: Mapping[str, Any],
    kind: str,
    true: bool,
    generation: int | None,
    now: str,
    *,
    reason: str,
    message: str,
) -> JSON:
    status = "True" if true else "False"
    old = next((c for c in previous.get("conditions") or [] if isinstance(c, Mapping) and c.get("type") == kind), None)
    since = old.get("lastTransitionTime") if old is not None and old.get("status") == status else None
    condition: JSON = {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or now,
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    return condition


def _pack_state(status: Mapping[str, Any]) -> str | None:
    pack = status.get("pack")
    state = pack.get("state") if isinstance(pack, Mapping) else None
    return state if isinstance(state, str) else None


def _names(value: Any) -> Sequence[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _whole(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _percent(part: int, whole: int) -> int:
    return 0 if whole <= 0 else min(100, (100 * part) // whole)


def _short(digest: str | None) -> str:
    return (digest or "-")[:12]


__all__ = ["NODES_LISTED", "Holding", "cache_status", "changes", "held_versions", "holding", "holdings"]
