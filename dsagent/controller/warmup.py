"""Copies the Dataset controller asks agents to hold: warm-up (``spec.warm``) and replicas of
hot data (``spec.replicas``, docs/design.md#replication).

Who calls it: :meth:`dsagent.controller.reconcile.DatasetController.reconcile`, per Dataset.

- warm-up (``spec.warm``: ``nodes: N`` or ``nodeSelector``, optional ``startTime``): nodes are
  picked (those already holding the dataset, then the most free cache bytes; earlier picks
  are kept), each node's agent is asked to cache the dataset as task
  ``warm.<namespace>.<name>`` (renewed each resync so its lease never lapses and the copy
  is protected from eviction), and the task is released on nodes no longer picked or when
  ``spec.warm`` goes. ``status.warm`` reports what the agents say: ready nodes, bytes done
  and wanted per node - never "complete" before every byte is there.
- replicas (``auto`` or a number): a target of ready copies from the demand (pending pods
  naming the Dataset plus those started within ``DSAGENT_CONTROLLER_REPLICAS_WINDOW``), held
  on nodes with room and free GPUs as task ``replica.<namespace>.<name>``
  (:mod:`dsagent.policy.replication` chooses); nodes no longer chosen are released when the
  target falls. ``status.replicas`` shows the demand, target and actual copies.

Both are held to the tenancy bounds (docs/operator-guide/tenancy.md, :mod:`dsagent.controller.quotas`):
at most ``warm_nodes_max`` nodes and ``replicas_max`` copies whatever the spec says, and
each node admitted by the namespace's ledger (its share of the node, its bytes and tasks in
the cluster); each bound that held a field back is added to ``refusals``, which the caller
reports as the Dataset's ``Refused`` condition and an Event.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from dsagent.controller.agents import JSON, AgentCall, hold_on, release
from dsagent.controller.podfacts import demand, free_gpus
from dsagent.controller.quotas import Admit, Refusal, capped
from dsagent.policy import replication
from dsplatform.kubetime import parse_or_none
from dsplatform.tenancy import acting_for


def warm_task_id(namespace: str, name: str) -> str:
    return f"warm.{namespace}.{name}"


def _label_match(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def warm_status(
    namespace: str,
    name: str,
    spec: JSON,
    warm: JSON | None,
    previous: JSON,
    nodes: list[JSON],
    inventories: Mapping[str, Mapping[str, Any]],
    *,
    agent_call: AgentCall,
    agent_nodes: Collection[str],
    now: float,
    max_nodes: int = 8,
    admit: Admit = lambda node: True,
    refusals: list[Refusal] | None = None,
) -> JSON:
    """The Dataset's ``status.warm``, after asking (or releasing) the agents."""
    task = warm_task_id(namespace, name)
    who = acting_for(namespace, name)
    before = [str(n.get("node")) for n in previous.get("nodes") or [] if isinstance(n, dict)]
    start = parse_or_none(warm.get("startTime")) if warm else None
    if warm is None or (start is not None and start > now):
        release(agent_call, task, before, who)
        return {
            "state": "Waiting" if warm is not None else "Off",
            "nodes": [],
            "readyNodes": 0,
            "desiredNodes": 0,
            "bytesDone": 0,
            "bytesWanted": 0,
        }
    chosen = choose_warm_nodes(
        name, warm, before, nodes, inventories, agent_nodes, max_nodes=max_nodes, admit=admit, refusals=refusals
    )
    reports = hold_on(agent_call, task, who, name, spec, before, chosen)
    ready = sum(1 for r in reports if r["state"] == "ready")
    desired = len(chosen)
    return {
        "state": "Ready" if desired and ready == desired else "Warming",
        "desiredNodes": desired,
        "readyNodes": ready,
        "nodes": reports,
        "bytesDone": sum(r["bytesDone"] for r in reports),
        "bytesWanted": sum(r["bytesWanted"] for r in reports),
    }


def choose_warm_nodes(
    name: str,
    warm: JSON,
    before: list[str],
    nodes: list[JSON],
    inventories: Mapping[str, Mapping[str, Any]],
    agent_nodes: Collection[str],
    *,
    max_nodes: int = 8,
    admit: Admit = lambda node: True,
    refusals: list[Refusal] | None = None,
) -> list[str]:
    """The nodes to warm: every selected one, or ``nodes: N`` of them, earlier picks first,
    then those holding the dataset, then the most free cache bytes; at most ``max_nodes``,
    each one ``admit``-ted (the namespace's bounds), a bound that held it back in ``refusals``."""
    selector = warm.get("nodeSelector") if isinstance(warm.get("nodeSelector"), dict) else None
    eligible = [
        (n.get("metadata") or {}).get("name", "")
        for n in nodes
        if (selector is None or _label_match(selector, (n.get("metadata") or {}).get("labels") or {}))
        and (n.get("metadata") or {}).get("name") in agent_nodes
    ]
    wanted = warm.get("nodes")
    if isinstance(wanted, int) and not isinstance(wanted, bool):
        count, what = max(0, wanted), "spec.warm.nodes"
    elif selector is not None:
        count, what = len(eligible), f"spec.warm.nodeSelector (matching {len(eligible)} nodes)"
    else:
        count, what = 1, "spec.warm"
    count, refusal = capped(count, max_nodes, "WarmNodesOverLimit", what)
    if refusal is not None and refusals is not None:
        refusals.append(refusal)

    def rank(node: str) -> tuple[int, int, int, str]:
        inv = inventories.get(node) or {}
        holds = name in (inv.get("datasets") or {})
        given = inv.get("freeBytes")
        free = given if isinstance(given, int) else 0
        return (0 if node in before else 1, 0 if holds else 1, -free, node)

    picked: list[str] = []
    for node in sorted(eligible, key=rank):
        if len(picked) >= count:
            break
        if admit(node):
            picked.append(node)
    return sorted(picked)


def replicas_status(
    namespace: str,
    name: str,
    spec: JSON,
    status: JSON,
    mode: str | int | None,
    ready: list[str],
    inventories: Mapping[str, Mapping[str, Any]],
    *,
    agent_call: AgentCall,
    agent_nodes: Collection[str],
    nodes: list[JSON],
    pods: Callable[[], list[JSON]],
    now: Callable[[], float],
    window_s: float,
    gpus: Callable[[], Mapping[str, int]] | None = None,
    max_auto: int,
    admit: Admit = lambda node: True,
    refusals: list[Refusal] | None = None,
) -> JSON:
    """The Dataset's ``status.replicas``, after asking (or releasing) the agents; ``pods`` lists
    the cluster's pods (at most once per pass, by the caller), ``gpus`` gives the nodes' free
    GPUs (likewise; by default worked out here from ``nodes`` and the pods). ``max_auto`` caps the copies
    of ``auto`` and of a number alike (a number over it is a refusal)."""
    task = f"replica.{namespace}.{name}"
    who = acting_for(namespace, name)
    previous = status.get("replicas") or {}
    before = [str(n.get("node")) for n in previous.get("nodes") or [] if isinstance(n, dict)]
    if mode is None:  # spec.replicas removed: release every copy it held
        release(agent_call, task, before, who)
        return {"mode": "off", "demand": 0, "target": 0, "actual": len(ready), "nodes": []}
    listed = pods()
    wanted = demand(listed, namespace, name, now=now(), window_s=window_s)
    goal = replication.target(mode, wanted, max_auto=max_auto)
    goal, refusal = capped(goal, max_auto, "ReplicasOverLimit", "spec.replicas")
    if refusal is not None and refusals is not None:
        refusals.append(refusal)
    free_now = gpus() if gpus is not None else free_gpus(nodes, listed)
    holding = set(ready)
    rooms = []
    for node in sorted(agent_nodes):
        given = (inventories.get(node) or {}).get("freeBytes")
        free = given if isinstance(given, int) and not isinstance(given, bool) else 0
        rooms.append(replication.NodeRoom(node, node in holding, free, free_now.get(node, 0)))
    given_size = status.get("bytes")
    size = given_size if isinstance(given_size, int) and not isinstance(given_size, bool) else 0
    chosen = replication.choose(rooms, goal, size_bytes=size, before=before, admit=admit)
    reports = hold_on(agent_call, task, who, name, spec, before, chosen)
    return {
        "mode": mode,
        "demand": wanted,
        "target": goal,
        "actual": len(ready),
        "desiredNodes": len(chosen),
        "nodes": reports,
    }


__all__ = ["choose_warm_nodes", "replicas_status", "warm_status", "warm_task_id"]
