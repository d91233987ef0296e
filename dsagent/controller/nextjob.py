"""Next-job preparation by the Dataset controller (``DSAGENT_CONTROLLER_PREPARE=on``,
docs/design.md#next-job-preparation): each pass, find the next jobs, plan, ask the agents,
release what the plan dropped.

Who calls it: :meth:`dsagent.controller.reconcile.DatasetController.reconcile_all`, once per
pass. The next jobs come from what the cluster knows first (:mod:`dsagent.controller.queues`:
a running pod's ``dsagent.io/next-job`` names the job that follows it on its node; Kueue
Workloads or Volcano Jobs give the queue's order), the replay of the queue
(:func:`dsagent.policy.preparation.plan`) places the rest, labelled ``prediction``; inputs
read from the pods, Nodes and Datasets by :mod:`dsagent.controller.podfacts`. Each
preparation is put on its node's agent as ``PUT /v1/preparations/<pod UID>`` (phase 1: the
agent reads the manifests and reserves space; phase 2: the bulk fetch, which the agent
holds back above the second threshold), renewed each pass; one the plan drops (the pod was
bound, deleted, or is now placed elsewhere) is deleted at once, so its data is an eviction
candidate. The pod's own request hands the preparation over (the agent's start check).
The ledger lives in the Datasets' status (each entry with its source), so a new leader
releases what the old one asked; each preparation is also an Event on its pod.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dsagent.controller.agents import JSON, AgentCall, on_each, task_request
from dsagent.controller.controllermetrics import ControllerMetrics
from dsagent.controller.podfacts import node_states, running_pods, waiting_pods
from dsagent.controller.queues import Queues, follow_up_namespaces, followers, queue_places
from dsagent.controller.quotas import Ledger
from dsagent.policy.preparation import Preparation, Thresholds, plan
from dsplatform.kubetime import format_micro_time
from dsplatform.tenancy import acting_for

#: what each source means, in status and Events
SOURCES = {
    "annotation": "named by the running pod (dsagent.io/next-job)",
    "kueue": "Kueue's queue, placed by replaying it",
    "volcano": "Volcano's queue, placed by replaying it",
    "prediction": "predicted by replaying the pending pods in creation order",
}

#: ``(pod, reason, note)``: tell a pod's owner (an Event on the pod)
PodEvent = Callable[[Mapping[str, Any], str, str], None]


def preparation_path(pod_uid: str) -> str:
    """The agent's preparation of a waiting pod (docs/design.md#next-job-preparation)."""
    return f"/v1/preparations/{pod_uid}"


def pods_to_prepare(
    nodes: Sequence[JSON],
    datasets: Sequence[JSON],
    *,
    named_only: bool,
    listed: Sequence[JSON] | None,
    every_pod: Callable[[], list[JSON]],
    namespace_pods: Callable[[str], list[JSON]],
) -> list[JSON] | None:
    """The pods a pass's preparation reads; None: nothing to prepare or release. Every pod
    (``every_pod``), unless it prepares only named follow-ups (``named_only``, the default
    ``auto``): then the pods of the namespaces whose running pods name one
    (:func:`~dsagent.controller.queues.follow_up_namespaces`, from the Nodes), taken from
    the pods the pass has ``listed`` anyway, else listed per namespace; none while no pod
    names one and no Dataset lists a preparation to release."""
    if not named_only:
        return every_pod()
    namespaces = follow_up_namespaces(nodes)
    if not namespaces:
        return [] if any(_prepared(d) for d in datasets) else None
    if listed is not None:
        wanted = set(namespaces)
        return [p for p in listed if (p.get("metadata") or {}).get("namespace") in wanted]
    return [pod for ns in namespaces for pod in namespace_pods(ns)]


def _prepared(dataset: JSON) -> bool:
    """Whether a Dataset's status lists pods prepared for (to release once none is named)."""
    status = dataset.get("status")
    preparation = status.get("preparation") if isinstance(status, dict) else None
    return isinstance(preparation, dict) and bool(preparation.get("pods"))


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
    queues: Queues | None = None,
    pod_event: PodEvent | None = None,
    named_only: bool = False,
) -> dict[tuple[str, str], JSON]:
    """Find the next jobs, plan, ask the agents, release what the plan dropped; the status
    per Dataset. A phase-2 ask is charged to its namespace in ``ledger``; past the
    namespace's bounds (docs/operator-guide/tenancy.md) it stays in phase 1 (state ``refused``).
    ``named_only`` (the default install's ``auto``): only the pods a running pod names as
    its follow-up are prepared, on that pod's node; no other pod is predicted."""
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
    asked = {(e["uid"], e["node"]) for e, _ in previous if e.get("state") not in ("skipped", None)}
    fetched = {(e["uid"], e["node"]) for e, _ in previous if e.get("phase") == 2}
    asked_for = {(e["uid"], e["node"]): who for e, who in previous}  # the Dataset each was asked for
    waiting = waiting_pods(pods, by_key, queue_places(pods, queues or Queues()))
    known = followers(running_pods(pods), (pod for _, pod in waiting))
    if named_only:
        waiting = [(w, pod) for w, pod in waiting if w.key in known]
    pod_of = {w.key: pod for w, pod in waiting}
    preps = plan(
        node_states(nodes, pods, inventories),
        [w for w, _ in waiting],
        now=now(),
        thresholds=presets,
        fetching=fetched,
        known=known,
    )
    out: dict[tuple[str, str], JSON] = {}
    fetching: set[tuple[str, str]] = set()
    asks = []  # the phase each is asked in: charged to the ledger in the plan's order
    for prep in preps:
        namespace = (pod_of[prep.job].get("metadata") or {}).get("namespace") or "default"
        phase = prep.phase
        if phase == 2:
            size = sum(want.size_bytes for want in prep.datasets)
            if ledger is not None and not ledger.admitter(namespace, size)(prep.node):
                phase = 1  # the namespace's share of the node (docs/operator-guide/tenancy.md)
        asks.append((prep, namespace, phase))
    # the agents asked together (one node's round trip does not wait for another's)
    answers = on_each(lambda ask: _ask_to_prepare(agent_call, ask[0], ask[2], ask[1], by_key, presets), asks)
    for (prep, namespace, phase), (state, agent_phase) in zip(asks, answers):
        pod = pod_of[prep.job]
        if phase < prep.phase and state != "skipped":
            state = "refused"
        if state != "skipped":
            fetching.add((prep.job, prep.node))  # still planned there: not released
        if pod_event is not None and state != "skipped":
            names = ",".join(w.name for w in prep.datasets)
            pod_event(
                pod,
                "Preparing",
                f"{names} prepared on node {prep.node}: phase {agent_phase}, {state}; next job {SOURCES[prep.source]}",
            )
        for want in prep.datasets:
            entry = out.setdefault((namespace, want.name), {"reservedBytes": 0, "fetchingBytes": 0, "pods": []})
            entry["reservedBytes"] += want.size_bytes
            if agent_phase == 2:
                entry["fetchingBytes"] += want.size_bytes
            entry["pods"].append(
                {
                    "pod": f"{namespace}/{(pod.get('metadata') or {}).get('name', '')}",
                    "uid": prep.job,
                    "node": prep.node,
                    "phase": agent_phase,
                    "state": state,
                    "source": prep.source,
                    "expectedStart": format_micro_time(prep.start),
                }
            )
    released = sorted(asked - fetching)  # cleanup: at once an eviction candidate
    on_each(lambda gone: agent_call(gone[1], "DELETE", preparation_path(gone[0]), None, asked_for[gone]), released)
    metrics.preparation_releases.inc(len(released))
    phases = [p["phase"] for entry in out.values() for p in entry["pods"]]
    metrics.preparations.labels(phase="1").set(phases.count(1))
    metrics.preparations.labels(phase="2").set(phases.count(2))
    return out


def _ask_to_prepare(
    agent_call: AgentCall,
    prep: Preparation,
    phase: int,
    namespace: str,
    by_key: Mapping[tuple[str, str], JSON],
    presets: Thresholds,
) -> tuple[str, int]:
    """Put the preparation on its node's agent: its state there and the phase it is in
    (the agent holds phase 2 back while the second threshold marks it)."""
    requests = []
    for want in prep.datasets:
        spec = (by_key.get((namespace, want.name)) or {}).get("spec") or {}
        if not isinstance(spec.get("source"), str) or not isinstance(spec.get("bundles"), str):
            return "skipped", 1  # only packed datasets are prepared (the agent reads their manifests)
        if spec.get("storageSecretRef"):
            return "skipped", 1  # a Secret's options reach only the pod's own request (rule 5)
        requests.append(task_request(want.name, spec))
    who = acting_for(namespace, prep.datasets[0].name)  # a pod's datasets are all of its namespace
    body = {
        "datasets": requests,
        "phase": phase,
        "firstThreshold": presets.reserve_fraction,
        "secondThreshold": presets.fill_fraction,
    }
    answer = agent_call(prep.node, "PUT", preparation_path(prep.job), body, who)
    return preparation_report(answer)


def preparation_report(answer: tuple[int, Any] | None) -> tuple[str, int]:
    """An agent's answer about a preparation (hostile input): its state and phase, never more."""
    if answer is None:
        return "unreachable", 1
    code, body = answer
    if code != 200 or not isinstance(body, dict):
        return "failed", 1
    state = body.get("state")
    phase = body.get("phase")
    known = ("reserved", "waiting", "fetching", "prepared", "failed")
    return (state if state in known else "unknown"), (phase if phase in (1, 2) else 1)


def _dataset_ref(ds: Mapping[str, Any]) -> str:
    meta = ds.get("metadata") or {}
    return acting_for(str(meta.get("namespace") or "default"), str(meta.get("name", "")))


__all__ = ["SOURCES", "PodEvent", "preparation_path", "preparation_report", "prepare_pass"]
