"""What agents still hold for Datasets that are gone, released within one pass
(docs/operator-guide/tenancy.md).

Who calls it: :meth:`dsagent.controller.reconcile.DatasetController.reconcile_all`, once per
pass, after every listed Dataset was reconciled. The warm-up, replica and preparation steps
release what a Dataset's spec no longer asks for, but they walk only the Datasets that exist:
a deleted Dataset's ``warm.<namespace>.<name>`` and ``replica.<namespace>.<name>`` tasks and
its next-job preparations (``prepare.<pod UID>``) would stay pinned, held against eviction
and outside any namespace's ledger, until the agents' leases lapse (6 h). So the pass asks
agents (the admin token, a read that acts for no Dataset) for their tasks and their
preparations and releases, with the Dataset they were asked for named in ``X-Dsagent-For``,
those the controller asked for a Dataset no longer listed.

Which agents a pass asks (:class:`GoneSweep`): every one when a Dataset listed since the last
sweep is no longer listed, on the first pass (of this process, or since it last led: what
went meanwhile is unknown to it) and after the agents could not be read; otherwise only
the agents new since the last pass, those whose answer or release failed, and one
:data:`RESYNC_PASSES`-th of the others in turn (each agent at least every
:data:`RESYNC_PASSES` passes: a backstop for what no deletion explains, such as a task an
operator made by hand under a gone Dataset's id). A Dataset's deletion is seen by the next
pass, which asks every agent: its pins go within one pass, as when every agent was asked
each pass, without two reads of each of thousands of agents in every pass.

Which are the controller's: a task ``warm.<namespace>.<name>`` or
``replica.<namespace>.<name>`` (the Dataset is in the id), a ``prepare.<pod UID>`` task and a
preparation that the agent says act for a namespace (the Datasets are that namespace's,
by their dataset names). A task or a preparation is released when none of its Datasets
exists. A pod's own task, and anything an operator asked by hand without naming a
Dataset, is never touched. The answers are another party's JSON, read through
:func:`dsplatform.wire.agenttask.read_task_list` and :func:`read_preparations`.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dsagent.controller.agents import AgentCall, on_each, task_path
from dsagent.controller.controllermetrics import ControllerMetrics
from dsagent.controller.nextjob import preparation_path
from dsplatform.tenancy import acting_for, parse_acting_for
from dsplatform.wire.agenttask import MAX_DATASETS, TaskHeld, read_task_list

log = logging.getLogger("dsagent.controller")

#: the task kinds whose id names their Dataset: ``<kind>.<namespace>.<name>``
NAMED_KINDS = ("warm", "replica")
PREPARE = "prepare"
#: the longest preparation id (a pod UID) and dataset name a reader keeps
_NAME_MAX = 320
#: every agent is asked at least once in this many passes, even when no Dataset went
RESYNC_PASSES = 20


@dataclass(frozen=True)
class Held:
    """Something an agent holds for the controller: where to release it, and for whom."""

    kind: str  # warm, replica or prepare
    path: str  # the agent route that releases it
    namespace: str
    names: tuple[str, ...]  # the Datasets (of ``namespace``) it was asked for


def held_for(task: TaskHeld) -> Held | None:
    """What the controller holds in agent task ``task``; None when it is not one of its own."""
    kind, dot, rest = task.task.partition(".")
    if not dot:
        return None
    if kind in NAMED_KINDS:
        dataset = parse_acting_for(rest.replace(".", "/", 1))  # <namespace>.<name>: no dot in a namespace
        if dataset is None:
            return None
        return Held(kind, task_path(task.task), dataset[0], (dataset[1],))
    if kind == PREPARE and rest and task.namespace is not None and task.names:
        return Held(PREPARE, preparation_path(rest), task.namespace, task.names)  # its preparation holds it
    return None


def read_preparations(body: Any) -> list[Held]:
    """The preparations of an agent's ``GET /v1/preparations`` answer that act for a
    namespace, as far as they can be read (entries of another shape are skipped)."""
    items = body.get("preparations") if isinstance(body, Mapping) else None
    held = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, Mapping):
            continue
        uid, namespace, requested = item.get("task"), item.get("namespace"), item.get("requested")
        if not isinstance(uid, str) or not uid or len(uid) > _NAME_MAX or not isinstance(namespace, str):
            continue
        names = tuple(
            n for n in (requested if isinstance(requested, list) else [])[:MAX_DATASETS] if isinstance(n, str) and n
        )
        if names:
            held.append(Held(PREPARE, preparation_path(uid), namespace, names))
    return held


def release_gone(
    agent_call: AgentCall,
    nodes: Iterable[str],
    datasets: Collection[tuple[str, str]],
    *,
    metrics: ControllerMetrics | None = None,
    unfinished: set[str] | None = None,
) -> list[tuple[str, str]]:
    """Release, on each of ``nodes``, what its agent holds for the controller for a Dataset
    not among ``datasets`` (``(namespace, name)`` of every Dataset listed this pass); the
    ``(node, path)`` of each release asked for. ``unfinished`` gets the nodes whose agent
    could not be read or did not take a release (to be asked again). :data:`~dsagent.controller.agents.AGENTS_AT_ONCE`
    agents are asked at a time (``agent_call`` must be thread-safe, as the controller's is): a
    pass that asks every agent makes two requests of each, and one agent after another took
    30 s at 15,000 nodes answering in 1 ms, minutes with some of them unreachable."""
    ordered = sorted(nodes)
    answers = on_each(lambda node: _release_on(agent_call, node, datasets, metrics), ordered)
    released = []
    for node, (done, finished) in zip(ordered, answers, strict=True):
        released += [(node, path) for path in done]
        if not finished and unfinished is not None:
            unfinished.add(node)
    return released


def _release_on(
    agent_call: AgentCall, node: str, datasets: Collection[tuple[str, str]], metrics: ControllerMetrics | None
) -> tuple[list[str], bool]:
    """:func:`release_gone` on one node: the paths released, and whether its agent was read
    and took every release."""
    found = _held_on(agent_call, node)
    if found is None:
        return [], False
    gone: dict[str, Held] = {}
    for held in found:
        if any((held.namespace, name) in datasets for name in held.names):
            continue
        who = acting_for(held.namespace, held.names[0])
        if parse_acting_for(who) is None:  # not a Dataset's name: nothing the agent would take
            continue
        gone.setdefault(held.path, held)
    released, finished = [], True
    for path, held in sorted(gone.items()):
        who = acting_for(held.namespace, held.names[0])
        answer = agent_call(node, "DELETE", path, None, who)
        log.info(
            "released %s on node %s: its Dataset %s is gone (agent answered %s)",
            path,
            node,
            who,
            answer[0] if answer is not None else "nothing",
        )
        if metrics is not None:
            metrics.gone_releases.labels(kind=held.kind).inc()
        released.append(path)
        finished = finished and answer is not None and (200 <= answer[0] < 300 or answer[0] == 404)
    return released, finished


def _held_on(agent_call: AgentCall, node: str) -> list[Held] | None:
    """What the agent on ``node`` holds for the controller: its tasks, then its preparations
    (None: one of the two could not be read; what the other listed is still released)."""
    held: list[Held] = []
    read = True
    tasks = agent_call(node, "GET", "/v1/tasks", None, "")
    if tasks is not None and tasks[0] == 200:
        held += [h for h in map(held_for, read_task_list(tasks[1])) if h is not None]
    else:
        read = False
    preparations = agent_call(node, "GET", "/v1/preparations", None, "")
    if preparations is not None and preparations[0] == 200:
        held += read_preparations(preparations[1])
    else:
        read = False
    return held if read else None


class GoneSweep:
    """Which agents each pass asks (the module docstring): one per controller, across its
    passes. :meth:`listed` with the Datasets a pass lists, before it acts on any; then
    :meth:`run`; :meth:`forget` when the controller stops leading."""

    def __init__(self, resync_passes: int = RESYNC_PASSES) -> None:
        self.resync_passes = max(1, resync_passes)
        self._seen: set[tuple[str, str]] | None = None  # listed since the last sweep; None: ask every agent
        self._agents: set[str] = set()  # the agents of the last sweep
        self._retry: set[str] = set()  # agents whose answer or release failed
        self._turn = 0

    def forget(self) -> None:
        """What went since is unknown: the next pass asks every agent."""
        self._seen = None

    def listed(self, datasets: Iterable[tuple[str, str]]) -> None:
        """The Datasets a pass listed (each one the agents may be asked to hold for from now)."""
        if self._seen is not None:
            self._seen.update(datasets)

    def due(self, nodes: Collection[str], datasets: Collection[tuple[str, str]]) -> set[str]:
        """The agents to ask this pass, of ``nodes``, with ``datasets`` listed."""
        if self._seen is None or not self._seen <= set(datasets):
            return set(nodes)
        turn, every = self._turn % self.resync_passes, self.resync_passes
        return {
            node
            for node in nodes
            if node not in self._agents or node in self._retry or zlib.crc32(node.encode()) % every == turn
        }

    def run(
        self,
        agent_call: AgentCall,
        nodes: Collection[str],
        datasets: Collection[tuple[str, str]],
        *,
        metrics: ControllerMetrics | None = None,
    ) -> list[tuple[str, str]]:
        """:func:`release_gone` on the agents due this pass (:meth:`due`)."""
        asked = self.due(nodes, datasets)
        failed: set[str] = set()
        try:
            released = release_gone(agent_call, asked, datasets, metrics=metrics, unfinished=failed)
        except BaseException:
            self._seen = None  # cut short: ask every agent next pass
            raise
        self._retry = (self._retry - asked) | failed
        self._agents = set(nodes)
        self._seen = set(datasets)
        self._turn += 1
        return released


__all__ = ["RESYNC_PASSES", "GoneSweep", "Held", "held_for", "read_preparations", "release_gone"]
