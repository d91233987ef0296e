"""The Dataset controller's calls to the node agents: finding them, asking them to hold a
task's datasets, reading their answers, asking them to evict.

Who calls it: :class:`dsagent.controller.reconcile.DatasetController` (finding the agents,
cleanup) and its warm-up, replicas and preparation steps (:mod:`dsagent.controller.warmup`,
:mod:`dsagent.controller.nextjob`). Each agent is called over its TCP port with the admin
token (:class:`AgentHttp`: one client for the process); tests pass their own :data:`AgentCall`. Every call names the
Dataset it acts for (``X-Dsagent-For: namespace/name``, :mod:`dsplatform.tenancy`): the
agent logs and counts it, and scopes a cleanup's eviction to that namespace
(docs/operator-guide/tenancy.md). An agent's answer is hostile input: :func:`task_report` keeps its state
and byte counts, never more.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from dsagent.kube.apiclient import loads_list
from dsagent.kube.datasets import parse_stripe
from dsagent.kube.selectors import label_matcher
from dsagent.policy import replication
from dsplatform.kubetime import format_micro_time
from dsplatform.tenancy import ACTING_FOR_HEADER, acting_for
from dsplatform.wire.agenttask import MESSAGE_MAX, DatasetRequestBody, dataset_request, read_datasets
from dsplatform.wire.agenttask import task_request as wire_task_request

log = logging.getLogger("dsagent.controller")

T = TypeVar("T")
K = TypeVar("K")

#: agents asked at a time where a pass asks several (each call waits out one node's round
#: trip, so one slow or unreachable agent does not hold up the others for its timeout)
AGENTS_AT_ONCE = 32

JSON = dict[str, Any]
# (node, method, path, body, acting_for) -> (HTTP status, JSON answer); None when the node has
# no agent. ``acting_for``: the Dataset the request is for, "namespace/name" (docs/operator-guide/tenancy.md);
# "" for a read that acts for none (the task list the sweep of gone Datasets reads)
AgentCall = Callable[[str, str, str, "JSON | None", str], "tuple[int, Any] | None"]


#: ``resourceVersion`` of a pass's lists: served from the API server's watch cache, not read
#: from etcd at every pass (at thousands of nodes the Nodes, their caches and the pods are
#: tens of MB a pass); a pass acts on what it read through writes that check it (a gate is
#: lifted only from the pod version it read), and the next pass reads again
FROM_CACHE = "0"


def raw(call: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
    """An API call's answer as plain JSON (the client's models are not built); ``timeout``
    bounds the request (a hanging API server holds a pass no longer than that)."""
    extra = {"_request_timeout": timeout} if timeout is not None else {}
    return loads_list(call(*args, _preload_content=False, **extra).data)


def find_agents(core: Any, namespace: str, selector: str, port: int, timeout: float | None = None) -> dict[str, str]:
    """node -> the agent's base URL, from the agent DaemonSet's running pods, listed from the
    API server's watch cache (:data:`FROM_CACHE`)."""
    pods = raw(
        lambda **kw: core.list_namespaced_pod(namespace, label_selector=selector, resource_version=FROM_CACHE, **kw),
        timeout=timeout,
    )["items"]
    return _agent_urls(pods, port)


def every_pod(core: Any, timeout: float | None = None, *, namespace: str | None = None) -> list[JSON]:
    """Every pod of the cluster, or of ``namespace``, from the API server's watch cache
    (:data:`FROM_CACHE`)."""
    if namespace is None:
        list_fn = core.list_pod_for_all_namespaces
    else:
        list_fn = partial(core.list_namespaced_pod, namespace)
    items: list[JSON] = raw(lambda **kw: list_fn(resource_version=FROM_CACHE, **kw), timeout=timeout)["items"]
    return items


def agents_among(pods: Iterable[JSON], namespace: str, selector: str, port: int) -> dict[str, str] | None:
    """What :func:`find_agents` answers, from every pod of the cluster already listed: the pods of
    ``namespace`` that ``selector`` selects (:func:`dsagent.kube.selectors.label_matcher`);
    None when the selector is not one read here (the API server is asked then)."""
    selects = label_matcher(selector)
    if selects is None:
        return None
    mine = []
    for pod in pods:
        meta = pod.get("metadata")
        if not isinstance(meta, dict) or meta.get("namespace") != namespace:
            continue
        labels = meta.get("labels")
        if selects(labels if isinstance(labels, dict) else {}):
            mine.append(pod)
    return _agent_urls(mine, port)


def reads_every_pod(datasets: Iterable[JSON], *, prepare: bool, migrate: bool) -> bool:
    """Whether a controller pass over ``datasets`` lists every pod anyway: next-job preparation
    (``prepare``), migration (``migrate``), or a Dataset with replicas or a stripe. A guess
    for :func:`agents_among`: a pass may list them later (its plan loop) or not at all, and
    either way each step reads the same pods."""
    if prepare or migrate:
        return True
    for ds in datasets:
        spec, status = ds.get("spec"), ds.get("status")
        spec = spec if isinstance(spec, dict) else {}
        stripe = status.get("stripe") if isinstance(status, dict) else None
        if replication.parse_mode(spec.get("replicas")) is not None or parse_stripe(spec.get("stripe")) is not None:
            return True
        if isinstance(stripe, dict) and stripe.get("nodes"):
            return True
    return False


def _agent_urls(pods: Iterable[JSON], port: int) -> dict[str, str]:
    urls = {}
    for pod in pods:
        node, ip = (pod.get("spec") or {}).get("nodeName"), (pod.get("status") or {}).get("podIP")
        if node and ip and (pod.get("status") or {}).get("phase") == "Running":
            host = f"[{ip}]" if ":" in ip else ip
            urls[node] = f"http://{host}:{port}"
    return urls


class AgentHttp:
    """The process's one HTTP client for its calls to the agents, made on first use.

    One client, not one a call: ``httpx.request`` builds a client and its TLS context each
    time, 18.7 ms of CPU a call against 1.1 ms on a kept client (127.0.0.1, this machine),
    and a pass at 15,000 nodes makes about 1,500 calls. Connections to an agent are kept
    alive between its calls. Thread-safe, as ``httpx.Client`` is; :meth:`close` when done."""

    def __init__(self, timeout: float = 10.0) -> None:
        self._timeout = timeout
        self._client: Any = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._lock = threading.Lock()

    def _get(self) -> Any:
        import httpx

        with self._lock:
            if self._client is None:
                self._client = httpx.Client(timeout=self._timeout)
                # closed with this object too: a controller dropped without close() leaves no socket open
                self._finalizer = weakref.finalize(self, self._client.close)
            return self._client

    def __call__(
        self, base: str | None, admin_token: str | None, node: str, method: str, path: str, body: JSON | None, who: str
    ) -> tuple[int, Any] | None:
        """One request to the agent at ``base`` for the Dataset ``who`` (none: ""); None when
        the node has none or it is unreachable."""
        import httpx

        if base is None:
            return None
        headers = {ACTING_FOR_HEADER: who} if who else {}
        if admin_token:
            headers["Authorization"] = f"Bearer {admin_token}"
        try:
            response = self._get().request(method, base + path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            log.warning("agent on node %s unreachable: %s", node, exc)
            return None
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, None

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            if self._finalizer is not None:
                self._finalizer.detach()
            client.close()


#: one agent call's arguments, as :data:`AgentCall` takes them
Request = tuple[str, str, str, "JSON | None", str]


class PassCalls:
    """A pass's :data:`AgentCall`: the requests it is known to repeat are sent together at its
    start (:meth:`send`, :data:`AGENTS_AT_ONCE` at a time) and each answer is handed, once,
    to the call that makes the very same request (node, method, path, body, acting-for);
    any other call goes to the agent then.

    Why: the Datasets are reconciled one after another (their choices and the namespaces'
    charges follow that order), and each asked its nodes in turn, so a pass waited out one
    round trip per Dataset with a warm-up, replicas or a stripe group. The renewals it
    repeats every pass (:func:`dsagent.controller.warmup.renewals`, and the stripe members'
    holds, :func:`dsagent.controller.striping.share_renewals`) are idempotent, so sending
    them first changes nothing an agent holds, only when: a node dropped this pass is
    renewed, then released, in the same pass."""

    def __init__(self, call: AgentCall) -> None:
        self._call = call
        self._answers: dict[tuple[str, str, str, str, str], tuple[int, Any] | None] = {}
        self._lock = threading.Lock()

    def send(self, requests: Sequence[Request]) -> None:
        answers = on_each(lambda request: self._call(*request), requests)
        with self._lock:
            for request, answer in zip(requests, answers):
                self._answers[_request_key(*request)] = answer

    def __call__(self, node: str, method: str, path: str, body: JSON | None, who: str) -> tuple[int, Any] | None:
        with self._lock:
            key = _request_key(node, method, path, body, who)
            if key in self._answers:
                return self._answers.pop(key)
        return self._call(node, method, path, body, who)


def _request_key(node: str, method: str, path: str, body: JSON | None, who: str) -> tuple[str, str, str, str, str]:
    return node, method, path, json.dumps(body, sort_keys=True, separators=(",", ":")), who


def on_each(call: Callable[[K], T], items: Sequence[K]) -> list[T]:
    """``call(item)`` for every item of ``items`` (a node, or a request for one),
    :data:`AGENTS_AT_ONCE` at a time (one is asked inline, with no thread); the answers in
    ``items``' order. ``call`` must be thread-safe where there are several, as the
    controller's :data:`AgentCall` is."""
    if len(items) <= 1:
        return [call(item) for item in items]
    with ThreadPoolExecutor(min(AGENTS_AT_ONCE, len(items)), thread_name_prefix="agents") as pool:
        return list(pool.map(call, items))


def task_request(name: str, spec: JSON) -> DatasetRequestBody:
    """One dataset of an agent task, from a Dataset's spec (its source and bundle store)."""
    bundles = spec.get("bundles") if isinstance(spec.get("bundles"), str) else None
    source: Any = spec.get("source")  # as the Dataset has it: the agent refuses a missing one
    # with a bundle store, the cluster path: see dsagent.kube.podenv
    return dataset_request(name, source, bundles=bundles, allow_per_file=bundles is not None)


def hold_on(
    agent_call: AgentCall, task: str, who: str, name: str, spec: JSON, before: list[str], chosen: list[str]
) -> list[JSON]:
    """Move the agent task ``task`` (the Dataset's source and store) from the nodes in
    ``before`` to those in ``chosen``: released where it is no longer wanted, asked
    (idempotently) on every chosen node; their reports, in ``chosen``'s order. Every request
    names the Dataset ``who`` (``namespace/name``) it is for."""
    release(agent_call, task, [node for node in before if node not in chosen], who)
    asks = hold_requests(task, who, name, spec, chosen)
    return on_each(lambda ask: task_report(ask[0], agent_call(*ask)), asks)


def hold_requests(task: str, who: str, name: str, spec: JSON, nodes: Sequence[str]) -> list[Request]:
    """The requests that put the agent task ``task`` (the Dataset's source and store) on
    ``nodes``: what :func:`hold_on` sends, and what a pass sends ahead as its renewals
    (:class:`PassCalls` hands an answer over only to the very same request)."""
    body = wire_task_request([task_request(name, spec)])
    return [(node, "PUT", task_path(task), dict(body), who) for node in nodes]


def task_path(task: str) -> str:
    return f"/v1/tasks/{task}"


def release(agent_call: AgentCall, task: str, nodes: list[str], who: str) -> None:
    """Release the agent task ``task``, held for the Dataset ``who``, on every node of ``nodes``."""
    on_each(lambda node: agent_call(node, "DELETE", task_path(task), None, who), nodes)


def task_report(node: str, answer: tuple[int, Any] | None) -> JSON:
    """What one agent says about a task's (first) dataset: its state and bytes, never more."""
    if answer is None:
        return {"node": node, "state": "unreachable", "bytesDone": 0, "bytesWanted": 0}
    code, body = answer
    datasets = read_datasets(body)
    if code != 200 or not datasets:
        message = body.get("message") if isinstance(body, dict) else None
        return {
            "node": node,
            "state": "failed",
            "bytesDone": 0,
            "bytesWanted": 0,
            "message": str(message or code)[:MESSAGE_MAX],
        }
    first = datasets[0]
    report = {"node": node, "state": first.state, "bytesDone": first.bytes_done, "bytesWanted": first.size_bytes}
    if first.message is not None:
        report["message"] = first.message
    return report


def cleanup(agent_call: AgentCall, nodes: list[str], namespace: str, name: str, request: str, now: float) -> JSON:
    """``dsagent.io/cleanup``: ask every agent to evict dataset ``name`` without force, for the
    Dataset's namespace alone (the agent evicts only the versions that namespace alone asked
    for, docs/operator-guide/tenancy.md); an agent where a task still uses it answers 409 and keeps it. The
    Dataset's ``status.cleanup``."""
    evicted: list[str] = []
    kept: list[str] = []
    absent: list[str] = []
    who = acting_for(namespace, name)
    answers = on_each(
        lambda node: agent_call(node, "POST", "/v1/evict", {"mode": "names", "names": [name]}, who), nodes
    )
    for node, answer in zip(nodes, answers, strict=True):
        if answer is None:
            continue
        code, _ = answer
        (evicted if code == 200 else kept if code == 409 else absent).append(node)
    log.info("cleanup of Dataset %s: evicted on %s, kept (in use) on %s", who, evicted, kept)
    return {"request": request, "time": format_micro_time(now), "evictedNodes": evicted, "keptInUse": kept}


__all__ = [
    "AGENTS_AT_ONCE",
    "AgentCall",
    "agents_among",
    "cleanup",
    "find_agents",
    "hold_on",
    "AgentHttp",
    "on_each",
    "raw",
    "reads_every_pod",
    "release",
    "task_report",
    "task_request",
]
