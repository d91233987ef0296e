"""A pod's GPU request and its rewrite into a RoCE class resource: the pure part of the
webhook's GPU class policy (``docs/design.md#roce-class-choice``), and its settings.

Who calls it: :class:`dsagent.webhook.roceclass.GpuClassPolicy`, which decides the job's
class (the vote and the Lease) and rewrites each worker with :func:`rewrite_set`; the
webhook's start-up reads :class:`GpuClassSettings`. No I/O: pods in, JSONPatch out.

The rewrite runs in one of three modes (``DSAGENT_WEBHOOK_GPU_CLASSES``, a boolean meaning
``on`` or ``off``):

- ``on``: every GPU pod's request becomes a class resource, voted over every node that
  publishes its classes (the dsagent device plugin serves every GPU node);
- ``auto``: the dsagent device plugin serves only the nodes labelled
  ``<DSAGENT_WEBHOOK_SERVED_LABEL>=true`` (the agent's own label, ``dsagent.io/device-plugin``),
  so only those count in the vote, and only the workers of a multi-worker job whose class set
  those nodes can hold are rewritten; every other GPU pod keeps its ``nvidia.com/gpu``
  request, served by whichever plugin serves the node it lands on. A pod that asks for a
  class resource itself is handled as in ``on``;
- ``off``: no rewrite.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar

from pydantic import AliasChoices, BeforeValidator, Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from dsagent.errors import SettingsError
from dsagent.webhook.jsonpatch import JSONPatch, escape
from dsplatform.gpus import GPU_RESOURCE, RESOURCE_PREFIX, GpuResources, QuantityError, parse_quantity, pod_gpus
from dsplatform.jobs import DEFAULT_JOB_LABELS
from dsplatform.names import is_dns_label, is_qualified_name
from dsplatform.published import DEVICE_PLUGIN_LABEL
from dsplatform.settings import EnvSettings, GpuResource, ResourcePrefix, Switch, not_from_env
from dsplatform.units import parse_duration

CLASS_ANNOTATION = "dsagent.io/gpu-class"
DEFAULT_PREFIX = RESOURCE_PREFIX
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"  # Multus: the pod's extra networks
WEBHOOK_PREFIX = "DSAGENT_WEBHOOK_"  # the webhook's variables (and its GPU classes')


def _job_labels(value: Any) -> tuple[str, ...]:
    """A comma list (``team/job, job-name``); none named: the platform's default labels."""
    items = value.split(",") if isinstance(value, str) else list(value)
    labels = tuple(str(x).strip() for x in items if str(x).strip())
    return labels or DEFAULT_JOB_LABELS


def _lease_ttl(value: Any) -> Any:
    """``DSAGENT_WEBHOOK_JOB_TTL`` is a duration (``2h``), in whole seconds, at least one."""
    return max(1, int(parse_duration(value))) if isinstance(value, str) else value


class GpuClassSettings(EnvSettings):
    """``DSAGENT_WEBHOOK_*`` settings of the GPU class policy (the chart's ``gpuClasses`` values)."""

    model_config = SettingsConfigDict(env_prefix=WEBHOOK_PREFIX, env_ignore_empty=True)
    settings_error: ClassVar[type[Exception] | None] = SettingsError

    # on: every GPU pod's request becomes a class resource; auto: only the workers of a
    # multi-worker job whose class set the nodes labelled <SERVED_LABEL>=true can hold; off: none
    # (a boolean means on or off)
    mode: Switch = Field("off", validation_alias=AliasChoices("mode", "enabled", WEBHOOK_PREFIX + "GPU_CLASSES"))
    # auto: the Node label (=true) of the nodes whose GPUs the dsagent device plugin serves
    served_label: str = DEVICE_PLUGIN_LABEL
    gpu_resource: GpuResource = GPU_RESOURCE
    # class resources are <prefix>/<class name>, e.g. dsagent.io/gpu-roce1
    prefix: ResourcePrefix = Field(
        DEFAULT_PREFIX, validation_alias=AliasChoices("prefix", WEBHOOK_PREFIX + "CLASS_PREFIX")
    )
    job_labels: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_job_labels)] = DEFAULT_JOB_LABELS
    # an ownerless job Lease lives this long after its last worker
    lease_ttl_s: Annotated[int, BeforeValidator(_lease_ttl)] = Field(
        3600, validation_alias=AliasChoices("lease_ttl_s", WEBHOOK_PREFIX + "JOB_TTL")
    )
    nodes_ttl_s: float = not_from_env(5.0)  # how long a node listing serves votes
    #: Multus: the NetworkAttachmentDefinition of a class, ``[<namespace>/]<name>`` with
    #: ``{class}`` in it (``dsplatform/dsp-{class}``); empty: no network annotation
    networks: Annotated[str, BeforeValidator(lambda v: v.strip() if isinstance(v, str) else v)] = ""

    @field_validator("served_label")
    @classmethod
    def _served_label(cls, value: str) -> str:
        if not is_qualified_name(value):
            raise ValueError(f"{value!r} is not a label key ([<prefix>/]<name>, e.g. dsagent.io/device-plugin)")
        return value

    @field_validator("lease_ttl_s")
    @classmethod
    def _lease_ttl_s(cls, value: int) -> int:
        if value < 1:
            raise ValueError("the job Lease TTL must be at least one second")
        return value

    @field_validator("networks")
    @classmethod
    def _networks(cls, value: str) -> str:
        if value and ("{class}" not in value or not _is_network(value.replace("{class}", "gpu-roce1"))):
            raise ValueError(
                f"network attachment template {value!r} is not [<namespace>/]<name> with {{class}} in it"
                " (e.g. dsplatform/dsp-{class})"
            )
        return value

    @property
    def enabled(self) -> bool:
        """Whether the webhook rewrites GPU requests at all (``on`` or ``auto``)."""
        return self.mode != "off"

    @property
    def auto(self) -> bool:
        """Whether only the nodes labelled :attr:`served_label` ``=true`` take class resources."""
        return self.mode == "auto"

    def network(self, gpu_class: str) -> str:
        """The NetworkAttachmentDefinition (``[ns/]name``) of one class."""
        return self.networks.replace("{class}", gpu_class)

    def resource(self, gpu_class: str) -> str:
        return f"{self.prefix}/{gpu_class}"

    @property
    def names(self) -> GpuResources:
        """The GPU resource names these settings configure (what counts as a GPU)."""
        return GpuResources(gpu=self.gpu_resource, prefix=self.prefix)


def _is_network(value: str) -> bool:
    """A NetworkAttachmentDefinition reference, ``[<namespace>/]<name>``, each a DNS-1123 label."""
    namespace, _, name = value.rpartition("/")
    return (not namespace or is_dns_label(namespace)) and is_dns_label(name)


def _containers(spec: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    found: list[tuple[str, Mapping[str, Any]]] = []
    for key in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(key) or []):
            if isinstance(container, dict):
                found.append((f"/spec/{key}/{index}", container))
    return found


def _quantity(value: Any) -> int:
    """A container's quantity of a GPU resource by the platform's one rule
    (:func:`dsplatform.gpus.parse_quantity`: ``"4"``, ``4``, ``"4000m"``); unreadable: none,
    as :func:`gpu_request` counts it."""
    try:
        return parse_quantity(value)
    except QuantityError:
        return 0


def gpu_request(pod: Mapping[str, Any], settings: GpuClassSettings) -> int:
    """GPUs the pod asks for, plain or of a class, by the platform's one rule
    (:func:`dsplatform.gpus.pod_gpus`); a quantity it cannot read counts none."""
    try:
        return pod_gpus(pod.get("spec"), settings.names)
    except ValueError:
        return 0


def requested_classes(pod: Mapping[str, Any], prefix: str) -> dict[str, int]:
    """Class resources (``<prefix>/<class>``) the pod already asks for, by class name."""
    found: dict[str, int] = {}
    for _, container in _containers(pod.get("spec") or {}):
        resources = container.get("resources") or {}
        for kind in ("limits", "requests"):
            for name, value in (resources.get(kind) or {}).items():
                if isinstance(name, str) and name.startswith(prefix + "/"):
                    cls = name.split("/", 1)[1]
                    found[cls] = max(found.get(cls, 0), _quantity(value))
    return found


def rewrite(
    pod: Mapping[str, Any], settings: GpuClassSettings, gpu_class: str, *, annotations_exist: bool
) -> JSONPatch:
    """Replace every container's GPU (or other class) resource by ``gpu_class``'s, keeping
    the quantity, and annotate the pod with its class."""
    return rewrite_set(pod, settings, (gpu_class,), annotations_exist=annotations_exist)


def rewrite_set(
    pod: Mapping[str, Any],
    settings: GpuClassSettings,
    classes: Sequence[str],
    *,
    annotations_exist: bool,
    extra_annotations: Mapping[str, str] | None = None,
) -> JSONPatch:
    """Replace every container's GPU (or other class) resource by the resource of the class
    set ``classes``, keeping the quantity, and annotate the pod with its class (set).

    One class: ``<prefix>/gpu-roce1``. Several: the set's own resource, ``<prefix>/gpu-roce1-2``
    (``docs/design.md#class-sets``), which the node's device plugin serves with the worker's
    rail-aligned share of every class of the set, in one Allocate: two class resources in
    one container would get two answers whose ``NVIDIA_VISIBLE_DEVICES`` collide."""
    from gpu_topology.classsets import resource_name, set_key

    target = settings.resource(resource_name(classes))
    ops: JSONPatch = []
    for path, container in _containers(pod.get("spec") or {}):
        resources = container.get("resources") or {}
        for kind in ("limits", "requests"):
            entries = resources.get(kind) or {}
            moved = [
                name
                for name in entries
                if name == settings.gpu_resource or (name.startswith(settings.prefix + "/") and name != target)
            ]
            amount = max((_quantity(entries[name]) for name in moved), default=0)
            for name in moved:
                ops.append({"op": "remove", "path": f"{path}/resources/{kind}/{escape(name)}"})
            if moved and amount > 0:
                value = max(amount, _quantity(entries.get(target, 0)))
                op = "replace" if target in entries else "add"
                ops.append({"op": op, "path": f"{path}/resources/{kind}/{escape(target)}", "value": str(value)})
    if not ops:
        return ops
    notes = {CLASS_ANNOTATION: set_key(classes), **(extra_annotations or {})}
    if annotations_exist:
        for key, text in notes.items():
            ops.append({"op": "add", "path": "/metadata/annotations/" + escape(key), "value": text})
    else:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": notes})
    return ops


def networks_value(annotations: Mapping[str, Any] | None, attachments: Sequence[str]) -> str:
    """The Multus ``k8s.v1.cni.cncf.io/networks`` value: the pod's own entries (comma list or
    JSON list, kept as written) followed by ``attachments`` not already named."""
    existing = (annotations or {}).get(NETWORKS_ANNOTATION)
    text = existing.strip() if isinstance(existing, str) else ""
    if text.startswith("["):
        try:
            entries = json.loads(text)
        except ValueError:
            entries = None
        if isinstance(entries, list):
            named = {
                f"{e.get('namespace')}/{e.get('name')}" if e.get("namespace") else e.get("name")
                for e in entries
                if isinstance(e, dict)
            }
            for item in attachments:
                if item not in named:
                    ns, _, name = item.rpartition("/")
                    entries.append({"name": name, **({"namespace": ns} if ns else {})})
            return json.dumps(entries, separators=(",", ":"))
    own = [part.strip() for part in text.split(",") if part.strip()]
    return ",".join(own + [a for a in attachments if a not in own])


def lease_name(job: str) -> str:
    """A DNS-1123 name for the Lease of job ``namespace/name``: readable, and unique by hash."""
    name = job.split("/", 1)[-1].lower()
    readable = re.sub(r"[^a-z0-9-]+", "-", name).strip("-")[:36].strip("-") or "job"
    return f"dsplatform-job-{readable}-{hashlib.sha256(job.encode()).hexdigest()[:10]}"


def controller_of(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pod's controlling owner reference (its Job, PyTorchJob, ...), if any."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller") and ref.get("uid") and ref.get("name"):
            return {
                "apiVersion": ref.get("apiVersion"),
                "kind": ref.get("kind"),
                "name": ref["name"],
                "uid": ref["uid"],
                "controller": False,
                "blockOwnerDeletion": False,
            }
    return None


__all__ = [
    "CLASS_ANNOTATION",
    "DEFAULT_PREFIX",
    "NETWORKS_ANNOTATION",
    "WEBHOOK_PREFIX",
    "GpuClassSettings",
    "controller_of",
    "gpu_request",
    "lease_name",
    "networks_value",
    "requested_classes",
    "rewrite",
    "rewrite_set",
]
