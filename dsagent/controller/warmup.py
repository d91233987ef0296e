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

from collections.abc import Callable, Collection, Mapping, Sequence
from itertools import chain
from typing import Any

from dsagent.controller.agents import JSON, AgentCall, Request, hold_on, hold_requests, release
from dsagent.controller.podfacts import demand, free_gpus
from dsagent.controller.quotas import Admit, Refusal, capped
from dsagent.policy import replication
from dsplatform.kubetime import parse_or_none
from dsplatform.tenancy import acting_for


def warm_task_id(namespace: str, name: str) -> str:
    return f"warm.{namespace}.{name}"


def replica_task_id(namespace: str, name: str) -> str:
    return f"replica.{namespace}.{name}"


def renewals(datasets: Sequence[JSON], agent_nodes: Collection[str], now: float) -> list[Request]:
    """The renewals a pass will send: the task of each Dataset's warm-up and replicas, put
    again on the agent nodes its status lists (:func:`warm_status` and
    :func:`replicas_status` ask every node they keep, every pass, with these very requests),
    for :class:`~dsagent.controller.agents.PassCalls` to send together before the Datasets
    are reconciled one after another. A Dataset whose warm-up waits for its start, or that
    lost the field, is left out: its pass releases, it does not renew."""
    out: list[Request] = []
    for ds in datasets:
        meta, spec, status = ds.get("metadata") or {}, ds.get("spec") or {}, ds.get("status") or {}
        if not isinstance(meta, dict) or not isinstance(spec, dict) or not isinstance(status, dict):
            continue
        namespace, name = meta.get("namespace", "default"), meta.get("name", "")
        kept = []
        warm = spec.get("warm")
        if isinstance(warm, dict) and _started(warm, now):
            kept.append((warm_task_id(namespace, name), status.get("warm")))
        if replication.parse_mode(spec.get("replicas")) is not None:
            kept.append((replica_task_id(namespace, name), status.get("replicas")))
        for task, previous in kept:
            entries = previous.get("nodes") if isinstance(previous, dict) else None
            nodes = [str(e.get("node")) for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
            out += hold_requests(task, acting_for(namespace, name), name, spec, [n for n in nodes if n in agent_nodes])
    return out


def _started(warm: JSON, now: float) -> bool:
    """Whether a ``spec.warm`` holds its nodes now: its start, if it names one, reached."""
    start = parse_or_none(warm.get("startTime"))
    return start is None or start <= now


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
    ranking: Callable[[], WarmRanking] | None = None,
    listing: Mapping[str, Mapping[str, Any]] | None = None,
) -> JSON:
    """The Dataset's ``status.warm``, after asking (or releasing) the agents; ``ranking`` and
    ``listing`` as :func:`choose_warm_nodes` takes them (``ranking`` asked only when nodes are
    chosen)."""
    task = warm_task_id(namespace, name)
    who = acting_for(namespace, name)
    before = [str(n.get("node")) for n in previous.get("nodes") or [] if isinstance(n, dict)]
    if warm is None or not _started(warm, now):
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
        name,
        warm,
        before,
        nodes,
        inventories,
        agent_nodes,
        max_nodes=max_nodes,
        admit=admit,
        refusals=refusals,
        ranking=ranking() if ranking is not None else None,
        listing=listing,
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


class WarmRanking:
    """The agent nodes (of ``nodes``, with their labels) in warm-up's order of the rest: most
    free cache bytes first, then by name; built once a pass, so each warm Dataset walks it
    only as far as it picks instead of sorting every node (:func:`choose_warm_nodes`)."""

    def __init__(
        self, nodes: list[JSON], inventories: Mapping[str, Mapping[str, Any]], agent_nodes: Collection[str]
    ) -> None:
        self.labels: dict[str, Mapping[str, Any]] = {}
        for n in nodes:
            meta = n.get("metadata") or {}
            if meta.get("name") in agent_nodes:
                self.labels.setdefault(meta.get("name", ""), meta.get("labels") or {})
        self.free = {node: _free_bytes(inventories, node) for node in self.labels}
        self.order = sorted(self.labels, key=lambda node: (-self.free[node], node))
        self._everyone = (self.order, set(self.order))
        self._selected: dict[Any, tuple[list[str], set[str]]] = {}

    def eligible(self, selector: Mapping[str, Any] | None) -> tuple[list[str], set[str]]:
        """The nodes ``selector`` matches (every one for None), in this order and as a set."""
        if selector is None:
            return self._everyone
        try:
            key: Any = tuple(sorted(selector.items()))
            hash(key)
        except TypeError:  # a value that is not hashable (no label has it): not remembered
            key = None
        found = self._selected.get(key) if key is not None else None
        if found is None:
            names = [node for node in self.order if _label_match(selector, self.labels[node])]
            found = (names, set(names))
            if key is not None:
                self._selected[key] = found
        return found


def _free_bytes(inventories: Mapping[str, Mapping[str, Any]], node: str) -> int:
    given = (inventories.get(node) or {}).get("freeBytes")
    return given if isinstance(given, int) else 0


def _holds(inventory: Mapping[str, Any] | None, name: str) -> bool:
    return name in ((inventory or {}).get("datasets") or {})


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
    ranking: WarmRanking | None = None,
    listing: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[str]:
    """The nodes to warm: every selected one, or ``nodes: N`` of them, earlier picks first,
    then those holding the dataset, then the most free cache bytes; at most ``max_nodes``,
    each one ``admit``-ted (the namespace's bounds), a bound that held it back in ``refusals``.

    ``ranking``: :class:`WarmRanking` of these ``nodes``, ``inventories`` and ``agent_nodes``
    when the caller keeps one for the pass; ``listing``: the inventories that list ``name``
    (:meth:`dsagent.controller.inventories.DatasetIndex.listing`), else every inventory is
    read. The nodes are asked in that order until enough are admitted, or until ``admit`` is
    :meth:`~dsagent.controller.quotas.Admitter.closed` (no node can be admitted any more)."""
    selector = warm.get("nodeSelector") if isinstance(warm.get("nodeSelector"), dict) else None
    ranking = ranking if ranking is not None else WarmRanking(nodes, inventories, agent_nodes)
    order, eligible = ranking.eligible(selector)
    wanted = warm.get("nodes")
    if isinstance(wanted, int) and not isinstance(wanted, bool):
        count, what = max(0, wanted), "spec.warm.nodes"
    elif selector is not None:
        count, what = len(order), f"spec.warm.nodeSelector (matching {len(order)} nodes)"
    else:
        count, what = 1, "spec.warm"
    count, refusal = capped(count, max_nodes, "WarmNodesOverLimit", what)
    if refusal is not None and refusals is not None:
        refusals.append(refusal)
    if count <= 0:
        return []
    free = ranking.free
    earlier = {node for node in before if node in eligible}
    listed = listing if listing is not None else inventories
    holders = {node for node, inv in listed.items() if node in eligible and node not in earlier and _holds(inv, name)}
    firsts = sorted(earlier, key=lambda node: (0 if _holds(inventories.get(node), name) else 1, -free[node], node))
    seconds = sorted(holders, key=lambda node: (-free[node], node))
    rest = (node for node in order if node not in earlier and node not in holders)
    closed = getattr(admit, "closed", None)  # an Admitter's: no node can be admitted any more
    picked: list[str] = []
    for node in chain(firsts, seconds, rest):
        if admit(node):
            picked.append(node)
            if len(picked) >= count:
                break
        elif closed is not None and closed():
            break
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
    ranked: Callable[[], replication.Ranked] | None = None,
    pods_by_dataset: Callable[[], Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]] | None = None,
) -> JSON:
    """The Dataset's ``status.replicas``, after asking (or releasing) the agents; ``pods`` lists
    the cluster's pods (at most once per pass, by the caller), ``gpus`` gives the nodes' free
    GPUs (likewise; by default worked out here from ``nodes`` and the pods). ``max_auto`` caps the copies
    of ``auto`` and of a number alike (a number over it is a refusal). ``ranked`` and
    ``pods_by_dataset``, when the caller keeps them for the pass: the agent nodes' rooms
    (:func:`replica_rooms`) and the pods by the Datasets they name
    (:func:`~dsagent.controller.podfacts.pods_by_dataset`), else worked out here."""
    task = replica_task_id(namespace, name)
    who = acting_for(namespace, name)
    previous = status.get("replicas") or {}
    before = [str(n.get("node")) for n in previous.get("nodes") or [] if isinstance(n, dict)]
    if mode is None:  # spec.replicas removed: release every copy it held
        release(agent_call, task, before, who)
        return {"mode": "off", "demand": 0, "target": 0, "actual": len(ready), "nodes": []}
    if pods_by_dataset is not None:
        wanted = demand(pods_by_dataset().get((namespace, name), ()), namespace, name, now=now(), window_s=window_s)
    else:
        wanted = demand(pods(), namespace, name, now=now(), window_s=window_s)
    goal = replication.target(mode, wanted, max_auto=max_auto)
    goal, refusal = capped(goal, max_auto, "ReplicasOverLimit", "spec.replicas")
    if refusal is not None and refusals is not None:
        refusals.append(refusal)
    if ranked is not None:
        rooms = ranked()
    else:
        rooms = replica_rooms(agent_nodes, inventories, gpus() if gpus is not None else free_gpus(nodes, pods()))
    given_size = status.get("bytes")
    size = given_size if isinstance(given_size, int) and not isinstance(given_size, bool) else 0
    chosen = replication.choose_ranked(
        rooms, ready, goal, size_bytes=size, before=before, admit=admit, closed=getattr(admit, "closed", None)
    )
    reports = hold_on(agent_call, task, who, name, spec, before, chosen)
    return {
        "mode": mode,
        "demand": wanted,
        "target": goal,
        "actual": len(ready),
        "desiredNodes": len(chosen),
        "nodes": reports,
    }


def replica_rooms(
    agent_nodes: Collection[str], inventories: Mapping[str, Mapping[str, Any]], free_now: Mapping[str, int]
) -> replication.Ranked:
    """Each agent node's room for a copy (its free cache bytes and free GPUs), ranked once for
    every Dataset with replicas (:class:`dsagent.policy.replication.Ranked`)."""
    rooms = []
    for node in agent_nodes:
        given = (inventories.get(node) or {}).get("freeBytes")
        free = given if isinstance(given, int) and not isinstance(given, bool) else 0
        rooms.append(replication.NodeRoom(node, False, free, free_now.get(node, 0)))
    return replication.Ranked(rooms)


__all__ = ["WarmRanking", "choose_warm_nodes", "replica_rooms", "replicas_status", "warm_status", "warm_task_id"]
