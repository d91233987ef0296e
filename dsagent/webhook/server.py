"""The mutating admission webhook: AdmissionReview v1 over HTTPS, never blocking a pod.

``POST /mutate`` takes the AdmissionReview the API server sends for a pod CREATE, parses
the pod's ``dsagent.io/datasets`` annotation, resolves bare names through the Datasets of
the pod's namespace, and answers with the JSONPatch of :func:`dsagent.webhook.mutation.mutate`.
Whatever goes wrong (an unparseable annotation, a missing Dataset, an unreachable API
server, a bug), the answer is ``allowed: true`` without a patch and with a warning the
user sees in ``kubectl``: this webhook never blocks a pod (and the chart registers it
with ``failurePolicy: Ignore`` for when it is down).

With ``DSAGENT_WEBHOOK_DEADLINE_PLANS=true`` it applies the deadline design's plan (GPU count
and node) to a pod that says ``dsagent.io/deadline-plan: apply``
(:mod:`dsagent.webhook.deadlineplan`), before the GPU class step. With
``DSAGENT_WEBHOOK_PLAN_GATES=true`` a worker of a multi-worker job that says so is admitted
with a scheduling gate instead, for the Dataset controller's plan loop
(:mod:`dsagent.webhook.plangate`).

With ``DSAGENT_WEBHOOK_GPU_CLASSES=on`` it also rewrites a GPU pod's ``nvidia.com/gpu``
request into its job's RoCE class resource (:mod:`dsagent.webhook.roceclass`), the job's
class kept in a Lease per job; with ``auto`` it does so only for the workers of a
multi-worker job whose class set the nodes the dsagent device plugin serves can hold (the
nodes labelled ``<DSAGENT_WEBHOOK_SERVED_LABEL>=true``), and leaves every other GPU pod's
request alone; ``off`` (or ``false``) turns it off.

Serve it with ``python -m dsagent.webhook`` (settings from ``DSAGENT_WEBHOOK_*``:
``LISTEN``, ``CERT_FILE``, ``KEY_FILE``, ``INJECTION_FILE``, ``KUBECONFIG``,
``DEADLINE_PLANS``, ``PLAN_FORMULA``, ``PLAN_GATES``; for GPU classes ``GPU_CLASSES``, ``SERVED_LABEL``,
``GPU_RESOURCE``, ``CLASS_PREFIX``, ``JOB_LABELS``, ``JOB_TTL``, ``NETWORKS``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    InstanceOf,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import NoDecode, SettingsConfigDict

from dsagent.envsettings import AgentLogSettings, parse_listen
from dsagent.errors import DsagentError, NotFound, SettingsError
from dsagent.kube.datasets import Dataset
from dsagent.webhook.admissionmetrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from dsagent.webhook.admissionmetrics import WebhookMetrics
from dsagent.webhook.deadlineplan import WARNING as PLAN_WARNING
from dsagent.webhook.deadlineplan import KubePlanNodes, PlanOutcome, PlanPolicy, wants_plan
from dsagent.webhook.gpurequest import WEBHOOK_PREFIX, GpuClassSettings
from dsagent.webhook.mutation import Injection, JSONPatch, mutate, resolve
from dsagent.webhook.plangate import GatePolicy, multi_worker
from dsagent.webhook.roceclass import GpuClassPolicy, KubeGpuClasses
from dsplatform import boundedjson, logs, probes, published
from dsplatform.errors import PlatformError, exit_on_error
from dsplatform.serving import StartupWatch, listening_socket
from dsplatform.settings import EnvSettings, Flag, InvalidSettings, not_from_env
from dsplatform.wire import podannotations
from scheduling.nodeinfo import NodeReader
from scheduling.timemodel import DEFAULT_FORMULA, check_formula

log = logging.getLogger("dsagent.webhook")
ENV_PREFIX = WEBHOOK_PREFIX
Lookup = Callable[[str, str], Dataset]  # (namespace, name) -> Dataset, raises NotFound
#: an AdmissionReview carries a pod (etcd caps an object at 1.5 MiB) and maybe its old copy
REVIEW_MAX_BYTES = 8 * 1024 * 1024
#: seconds uvicorn waits for open connections after SIGTERM before closing them
SHUTDOWN_GRACE_S = 5


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")
    uid: str
    namespace: str | None = None
    operation: str | None = None
    object: dict[str, Any] | None = None
    dryRun: bool | None = None


class _Review(BaseModel):
    model_config = ConfigDict(extra="allow")
    apiVersion: str
    kind: str
    request: _Request


@dataclass(frozen=True)
class Decision:
    """The webhook's answer for one pod: a patch (possibly empty), warnings, and whether a
    part failed and the pod was admitted without it (``failed``: the webhook failed open)."""

    patch: JSONPatch
    warnings: tuple[str, ...] = ()
    failed: bool = False

    @property
    def outcome(self) -> str:
        """The ``outcome`` label it is counted under (:class:`WebhookMetrics`)."""
        return "failed_open" if self.failed else "patched" if self.patch else "unpatched"


def decide(
    pod: Mapping[str, Any],
    namespace: str,
    injection: Injection,
    lookup: Lookup,
    gpu: GpuClassPolicy | None = None,
    *,
    dry_run: bool = False,
    plans: PlanPolicy | None = None,
    gates: GatePolicy | None = None,
) -> Decision:
    """What to do with one pod: wire its datasets, (with ``plans``) apply its deadline plan
    when it opts in, (with ``gates``) gate a worker of a multi-worker job that opts in, and
    (with ``gpu``) give its GPU request its job's class; never raises (an error becomes a
    warning and no patch for that part)."""
    shape = _shape_problem(pod)
    if shape:  # no JSONPatch could apply to it: admit it unchanged, the API server judges it
        log.warning("pod in %s admitted without dsplatform: %s", namespace, shape)
        return Decision([], (f"dsplatform: datasets not wired, the pod runs without the cache: {shape}",), True)
    datasets = _decide_datasets(pod, namespace, injection, lookup)
    planned = _decide_plan(pod, namespace, plans, gates)
    if planned.patch or planned.warnings:
        # the class policy reads the planned pod: its patch follows the plan's in one sequence
        datasets = Decision(datasets.patch + planned.patch, datasets.warnings + planned.warnings, datasets.failed)
        pod = planned.pod
    if gpu is None:
        return datasets
    annotated = (pod.get("metadata") or {}).get("annotations") is not None or any(
        op.get("path") == "/metadata/annotations" for op in datasets.patch
    )
    name = (pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get("generateName") or "pod"
    try:
        classes = gpu.decide(pod, namespace, annotations_exist=annotated, dry_run=dry_run)
    except PlatformError as exc:  # the agent's errors and the wire contract's
        reason = str(exc)
    except Exception as exc:  # never block a pod on a bug; keep it visible
        log.exception("assigning a GPU class to %s/%s failed", namespace, name)
        reason = f"internal error ({type(exc).__name__})"
    else:
        return Decision(datasets.patch + classes.patch, datasets.warnings + classes.warnings, datasets.failed)
    log.warning("pod %s/%s admitted without a GPU class: %s", namespace, name, reason)
    return Decision(
        datasets.patch,
        datasets.warnings + (f"dsplatform: GPU class not assigned, the pod keeps its GPU request: {reason}",),
        True,
    )


def _decide_plan(
    pod: Mapping[str, Any], namespace: str, plans: PlanPolicy | None, gates: GatePolicy | None = None
) -> PlanOutcome:
    if not wants_plan(pod):
        return PlanOutcome(pod)
    if gates is not None:
        try:
            gated = gates.decide(pod)
        except Exception as exc:  # never block a pod on a bug; keep it visible
            name = (pod.get("metadata") or {}).get("name") or "pod"
            log.exception("gating %s/%s for its deadline plan failed", namespace, name)
            return PlanOutcome(pod, warnings=(PLAN_WARNING + f"internal error ({type(exc).__name__})",))
        if gated is not None:
            return gated
    elif plans is None and multi_worker(pod):
        reason = f"a job of several workers is planned by the controller's plan loop, off here ({ENV_PREFIX}PLAN_GATES)"
        return PlanOutcome(pod, warnings=(PLAN_WARNING + reason,))
    if plans is None:
        reason = f"deadline plans are off in this webhook ({ENV_PREFIX}DEADLINE_PLANS)"
        return PlanOutcome(pod, warnings=(PLAN_WARNING + reason,))
    try:
        return plans.decide(pod)
    except PlatformError as exc:  # the API server unreachable, a node listing refused
        reason = str(exc)
    except Exception as exc:  # never block a pod on a bug; keep it visible
        name = (pod.get("metadata") or {}).get("name") or "pod"
        log.exception("planning %s/%s failed", namespace, name)
        reason = f"internal error ({type(exc).__name__})"
    return PlanOutcome(pod, warnings=(PLAN_WARNING + reason,))


def _decide_datasets(pod: Mapping[str, Any], namespace: str, injection: Injection, lookup: Lookup) -> Decision:
    name = (pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get("generateName") or "pod"
    try:
        refs = podannotations.datasets_of(pod)
        if not refs:
            return Decision([])
        datasets = resolve(refs, lambda dataset: lookup(namespace, dataset))
        return Decision(mutate(pod, datasets, injection))
    except NotFound as exc:
        reason = f"{exc.message} (create the Dataset or give its source in the annotation)"
    except PlatformError as exc:  # the agent's errors and the wire contract's
        reason = str(exc)
    except Exception as exc:  # never block a pod on a bug; keep it visible
        log.exception("mutating %s/%s failed", namespace, name)
        reason = f"internal error ({type(exc).__name__})"
    log.warning("pod %s/%s admitted without dsplatform: %s", namespace, name, reason)
    return Decision([], (f"dsplatform: datasets not wired, the pod runs without the cache: {reason}",), True)


def response(uid: str, decision: Decision) -> dict[str, Any]:
    """The AdmissionReview v1 answer."""
    body: dict[str, Any] = {"uid": uid, "allowed": True}
    if decision.patch:
        body["patchType"] = "JSONPatch"
        body["patch"] = base64.b64encode(json.dumps(decision.patch).encode()).decode()
    if decision.warnings:
        body["warnings"] = list(decision.warnings)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": body}


def create_app(
    injection: Injection,
    lookup: Lookup,
    gpu: GpuClassPolicy | None = None,
    plans: PlanPolicy | None = None,
    gates: GatePolicy | None = None,
    metrics: WebhookMetrics | None = None,
) -> FastAPI:
    """The webhook's ASGI app; ``lookup`` reads Datasets, ``gpu`` assigns GPU classes,
    ``plans`` applies deadline plans and ``gates`` gates the workers of multi-worker jobs for
    the plan loop (all blocking: run in a thread); ``metrics``: the registry it serves (a new
    one when not given; :func:`serve` gives the one its Node readers count in)."""
    app = FastAPI(title="dsagent-webhook", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = metrics if metrics is not None else WebhookMetrics()
    app.state.metrics = metrics

    @app.post("/mutate")
    async def mutate_pod(request: Request) -> JSONResponse:
        started = time.perf_counter()
        answer, outcome = await _review(request)
        metrics.admitted(outcome, time.perf_counter() - started)  # docs/design.md#metrics
        return answer

    async def _review(request: Request) -> tuple[JSONResponse, str]:
        try:
            raw = boundedjson.loads(
                await _read_bounded(request, REVIEW_MAX_BYTES), what="the AdmissionReview", max_bytes=REVIEW_MAX_BYTES
            )
            review = _Review.model_validate(raw)
        except boundedjson.JsonRefused as exc:
            return JSONResponse({"code": "invalid_input", "message": exc.message}, status_code=400), "invalid"
        except (ValueError, ValidationError) as exc:
            message = f"not an AdmissionReview: {exc}"[:500]
            return JSONResponse({"code": "invalid_input", "message": message}, status_code=400), "invalid"
        req = review.request
        pod = req.object or {}
        if pod.get("kind", "Pod") != "Pod" or req.operation not in (None, "CREATE"):
            return JSONResponse(response(req.uid, Decision([]))), "unpatched"
        metadata = pod.get("metadata")
        namespace = req.namespace or (metadata.get("namespace") if isinstance(metadata, dict) else None) or "default"
        decision = await asyncio.to_thread(
            decide, pod, namespace, injection, lookup, gpu, dry_run=bool(req.dryRun), plans=plans, gates=gates
        )
        return JSONResponse(response(req.uid, decision)), decision.outcome

    @app.get("/healthz")  # the one probe shape of every process (docs/design.md#probes)
    async def healthz() -> dict[str, str]:
        return probes.body(probes.OK)

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        return probes.body(probes.READY)

    @app.get("/metrics")
    async def metrics_text() -> Response:
        return Response(metrics.render(), media_type=METRICS_CONTENT_TYPE)

    return app


async def _read_bounded(request: Request, max_bytes: int) -> bytes:
    """The request body, read no further than one byte past ``max_bytes``."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            break
    return b"".join(chunks)


def _shape_problem(pod: Mapping[str, Any]) -> str | None:
    """Why no JSONPatch can apply to ``pod`` (its ``spec`` or ``metadata`` not an object), or None."""
    for field in ("metadata", "spec"):
        value = pod.get(field)
        if field == "spec" and not isinstance(value, dict):
            return f"the pod's spec is {type(value).__name__ if value is not None else 'null'}, not an object"
        if field == "metadata" and value is not None and not isinstance(value, dict):
            return f"the pod's metadata is {type(value).__name__}, not an object"
    return None


class WebhookSettings(EnvSettings):
    """``DSAGENT_WEBHOOK_*``: where the webhook listens, its certificate, what it injects;
    its GPU classes are :class:`GpuClassSettings`, read from the same variables."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True)

    listen: Annotated[tuple[str, int], NoDecode, BeforeValidator(parse_listen)] = ("0.0.0.0", 8443)
    cert_file: Path | None = None
    key_file: Path | None = None
    injection_file: Path | None = None  # the chart's injection.json: what the webhook injects
    kubeconfig: str | None = None
    # read from the file at start-up (:meth:`from_env`), or given directly
    injection: InstanceOf[Injection] | None = not_from_env(None)
    gpu_classes: InstanceOf[GpuClassSettings] = not_from_env(default_factory=GpuClassSettings)
    # deadline plans applied to pods that opt in (dsagent.io/deadline-plan: apply); off: advice only
    deadline_plans: Flag = False
    # the Nodes the class vote and the plans read, kept by list+watch (dsagent/kube/nodewatch.py)
    # rather than listed each time they are needed
    watch_nodes: Flag = True
    plan_formula: str = DEFAULT_FORMULA  # (12)'s stand-in the plans are ranked by
    # the workers of a multi-worker job that opts in are admitted with a scheduling gate, which
    # the Dataset controller's plan loop lifts; on only where that loop runs (chart: controller.planGates)
    plan_gates: Flag = False

    @field_validator("plan_formula")
    @classmethod
    def _plan_formula(cls, value: str) -> str:
        return check_formula(value)

    @property
    def host(self) -> str:
        return self.listen[0]

    @property
    def port(self) -> int:
        return self.listen[1]

    @model_validator(mode="after")
    def _whole_settings(self) -> WebhookSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError(f"set both {ENV_PREFIX}CERT_FILE and {ENV_PREFIX}KEY_FILE, or neither")
        if self.injection is None:
            object.__setattr__(self, "injection", _injection(self.injection_file))
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> WebhookSettings:
        """The webhook's settings and its GPU classes' from ``DSAGENT_WEBHOOK_*`` (``overrides``:
        the webhook's, winning); one :class:`SettingsError` lists every bad variable of both."""
        env = os.environ if environ is None else environ
        problems: list[tuple[str, str]] = []
        gpu_classes: GpuClassSettings | None = None
        try:
            gpu_classes = GpuClassSettings.read(env)
        except InvalidSettings as exc:
            problems += exc.problems
        try:
            settings = cls.read(env, **{**overrides, "gpu_classes": gpu_classes})
        except InvalidSettings as exc:
            problems += exc.problems
        if problems:
            raise SettingsError(InvalidSettings(problems).message)
        return settings


def _injection(path: Path | None) -> Injection:
    if path is None:
        raise ValueError(f"{ENV_PREFIX}INJECTION_FILE is not set (point it at the chart's injection.json)")
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"{ENV_PREFIX}INJECTION_FILE: cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{ENV_PREFIX}INJECTION_FILE: {path} is not JSON: {exc.msg}") from None
    try:
        return Injection.from_json(raw)
    except (DsagentError, TypeError) as exc:
        raise ValueError(f"{ENV_PREFIX}INJECTION_FILE: {exc}") from None


#: every settings class the webhook reads: what its start-up check accepts (dsagent.kube.envnames)
SETTINGS = (WebhookSettings, GpuClassSettings, AgentLogSettings)


def serve(settings: WebhookSettings, log_settings: AgentLogSettings | None = None) -> None:
    """Run the webhook under uvicorn (HTTPS when a certificate is configured)."""
    import uvicorn

    from dsagent.kube import apiclient
    from dsagent.kube.datasets import DatasetClient
    from dsagent.kube.nodewatch import NodeWatch

    _check_certificate(settings)
    api_client = apiclient.load(settings.kubeconfig)
    client = DatasetClient(api_client, request_timeout=2.0)
    reads_nodes = settings.gpu_classes.enabled or settings.deadline_plans  # the class vote (on or auto), plans
    # the class vote reads the published topology alone; the plans read the inventories too
    keep = None if settings.deadline_plans else (published.TOPOLOGY,)
    watch = NodeWatch(api_client, request_timeout=2.0, published=keep) if reads_nodes and settings.watch_nodes else None
    if watch is not None:
        watch.start()
    metrics = WebhookMetrics()
    gpu = None
    if settings.gpu_classes.enabled:
        kube = KubeGpuClasses(api_client, settings.gpu_classes, watch=watch, reads=metrics.node_reads)
        gpu = GpuClassPolicy(settings.gpu_classes, kube)
    plans = None
    if settings.deadline_plans:
        names = settings.gpu_classes.names
        reader = NodeReader(gpu_resource=names.gpu)
        nodes = KubePlanNodes(api_client, reader, watch=watch, reads=metrics.node_reads)
        plans = PlanPolicy(nodes, time.time, names, settings.plan_formula)
    gates = GatePolicy(settings.gpu_classes.names, time.time) if settings.plan_gates else None
    assert settings.injection is not None  # the settings read or were given it
    # bound first: a busy address is one line and exit 2, not uvicorn's log and exit 3
    sock = listening_socket(settings.host, settings.port, hint=f"choose another {ENV_PREFIX}LISTEN")
    app = StartupWatch(create_app(settings.injection, client.get, gpu, plans, gates, metrics))
    config = uvicorn.Config(
        app,
        **logs.uvicorn_options(log_settings if log_settings is not None else AgentLogSettings()),
        # an idle or half-open client (a TLS handshake never finished) must not hold SIGTERM
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        ssl_certfile=str(settings.cert_file) if settings.cert_file else None,
        ssl_keyfile=str(settings.key_file) if settings.key_file else None,
    )
    server = uvicorn.Server(config)
    with app.serving("the webhook", lambda: server.started):  # a failed start: its error, not exit 3
        server.run(sockets=[sock])


def _check_certificate(settings: WebhookSettings) -> None:
    """Load the serving certificate once before anything starts: uvicorn loads it only when
    it begins serving, and a missing or mismatched file was a 40-line traceback there."""
    if settings.cert_file is None or settings.key_file is None:
        return
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(settings.cert_file, settings.key_file)
    except (OSError, ssl.SSLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SettingsError(
            f"cannot load the serving certificate {settings.cert_file} with key {settings.key_file}: {reason}",
            hint=f"{ENV_PREFIX}CERT_FILE and {ENV_PREFIX}KEY_FILE must name a readable PEM certificate and its key",
        ) from exc


def main() -> None:
    """The webhook process; a deliberate error (bad settings, no API server) is one line and its exit code."""
    with exit_on_error("dsagent-webhook"):  # a bad setting is one line on stderr, logging or not
        from dsagent.kube.envnames import refuse_unknown

        refuse_unknown(SETTINGS)
        log_settings = AgentLogSettings.from_env()
        # only once the settings are good: configure() replaces the root logger's handlers
        logs.configure(log_settings.log_level, log_settings.log_format)
        serve(WebhookSettings.from_env(), log_settings)


if __name__ == "__main__":
    main()


__all__ = ["SETTINGS", "Decision", "WebhookSettings", "create_app", "decide", "main", "response", "serve"]
