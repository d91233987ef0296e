"""Next-job preparation by the Dataset controller (``DSAGENT_CONTROLLER_PREPARE=on``,
docs/design.md#next-job-preparation): each pass, plan, ask the agents, release what the
plan dropped.

Who calls it: :meth:`dsagent.controller.reconcile.DatasetController.reconcile_all`, once per
pass. The pending pods that name Datasets are predicted onto the nodes whose running pods end
soonest (the policy: :func:`dsagent.cache.preparation.plan`; its inputs read from the pods,
Nodes and Datasets: :mod:`dsagent.controller.podfacts`). Phase 1 is a reservation in
``status.preparation`` (no node work); phase 2 asks the node's agent to cache the datasets
as task ``prepare.<pod UID>`` (renewed each pass, so the copy is protected while the pod
waits); a preparation the plan drops (the pod was bound, deleted, or is now predicted
elsewhere) has its task released at once, so its data is an eviction candidate. The pod's
own task takes over when it is bound there. The ledger lives in the Datasets' status, so a
new leader releases what the old one asked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dsagent.cache.preparation import Preparation, Thresholds, plan
from dsagent.controller.agents import JSON, AgentCall, task_report, task_request
from dsagent.controller.controllermetrics import ControllerMetrics
from dsagent.controller.podfacts import node_states, waiting_pods
from dsagent.controller.quotas import Ledger
from dsplatform.kubetime import format_micro_time
from dsplatform.tenancy import acting_for


def prepare_task_id(pod_uid: str) -> str:
    """The agent task that holds a waiting pod's prepared datasets (docs/design.md#next-job-preparation)."""
    return f"prepare.{pod_uid}"


def prepare_pass(
    nodes: list[JSON],
    inventories: Mapping[str, Mapping[str, Any]],
    datasets: list[JSON],
    presets: Thresholds,
    *,
    pods: list[JSON],
    now: Callable[[], float],
    agent_call: AgentCall,
    metrics: ControllerMetrics,
    ledger: Ledger | None = None,
) -> dict[tuple[str, str], JSON]:
    """Plan, ask the agents for phase 2, release what the plan dropped; the status per Dataset.
    A phase-2 ask is charged to its namespace in ``ledger`` and not made (state ``refused``)
    when it would pass the namespace's bounds (docs/tenancy.md)."""
    by_key = {
        ((d.get("metadata") or {}).get("namespace", "default"), (d.get("metadata") or {}).get("name", "")): d
        for d in datasets
    }
    previous = [
        (entry, _dataset_ref(d))
        for d in datasets
        for entry in (((d.get("status") or {}).get("preparation") or {}).get("pods") or [])
        if isinstance(entry, dict) and isinstance(entry.get("uid"), str) and isinstance(entry.get("node"), str)
    ]
    asked = {(e["uid"], e["node"]) for e, _ in previous if e.get("phase") == 2}
    asked_for = {(e["uid"], e["node"]): who for e, who in previous}  # the Dataset each was asked for
    waiting = waiting_pods(pods, by_key)
    pod_of = {w.key: pod for w, pod in waiting}
    preps = plan(
        node_states(nodes, pods, inventories),
        [w for w, _ in waiting],
        now=now(),
        thresholds=presets,
        fetching=asked,
    )
    out: dict[tuple[str, str], JSON] = {}
    fetching: set[tuple[str, str]] = set()
    for prep in preps:
        pod = pod_of[prep.job]
        namespace = (pod.get("metadata") or {}).get("namespace") or "default"
        state = "reserved"
        if prep.phase == 2:
            size = sum(want.size_bytes for want in prep.datasets)
            if ledger is None or ledger.admitter(namespace, size)(prep.node):
                state = _ask_to_prepare(agent_call, prep, namespace, by_key)
            else:
                state = "refused"  # the namespace's share of the node (docs/tenancy.md)
            if state not in ("skipped", "refused"):
                fetching.add((prep.job, prep.node))
        for want in prep.datasets:
            entry = out.setdefault((namespace, want.name), {"reservedBytes": 0, "fetchingBytes": 0, "pods": []})
            entry["reservedBytes"] += want.size_bytes
            if prep.phase == 2:
                entry["fetchingBytes"] += want.size_bytes
            entry["pods"].append(
                {
                    "pod": f"{namespace}/{(pod.get('metadata') or {}).get('name', '')}",
                    "uid": prep.job,
                    "node": prep.node,
                    "phase": prep.phase,
                    "state": state,
                    "expectedStart": format_micro_time(prep.start),
                }
            )
    for uid, node in sorted(asked - fetching):  # cleanup: at once an eviction candidate
        agent_call(node, "DELETE", f"/v1/tasks/{prepare_task_id(uid)}", None, asked_for[(uid, node)])
        metrics.preparation_releases.inc()
    metrics.preparations.labels(phase="1").set(sum(1 for p in preps if p.phase == 1))
    metrics.preparations.labels(phase="2").set(len(fetching))
    return out


def _ask_to_prepare(
    agent_call: AgentCall, prep: Preparation, namespace: str, by_key: Mapping[tuple[str, str], JSON]
) -> str:
    requests = []
    for want in prep.datasets:
        spec = (by_key.get((namespace, want.name)) or {}).get("spec") or {}
        if not isinstance(spec.get("source"), str) or spec.get("storageSecretRef"):
            return "skipped"  # a Secret's options reach only the pod's own request (rule 5)
        requests.append(task_request(want.name, spec))
    who = acting_for(namespace, prep.datasets[0].name)  # a pod's datasets are all of its namespace
    answer = agent_call(prep.node, "PUT", f"/v1/tasks/{prepare_task_id(prep.job)}", {"datasets": requests}, who)
    return str(task_report(prep.node, answer)["state"])


def _dataset_ref(ds: Mapping[str, Any]) -> str:
    meta = ds.get("metadata") or {}
    return acting_for(str(meta.get("namespace") or "default"), str(meta.get("name", "")))


__all__ = ["prepare_pass", "prepare_task_id"]
