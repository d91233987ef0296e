"""The pod annotation ``dsagent.io/datasets``: what a pod asks to have cached. Version 1.
Also the deadline plan's opt-in (``dsagent.io/deadline-plan``, below).

The one reading of it: the admission webhook (to wire the pod), the node agent's cluster
mode (to start caching at bind time), the scheduler extender and the Dataset controller
(through :func:`scheduling.podspec.parse_datasets`: affinity, preparation, migration) all
parse it here, so a pod one of them accepts is one the others read alike.

Two forms are accepted:

- a comma-separated list of names, ``"imagenet,coco"``, resolved through ``Dataset``
  resources in the pod's namespace;
- a JSON list of objects ``{"name", "source"?, "digest"?, "bundles"?, "storage_options"?}``;
  an entry without ``source`` is resolved like a bare name.

The writer is the pod's author (a user or a training operator): :func:`encode` writes the
JSON form, as tools and tests do. Pure: no I/O; errors are :class:`InvalidInput` (the
platform's, each process's tree derives from it) with the reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dsplatform import boundedjson
from dsplatform.errors import InvalidInput
from dsplatform.names import NAME_HINT, is_digest, is_name

#: the version of this contract: both forms below; a new form gets a new version
VERSION = 1
DATASETS_ANNOTATION = "dsagent.io/datasets"
_KEYS = {"name", "source", "digest", "bundles", "storage_options"}
#: the API server caps all of a pod's annotations together at 256 KiB
ANNOTATION_MAX_BYTES = 256 * 1024


@dataclass(frozen=True)
class DatasetRef:
    """One dataset a pod names; ``source`` None means "look it up in the Dataset resource"."""

    name: str
    source: str | None = None
    bundles: str | None = None
    digest: str | None = None
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)


def parse(text: str | None) -> tuple[DatasetRef, ...]:
    """The annotation's datasets, in order; raises :class:`InvalidInput` saying what is wrong."""
    if text is None or not text.strip():
        return ()
    stripped = text.strip()
    refs = _parse_json(stripped) if stripped[0] in "[{" else _parse_names(stripped)
    names = [r.name for r in refs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidInput(f"{DATASETS_ANNOTATION} names {', '.join(duplicates)} more than once")
    return refs


def datasets_of(pod: Mapping[str, Any]) -> tuple[DatasetRef, ...]:
    """The datasets a raw pod's annotation asks for (empty when it has none)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return parse(annotations.get(DATASETS_ANNOTATION))


def encode(refs: tuple[DatasetRef, ...] | list[DatasetRef]) -> str:
    """The annotation's JSON form for ``refs``: what :func:`parse` reads back as ``refs``."""
    items = []
    for ref in refs:
        item: dict[str, Any] = {"name": ref.name}
        for key in ("source", "bundles", "digest", "storage_options"):
            if getattr(ref, key) is not None:
                item[key] = getattr(ref, key)
        items.append(item)
    return json.dumps(items, separators=(",", ":"))


def _parse_names(text: str) -> tuple[DatasetRef, ...]:
    names = [part.strip() for part in text.split(",")]
    return tuple(DatasetRef(_name(n)) for n in names if n)


def _parse_json(text: str) -> tuple[DatasetRef, ...]:
    try:
        items = boundedjson.loads(text, what=DATASETS_ANNOTATION, max_bytes=ANNOTATION_MAX_BYTES)
    except boundedjson.JsonRefused as exc:  # too large, too deep or not JSON
        raise InvalidInput(exc.message) from None
    if not isinstance(items, list):
        raise InvalidInput(f"{DATASETS_ANNOTATION} must be a JSON list or a comma-separated list of names")
    return tuple(_entry(item, i) for i, item in enumerate(items))


def _entry(item: Any, index: int) -> DatasetRef:
    if isinstance(item, str):
        return DatasetRef(_name(item))
    if not isinstance(item, dict) or "name" not in item:
        raise InvalidInput(f"{DATASETS_ANNOTATION}[{index}] must be an object with a 'name'")
    unknown = sorted(set(item) - _KEYS)
    if unknown:
        raise InvalidInput(
            f"{DATASETS_ANNOTATION}[{index}] has unknown keys {unknown}", hint=f"allowed: {sorted(_KEYS)}"
        )
    options = item.get("storage_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidInput(f"{DATASETS_ANNOTATION}[{index}].storage_options must be an object")
    digest = item.get("digest")
    if digest is not None and not is_digest(digest):
        raise InvalidInput(f"{DATASETS_ANNOTATION}[{index}].digest must be 32 lowercase hex characters")
    return DatasetRef(
        name=_name(item["name"]),
        source=_optional_str(item, "source", index),
        bundles=_optional_str(item, "bundles", index),
        digest=digest,
        storage_options=options,
    )


def _optional_str(item: Mapping[str, Any], key: str, index: int) -> str | None:
    value = item.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{DATASETS_ANNOTATION}[{index}].{key} must be a non-empty string")
    return value


def _name(name: Any) -> str:
    if not is_name(name):
        raise InvalidInput(f"invalid dataset name {name!r} in {DATASETS_ANNOTATION}", hint=NAME_HINT)
    return str(name)


#: on a running pod: the job that follows it on its GPUs (a batch/v1 Job, a Volcano Job, or
#: any owner of the next pods, by name, in the pod's namespace). The Dataset controller
#: prepares that job's datasets on the pod's node (docs/design.md#next-job-preparation).
NEXT_JOB_ANNOTATION = "dsagent.io/next-job"
#: on a running pod: its progress in sub-tasks (steps, epochs), ``"<done>/<total>"``, written
#: by the job (or a sidecar). The next job's bulk fetch starts once fewer than the preset
#: count remain (docs/design.md#next-job-preparation).
PROGRESS_ANNOTATION = "dsagent.io/progress"
_OWNER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_PROGRESS = re.compile(r"^\s*(\d{1,12})\s*/\s*(\d{1,12})\s*$")


def next_job_of(annotations: Mapping[str, Any]) -> str | None:
    """The follow-up job a pod names (a DNS-1123 subdomain), or None (absent or not a name)."""
    value = annotations.get(NEXT_JOB_ANNOTATION)
    if not isinstance(value, str) or not _OWNER_NAME.match(value.strip()):
        return None
    return value.strip()


def progress_of(annotations: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(done, total)`` sub-tasks a pod reports, or None (absent, unreadable, done > total)."""
    value = annotations.get(PROGRESS_ANNOTATION)
    match = _PROGRESS.match(value) if isinstance(value, str) and len(value) <= 64 else None
    if match is None:
        return None
    done, total = int(match.group(1)), int(match.group(2))
    return (done, total) if 0 <= done <= total and total > 0 else None


# -- deadline plans ---------------------------------------------------------------------------
# The pod's author writes ``dsagent.io/deadline-plan: apply``; the admission webhook reads it
# and applies the deadline time model's plan (GPU count and node) to the pod, recording what
# it applied in ``dsagent.io/planned`` (docs/design.md#deadline-plans). Without it a plan is
# advice (``GET /v1/plan``). ``dsagent.io/max-gpus`` caps the GPUs a plan may give the pod.
# A worker of a job of several workers is admitted with the scheduling gate ``PLAN_GATE``
# instead; the Dataset controller's plan loop plans the whole job over the nodes, pins each
# worker to its node, records the plan (with the worker's ``node``) and lifts the gate.

PLAN_ANNOTATION = "dsagent.io/deadline-plan"
PLAN_APPLY = "apply"
PLAN_ADVISE = "advise"
PLANNED_ANNOTATION = "dsagent.io/planned"
MAX_GPUS_ANNOTATION = "dsagent.io/max-gpus"
MAX_PLAN_GPUS = 4096
#: the scheduling gate (``spec.schedulingGates[].name``) the webhook sets and the controller lifts
PLAN_GATE = "dsagent.io/deadline-plan"
#: the largest ``dsagent.io/planned`` read back (a plan over thousands of nodes stays below it)
PLANNED_MAX_BYTES = 64 * 1024
PLANNED_MAX_GPUS = 1_000_000  # a whole job's plan (a node's share is at most MAX_PLAN_GPUS)
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """A raw pod's annotations (empty when its metadata or annotations are not objects)."""
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return annotations if isinstance(annotations, dict) else {}


def plan_mode(pod: Mapping[str, Any]) -> str | None:
    """``apply``, ``advise`` or None (not asked); raises :class:`InvalidInput` for another value."""
    annotations = _annotations(pod)
    value = annotations.get(PLAN_ANNOTATION)
    if value is None:
        return None
    mode = value.strip().lower() if isinstance(value, str) else value
    if mode not in (PLAN_APPLY, PLAN_ADVISE):
        raise InvalidInput(f"{PLAN_ANNOTATION} must be {PLAN_APPLY!r} or {PLAN_ADVISE!r}, not {str(value)[:64]!r}")
    return str(mode)


def max_gpus_of(pod: Mapping[str, Any]) -> int | None:
    """The pod's ``dsagent.io/max-gpus`` (1..4096), None when absent; InvalidInput otherwise."""
    value = _annotations(pod).get(MAX_GPUS_ANNOTATION)
    if value is None:
        return None
    text = value.strip() if isinstance(value, str) else ""
    if not text.isdigit() or not 1 <= int(text) <= MAX_PLAN_GPUS:
        raise InvalidInput(f"{MAX_GPUS_ANNOTATION} must be a whole number 1..{MAX_PLAN_GPUS}, not {str(value)[:64]!r}")
    return int(text)


def encode_planned(
    gpus: int,
    nodes: Mapping[str, int],
    branch: str,
    formula: str,
    deadline: str | None,
    node: str | None = None,
) -> str:
    """``dsagent.io/planned``: what was applied (GPUs, GPUs per node, the decision's branch,
    the formula that ranked the plans, the deadline in RFC 3339); ``node``: on a worker of a
    gated job, the node this worker is pinned to (``nodes`` is then the whole job's plan)."""
    body: dict[str, Any] = {"gpus": gpus, "nodes": dict(nodes), "branch": branch, "formula": formula}
    if deadline is not None:
        body["deadline"] = deadline
    if node is not None:
        body["node"] = node
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class Planned:
    """``dsagent.io/planned`` as read back: what :func:`encode_planned` wrote."""

    gpus: int
    nodes: Mapping[str, int]
    branch: str
    formula: str
    deadline: str | None = None
    node: str | None = None


def decode_planned(text: Any) -> Planned:
    """The plan :func:`encode_planned` wrote; :class:`InvalidInput` naming what is wrong for
    anything else (the annotation is the pod author's to edit: hostile input)."""
    what = PLANNED_ANNOTATION
    if not isinstance(text, str):
        raise InvalidInput(f"{what} is not a string")
    try:
        body = boundedjson.loads(text, what=what, max_bytes=PLANNED_MAX_BYTES)
    except boundedjson.JsonRefused as exc:
        raise InvalidInput(exc.message) from None
    if not isinstance(body, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    gpus, nodes = body.get("gpus"), body.get("nodes")
    if not _count(gpus, PLANNED_MAX_GPUS):
        raise InvalidInput(f"{what}.gpus must be a whole number 1..{PLANNED_MAX_GPUS}")
    if not isinstance(nodes, dict) or not nodes:
        raise InvalidInput(f"{what}.nodes must be an object of node names and GPU counts")
    for name, count in nodes.items():
        if not (isinstance(name, str) and _NODE_NAME.fullmatch(name)) or not _count(count, MAX_PLAN_GPUS):
            raise InvalidInput(f"{what}.nodes has an entry that is not a node name and a GPU count")
    if sum(nodes.values()) != gpus:
        raise InvalidInput(f"{what}.nodes does not add up to its gpus")
    branch, formula, deadline = (_text(body, key, 64) for key in ("branch", "formula", "deadline"))
    node = _text(body, "node", 253)
    if node is not None and node not in nodes:
        raise InvalidInput(f"{what}.node is not one of its nodes")
    return Planned(gpus, dict(nodes), branch or "", formula or "", deadline, node)


def _text(body: Mapping[str, Any], key: str, most: int) -> str | None:
    value = body.get(key)
    if value is not None and (not isinstance(value, str) or len(value) > most):
        raise InvalidInput(f"{PLANNED_ANNOTATION}.{key} must be a string of at most {most} characters")
    return value


def _count(value: Any, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= most


__all__ = [
    "DATASETS_ANNOTATION",
    "MAX_GPUS_ANNOTATION",
    "NEXT_JOB_ANNOTATION",
    "PLANNED_ANNOTATION",
    "PLAN_ADVISE",
    "PLAN_ANNOTATION",
    "PLAN_APPLY",
    "PLAN_GATE",
    "PLANNED_MAX_BYTES",
    "PROGRESS_ANNOTATION",
    "VERSION",
    "DatasetRef",
    "Planned",
    "datasets_of",
    "decode_planned",
    "encode",
    "encode_planned",
    "max_gpus_of",
    "next_job_of",
    "parse",
    "plan_mode",
    "progress_of",
]
