"""Stripe groups the Dataset controller holds (``spec.stripe``, docs/design-striping.md#group).

Who calls it: :meth:`dsagent.controller.reconcile.DatasetController.reconcile`, per Dataset,
each pass. For a Dataset with ``spec.stripe`` (``auto``, or ``{members: N}``) and a packed
version (``status.bytes``, ``spec.bundles``), it chooses the group with the pure
:func:`dsagent.cache.stripegroup.choose_group` (earlier members first, then nodes holding
bundles, then room), asks every member's agent to hold its share (``PUT /v1/stripes/<name>``,
idempotent: asking again each pass is the renewal of the share's lease) and reports
``status.stripe``: the members, and each one's held and owned bytes, never "complete" before
every member says so. The group starts with the job's own nodes (:func:`job_nodes`: where
the Dataset's pods run) and prefers the RoCE subnets of the first member (:func:`node_subnets`,
from the topology each agent publishes). A member dropped from the group, or every member
once ``spec.stripe`` goes, is told to release its share (``DELETE /v1/stripes/<name>``); one
that cannot be told lets it lapse with its lease.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from dsagent.cache.stripegroup import Candidate, choose_group
from dsagent.cluster.datasets import parse_stripe
from dsagent.controller.agents import JSON, AgentCall
from dsagent.controller.podfacts import dataset_names, ended, node_of
from dsplatform import published
from gpu_topology import TopologyError, roce_subnets, subnet_key, topology_from_dict

TOPOLOGY_MAX_BYTES = 32 * 1024  # the extender's budget for the same annotation


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def job_nodes(pods: Iterable[Mapping[str, Any]], namespace: str, name: str) -> list[str]:
    """The nodes of the pods in ``namespace`` that name Dataset ``name`` and are bound and not
    ended, oldest pod first: the job's ranks there read their share from local disk."""
    found = []
    for pod in pods:
        meta = _mapping(pod.get("metadata"))
        node = node_of(pod)
        if node is None or ended(pod) or meta.get("namespace") != namespace or name not in dataset_names(pod):
            continue
        found.append((str(meta.get("creationTimestamp") or ""), str(meta.get("name") or ""), node))
    return list(dict.fromkeys(node for _, _, node in sorted(found)))


def node_subnets(nodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """node -> the key of its RoCE subnets (:func:`gpu_topology.subnet_key`), from the topology
    its agent publishes (``dsagent.io/topology``); nodes without one are left out. Hostile
    input: an oversized or unreadable annotation counts as unknown."""
    out = {}
    for node in nodes:
        meta = _mapping(node.get("metadata"))
        annotations = _mapping(meta.get("annotations"))
        text = annotations.get(published.TOPOLOGY)
        key = _subnet_key(text) if isinstance(text, str) and len(text) <= TOPOLOGY_MAX_BYTES else None
        if key is not None:
            out[str(meta.get("name"))] = key
    return out


@lru_cache(maxsize=1024)
def _subnet_key(text: str) -> str | None:
    """Parsed once per distinct annotation (a cluster has few distinct topologies)."""
    try:
        return subnet_key(roce_subnets(topology_from_dict(json.loads(text))))
    except (TopologyError, ValueError, TypeError, AttributeError, KeyError):
        return None


def _release(agent_call: AgentCall, nodes: Iterable[str], name: str, digest: Any, who: str) -> None:
    query = f"?digest={digest}" if isinstance(digest, str) else ""
    for node in nodes:
        agent_call(node, "DELETE", f"/v1/stripes/{name}{query}", None, who)  # unreachable: its lease lapses


def stripe_status(
    name: str,
    spec: JSON,
    status: JSON,
    inventories: Mapping[str, Mapping[str, Any]],
    *,
    agent_call: AgentCall,
    agent_urls: Mapping[str, str],
    who: str = "-",
    job: Sequence[str] = (),
    subnets: Mapping[str, str] | None = None,
) -> JSON:
    """The Dataset's ``status.stripe``, after asking the chosen members' agents (each request
    names the Dataset ``who``, ``namespace/name``, it is for: docs/operator-guide/tenancy.md).
    ``job``: the nodes of the Dataset's pods (:func:`job_nodes`), members first;
    ``subnets``: node -> its RoCE subnets' key (:func:`node_subnets`)."""
    mode = parse_stripe(spec.get("stripe"))
    size = _int(status.get("bytes"))
    store = spec.get("bundles")
    before = [str(n.get("node")) for n in (status.get("stripe") or {}).get("nodes") or [] if isinstance(n, dict)]
    if mode is None and before:  # striping switched off: the shares go now
        _release(agent_call, before, name, status.get("digest"), who)
    if mode is None or not size or not isinstance(store, str):
        return {"state": "Off" if mode is None else "Waiting", "nodes": [], "members": 0}
    subnets = subnets or {}
    candidates = []
    for node in sorted(agent_urls):
        inv = inventories.get(node) or {}
        held = ((inv.get("stripes") or {}).get(name) or {}).get("heldBytes")
        whole = (inv.get("datasets") or {}).get(name) or {}
        held_bytes = _int(held) or (_int(whole.get("sizeBytes")) if whole.get("state") == "ready" else 0)
        candidates.append(
            Candidate(node, _int(inv.get("freeBytes")), held_bytes, subnets.get(node), _int(inv.get("capacityBytes")))
        )
    members = choose_group(
        candidates, size_bytes=size, job_nodes=job, before=before, members=None if mode == "auto" else int(mode)
    )
    _release(agent_call, [n for n in before if n not in members and n in agent_urls], name, status.get("digest"), who)
    body = {"store": store, "members": members, "peers": {m: agent_urls[m] for m in members}}
    if isinstance(status.get("digest"), str):
        body["digest"] = status["digest"]
    reports = []
    for node in members:
        answer = agent_call(node, "PUT", f"/v1/stripes/{name}", body, who)
        if answer is None or answer[0] != 200 or not isinstance(answer[1], dict):
            reports.append({"node": node, "state": "unreachable" if answer is None else "failed",
                            "bytesHeld": 0, "bytesOwned": 0})  # fmt: skip
            continue
        share = answer[1]
        state = "ready" if share.get("complete") else "fetching"
        held, owned = _int(share.get("bytesHeld")), _int(share.get("bytesOwned"))
        reports.append({"node": node, "state": state, "bytesHeld": held, "bytesOwned": owned})
    complete = bool(reports) and all(r["state"] == "ready" for r in reports)
    return {"state": "Ready" if complete else "Filling", "members": len(members), "nodes": reports}


__all__ = ["job_nodes", "node_subnets", "parse_stripe", "stripe_status"]
