"""The extender's HTTP surface, a plain ASGI app: it only converts.

Routes (under ``Settings.base_path``)::

    POST /filter                 ExtenderArgs -> ExtenderFilterResult
    POST /prioritize             ExtenderArgs -> HostPriorityList (combined, weighted)
    POST /prioritize/dataset     ... one score each, so each can get its own
    POST /prioritize/roce            extender weight in KubeSchedulerConfiguration
    POST /prioritize/numa
    POST /prioritize/time            (the deadline time model; dsagent.io/ job annotations)
    GET  /v1/roce-class?gpus=K[&job=ns/name]   the cluster-wide class choice
    GET  /v1/plan?params=P&step-seconds=S&steps=N&max-gpus=G[&deadline=D]
                                 the deadline design's plan over the known nodes
    GET  /healthz, /readyz
    GET  /metrics                Prometheus text (:mod:`scheduler_plugin.metrics`)

kube-scheduler's verbs never answer with an error status: a request that cannot be
served gets a 200 whose ``Error`` is set (filter) or all-zero scores (prioritize), plus
a log line, so an ``ignorable`` extender degrades to "no opinion". The other endpoints
answer 4xx/5xx with ``{"code", "message", "hint"}``.

No framework: the big payloads are decoded once by :mod:`scheduler_plugin.wire`, and a
bare ASGI callable keeps per-request overhead to a few tens of microseconds.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import parse_qs

from dsplatform import probes
from dsplatform.heap import collector_paused
from gpu_topology import classvote
from scheduler_plugin.body import BodyBuffers
from scheduler_plugin.decode import decode_args
from scheduler_plugin.errors import (
    InvalidRequest,
    SchedulerPluginError,
    ViewUnavailable,
)
from scheduler_plugin.filter import NO_WAITING
from scheduler_plugin.framework import Framework
from scheduler_plugin.heap import Heap
from scheduler_plugin.jobs import JobClasses
from scheduler_plugin.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from scheduler_plugin.metrics import ExtenderMetrics
from scheduler_plugin.plugins import deadline
from scheduler_plugin.settings import Settings
from scheduler_plugin.view import View
from scheduler_plugin.wire import BodyNotJson, encode_priorities, filter_result_parts
from scheduling.nodeinfo import NodeReader
from scheduling.plans import plan_on_nodes
from scheduling.timemodel import parse_profile

log = logging.getLogger(__name__)

T = TypeVar("T")
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY_BYTES = 64 << 20  # the default of Settings.max_body_bytes (DSEXT_MAX_BODY)
_JSON = [(b"content-type", b"application/json")]
_PRIORITIZE = {
    "/prioritize": "combined",
    "/prioritize/dataset": "dataset",
    "/prioritize/roce": "roce",
    "/prioritize/numa": "numa",
    "/prioritize/time": "time",
}


class ExtenderApp:
    """ASGI application: ``uvicorn.run(ExtenderApp(...))``."""

    def __init__(
        self, settings: Settings, *, view: View, framework: Framework | None = None, heap: Heap | None = None
    ) -> None:
        self.settings = settings
        self.view = view
        self.framework = framework if framework is not None else Framework(settings)
        self.heap = heap if heap is not None else Heap(False)
        self.bodies = BodyBuffers(settings.max_body_bytes)
        self.metrics = ExtenderMetrics()
        # the verbs run here, off the event loop, so a huge body never holds up /healthz
        self._verbs = ThreadPoolExecutor(1, thread_name_prefix="dsext-verb")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        base = self.settings.base_path
        if base and (path == base or path.startswith(base + "/")):
            path = path[len(base) :] or "/"
        path = path.rstrip("/") or "/"
        method = scope["method"]
        if path == "/filter" or path in _PRIORITIZE:
            if method != "POST":
                await _reply(send, 405, _error_body("method_not_allowed", f"{path} takes POST"))
                return
            body = await self.bodies.read(receive)
            verb: Callable[[Any], list[bytes | memoryview]] = (
                self.filter_parts
                if path == "/filter"
                else functools.partial(self._prioritize_parts, which=_PRIORITIZE[path])
            )
            try:
                parts = await asyncio.get_running_loop().run_in_executor(self._verbs, _paused, verb, body)
            except BodyNotJson as exc:  # no kube-scheduler sends it: a person or a wrong client, told plainly
                parts = [_error_body(exc.code, str(exc))]
                await _reply_parts(send, 400, parts)
            else:
                await _reply_parts(send, 200, parts)
            del parts  # views of the body: released before it is given back
            if body is not None:
                self.bodies.give_back(body)
            del body
            # After the reply: a request that read many nodes for the first time settles
            # the heap now rather than leave a full collection to a later request.
            self.heap.after_reads(self.view.reader.built)
        elif method != "GET":
            await _reply(send, 405, _error_body("method_not_allowed", f"{path} takes GET"))
        elif path == "/v1/plan":
            status, reply = self.plan(scope.get("query_string", b""))
            await _reply(send, status, reply)
        elif path == "/v1/roce-class":
            status, reply = self.roce_class(scope.get("query_string", b""))
            await _reply(send, status, reply)
        elif path == "/metrics":
            self.metrics.waiting_jobs.set(len(self.view.waiting().jobs))
            text = self.metrics.render()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", METRICS_CONTENT_TYPE.encode()),
                        (b"content-length", str(len(text)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": text})
        elif path == "/healthz":  # the one probe shape of every process (docs/design.md#probes)
            await _reply(send, *probes.encoded(probes.OK))
        elif path == "/readyz":
            if self.view.ready:
                await _reply(send, *probes.encoded(probes.READY))
            else:
                await _reply(send, *probes.encoded("syncing", "the node watch has not listed the nodes yet"))
        else:
            await _reply(send, 404, _error_body("not_found", f"no route {path}"))

    # -- kube-scheduler verbs: never an error status ----------------------------

    def filter(self, body: bytes | bytearray | None) -> bytes:
        """ExtenderFilterResult for one request body."""
        return b"".join(self.filter_parts(body))

    def filter_parts(self, body: bytes | bytearray | None) -> list[bytes | memoryview]:
        """:meth:`filter`'s reply as parts (views of ``body`` among them), sent a batch at a time."""
        args = None
        started, outcome_label = time.perf_counter(), "error"
        try:
            args = self._decode("filter", body)
            pod = self.view.resolve(self.framework.read_pod(args.pod))
            nodes = self.view.candidates(args)
            # switched off, the waiting jobs are not gathered (a pass over every node after each change)
            waiting = self.view.waiting() if self.settings.whole_nodes else NO_WAITING
            outcome = self.framework.filter(pod, args.names, nodes, lambda: self.view.cluster(nodes), waiting)
            if outcome.split_reason:
                log.warning("filter: pod %s: %s", pod.key, outcome.split_reason)
            self.metrics.nodes_filtered.labels(result="passed").inc(len(outcome.passed))
            self.metrics.nodes_filtered.labels(result="failed").inc(len(outcome.failed) + len(outcome.unresolvable))
            outcome_label = "ok"
            return filter_result_parts(args, outcome.passed, outcome.failed, outcome.unresolvable)
        except BodyNotJson as exc:  # not a JSON object: answered 400 by the route
            _log_failure("filter", exc, _describe(exc))
            raise
        except ViewUnavailable as exc:
            # Still syncing: no hard fact is known, so every node passes (filtering on
            # nothing must not fail scheduling, whether or not the extender is ignorable).
            log.warning("filter: %s; passing every node", exc)
            outcome_label = "unsynced"
            return filter_result_parts(args, args.names if args is not None else ())
        except Exception as exc:  # the edge: kube-scheduler must get a 200 with Error set
            message = _describe(exc)
            _log_failure("filter", exc, message)
            return filter_result_parts(args, error=message)
        finally:
            self.metrics.observe("filter", time.perf_counter() - started, outcome_label)

    def prioritize(self, body: bytes | bytearray | None, which: str = "combined") -> bytes:
        """HostPriorityList for one request body: one score or the weighted combination."""
        names: list[str] = []
        verb, started, outcome_label = f"prioritize/{which}", time.perf_counter(), "error"
        try:
            args = self._decode(verb, body)
            names = args.names
            pod = self.view.resolve(self.framework.read_pod(args.pod))
            selection = self.view.selection(args)
            if selection is not None:  # names-only: read from the watch cache's columns
                scores = self.framework.prioritize_selection(pod, selection, lambda: self.view.cluster(()), which)
            else:
                nodes = self.view.candidates(args)
                scores = self.framework.prioritize(pod, nodes, lambda: self.view.cluster(nodes), which)
            self.metrics.nodes_scored.labels(verb=verb).inc(len(names))
            outcome_label = "ok"
            return encode_priorities(names, scores)
        except BodyNotJson as exc:  # not a JSON object: answered 400 by the route
            _log_failure(verb, exc, _describe(exc))
            raise
        except Exception as exc:  # the edge: all-zero scores, never a 500
            outcome_label = "unsynced" if isinstance(exc, ViewUnavailable) else "error"
            _log_failure(verb, exc, _describe(exc))
            names = names or getattr(exc, "names", None) or []  # never a second parse of the body
            return encode_priorities(names, [0] * len(names))
        finally:
            self.metrics.observe(verb, time.perf_counter() - started, outcome_label)

    def _prioritize_parts(self, body: bytes | bytearray | None, which: str) -> list[bytes | memoryview]:
        return [self.prioritize(body, which)]

    def _decode(self, verb: str, body: bytes | bytearray | None) -> Any:
        """ExtenderArgs from a body; a body that is none (too large) or not ExtenderArgs is
        counted as a parse failure."""
        try:
            if body is None:
                raise InvalidRequest(f"request body larger than {self.settings.max_body_bytes} bytes (DSEXT_MAX_BODY)")
            return decode_args(body)
        except InvalidRequest:
            self.metrics.parse_failures.labels(verb=verb).inc()
            raise

    # -- other endpoints ---------------------------------------------------------

    def roce_class(self, query: bytes) -> tuple[int, bytes]:
        """``GET /v1/roce-class?gpus=K[&job=ns/name]``: which class a new job should use."""
        try:
            params = parse_qs(query.decode("latin-1"), keep_blank_values=True)
            raw = (params.get("gpus") or ["1"])[0]
            if not raw.isdigit() or int(raw) < 1:
                raise InvalidRequest(f"gpus={raw!r} must be a whole number >= 1", hint="e.g. /v1/roce-class?gpus=4")
            gpus = int(raw)
            jobs = params.get("job")
            job = jobs[0] if jobs else None
            remembered = self.framework.jobs.get(job) if job else None
            nodes = self.view.known()
            choice = classvote.choose_class((n.free_by_class for n in nodes if n.free_by_class), gpus)
        except SchedulerPluginError as exc:
            return exc.http_status, json.dumps(exc.to_dict()).encode()
        body: dict[str, Any] = {
            "class": remembered or (choice.name if choice else None),
            "gpus": gpus,
            "remembered": remembered is not None,
            "votes": dict(choice.votes) if choice else {},
            "freeGpus": dict(choice.free) if choice else {},
            "nodes": len(nodes),
            "source": self.view.source,
        }
        if job:
            body["job"] = job
        return 200, json.dumps(body).encode()

    def plan(self, query: bytes) -> tuple[int, bytes]:
        """``GET /v1/plan``: the time model's plan for a job over the nodes known now.

        Query keys are the pod annotations' without ``dsagent.io/`` (``params`` or
        ``gradient-bytes``, ``step-seconds`` or ``profiled-steps``, ``steps``, ``deadline``
        as RFC 3339 or a duration from now) plus ``max-gpus``.
        """
        try:
            params = parse_qs(query.decode("latin-1"), keep_blank_values=True)
            raw_max = (params.get("max-gpus") or [""])[0]
            if not raw_max.isdigit() or not 1 <= int(raw_max) <= 4096:
                raise InvalidRequest(f"max-gpus={raw_max!r} must be a whole number 1..4096", hint="e.g. max-gpus=8")
            annotations = {f"dsagent.io/{k}": v[0] for k, v in params.items() if k != "max-gpus" and v}
            now = self.framework.clock()
            job, error = parse_profile(annotations, created=now)
            if job is None:
                raise InvalidRequest(
                    error or "no job described",
                    hint="e.g. /v1/plan?params=350M&step-seconds=250ms&steps=100000&deadline=6h&max-gpus=8",
                )
            decision = plan_on_nodes(  # the rule the webhook applies
                job, self.view.known(), now=now, max_gpus=int(raw_max), formula=self.settings.plan_formula
            )
        except SchedulerPluginError as exc:
            return exc.http_status, json.dumps(exc.to_dict()).encode()
        body = deadline.describe(decision, now=now)
        body["formula"] = self.settings.plan_formula
        body["source"] = self.view.source
        return 200, json.dumps(body).encode()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self.view.cache is not None:
                    self.view.cache.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.view.cache is not None:
                    self.view.cache.stop()
                self._verbs.shutdown(wait=False, cancel_futures=True)
                await send({"type": "lifespan.shutdown.complete"})
                return


def _paused(verb: Callable[[Any], T], body: Any) -> T:
    with collector_paused():  # a 5,000-node body decoded: a third of the request was full collections
        return verb(body)


#: the most bytes of a reply's parts joined into one ASGI message
REPLY_BATCH_BYTES = 1 << 20


async def _reply_parts(send: Send, status: int, parts: list[bytes | memoryview]) -> None:
    """Send a reply given as parts, joined a batch of ~1 MiB at a time: a filter reply
    echoes up to ~48 MiB of nodes, and one message of it would be copied whole by the
    HTTP writer and again into the socket's buffer. The server waits for the socket to
    drain between messages, so what is copied at once stays near one batch."""
    if len(parts) == 1:
        await _reply(send, status, bytes(parts[0]))
        return
    headers = [*_JSON, (b"content-length", str(sum(map(len, parts))).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    batch: list[bytes | memoryview] = []
    size = 0
    for part in parts:
        batch.append(part)
        size += len(part)
        if size >= REPLY_BATCH_BYTES:
            await send({"type": "http.response.body", "body": b"".join(batch), "more_body": True})
            batch, size = [], 0
    await send({"type": "http.response.body", "body": b"".join(batch)})


async def _reply(send: Send, status: int, body: bytes) -> None:
    headers = [*_JSON, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _error_body(code: str, message: str) -> bytes:
    return json.dumps({"code": code, "message": message}).encode()


def _describe(exc: Exception) -> str:
    if isinstance(exc, SchedulerPluginError):
        return f"dsplatform extender: {exc}"
    return f"dsplatform extender: internal error ({type(exc).__name__}); see the extender's log"


def _log_failure(verb: str, exc: Exception, message: str) -> None:
    if isinstance(exc, SchedulerPluginError):
        log.warning("%s: %s", verb, message)
    else:
        log.exception("%s failed", verb)


def create_app(
    settings: Settings, *, api_client: Any = None, jobs: JobClasses | None = None, settle_heap: bool = False
) -> ExtenderApp:
    """The app with its view: a watch cache when ``settings.watch`` (from ``api_client``,
    else the in-cluster config or kubeconfig), stateless otherwise. ``settle_heap`` (for
    the served process only, see :mod:`scheduler_plugin.heap`) freezes the heap after
    bulk loads."""
    reader = NodeReader(gpu_resource=settings.gpu_resource, roce_prefix=settings.roce_resource_prefix)
    heap = Heap(settle_heap)
    cache = None
    if settings.watch:
        from scheduler_plugin.nodecache import NodeCache, api_client_from

        cache = NodeCache(
            api_client if api_client is not None else api_client_from(settings.kubeconfig),
            reader,
            gpu_resource=settings.gpu_resource,
            roce_prefix=settings.roce_resource_prefix,
            on_listed=heap.settle,
            job_labels=settings.job_labels,
        )
    view = View(reader, cache)
    return ExtenderApp(settings, view=view, framework=Framework(settings, jobs=jobs, node=view.node), heap=heap)


__all__ = ["ExtenderApp", "MAX_BODY_BYTES", "create_app"]
