"""A small fake Kubernetes API server over real HTTP on 127.0.0.1, for the tests and the benchmarks.

It speaks the JSON the unmodified official ``kubernetes`` client sends and accepts, for
core ``Nodes`` and ``Pods``, ``coordination.k8s.io/v1`` ``Leases`` (namespaced, no status
subresource; spec fields type-checked, ``acquireTime``/``renewTime`` stored as the
server's RFC 3339 MicroTime in UTC) and the ``Dataset`` custom resource
(``dsagent.io/v1alpha1``, namespaced, with the status subresource), the ``NodeCache`` custom
resource (``dsagent.io/v1alpha1``, cluster-scoped, no status subresource), and the queue systems' Kueue
``Workloads`` (``kueue.x-k8s.io/v1beta1``) and Volcano ``Jobs`` (``batch.volcano.sh/v1alpha1``):

- list (``resourceVersion`` in the list metadata; ``limit`` pages with ``continue`` tokens,
  each page of one snapshot, except with ``resourceVersion=0``, which the watch cache answers
  whole; ``fieldSelector`` such as
  ``spec.nodeName=n1``, ``labelSelector`` with ``=``, ``==``, ``!=``, ``in``, ``notin``,
  existence and ``!key``);
- watch (``watch=true``): chunked JSON lines of ADDED / MODIFIED / DELETED events,
  BOOKMARK events when ``allowWatchBookmarks=true``, ``resourceVersion`` semantics (unset
  or ``"0"``: synthetic ADDED events for the current state first; ``N``: every change
  after N; older than the compaction point: an ``ERROR`` event with a ``410 Expired``
  Status, as a real API server sends), ``timeoutSeconds``, and selector transitions (an
  object that starts matching a field selector arrives as ADDED, one that stops matching
  as DELETED, exactly as the API server's watch cache does);
- get, create (POST, with ``generateName``), replace (PUT, with resourceVersion
  conflicts), delete, and patch with ``application/merge-patch+json``,
  ``application/strategic-merge-patch+json`` (merged like a merge patch: maps merge,
  lists are replaced, which is what strategic merge does for every list without a patch
  merge key; annotations, labels and status are maps; a Node's ``status.conditions`` merge
  by ``type``, their merge key) and ``application/json-patch+json``
  (RFC 6902). ``/status`` writes change only ``.status``; writes to the main resource
  leave ``.status`` alone, and a pod's spec changes only as the API server allows
  (:mod:`tools.support.podrules`: scheduling gates only removed, a gated pod's node affinity
  only narrowed, resource requests never changed). A write that changes nothing keeps the resourceVersion and
  sends no event, like the real server. Deleting an object deletes the objects whose
  ``ownerReferences`` name its uid (the garbage collector's background cascade, done at
  once: a Node's ``NodeCache`` goes with it).

Errors are ``Status`` objects with the real ``reason`` and ``code``.

Test hooks (the class :class:`FakeApiServer`): seed or change objects directly
(:meth:`create`, :meth:`patch`, :meth:`delete`, :meth:`get`), send raw events
(:meth:`inject_event`), send bookmarks (:meth:`send_bookmarks`), force ``410 Gone`` for
every resourceVersion seen so far (:meth:`compact`), end every open watch
(:meth:`close_watches`), stop and restart on the same port (:meth:`stop`,
:meth:`start`, :meth:`restart`), make matching requests hang (:meth:`hang`) or fail with
a status (:meth:`fail`) until :meth:`heal`, and inspect what clients sent
(:attr:`requests`, :meth:`wait_for`). Builders :func:`make_node`, :func:`make_pod` and
:func:`make_dataset` give realistic objects.

Who uses it: the kube tests, the scheduler extender's watch-cache tests and its benchmark
(``tools/bench/extender.py``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import select
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from dsplatform import kubetime
from tools.support.podrules import PodUpdateRefused, check_pod_update
from tools.support.ports import port_holder

JSON = dict[str, Any]
#: continue tokens a list answered with and still serves (the oldest go first, as etcd compacts)
PAGES_KEPT = 256


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool = True
    generation: bool = False  # metadata.generation counts spec changes (custom resources)
    validate: Callable[[JSON], JSON] | None = None  # the server's checks and defaults on write
    url_plural: str = ""  # the plural in URLs, where it differs from the key (two groups' "jobs")

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


def _micro_time(value: Any, field_path: str) -> str:
    """A MicroTime as the API server stores and returns it: RFC 3339, microseconds, UTC."""
    try:
        return kubetime.format_micro_time(kubetime.parse(value))
    except kubetime.KubeTimeError:
        raise ApiError(
            400,
            "BadRequest",
            f'Lease in version "v1" cannot be handled as a Lease: {field_path}: '
            f"parsing time {json.dumps(value)} as RFC3339: cannot parse",
        ) from None


def _validate_lease(obj: JSON) -> JSON:
    """coordination.k8s.io/v1 Lease: spec field types as the API server decodes them."""
    spec = obj.get("spec")
    if spec is None:
        obj["spec"] = spec = {}
    if not isinstance(spec, dict):
        raise ApiError(
            400, "BadRequest", 'Lease in version "v1" cannot be handled as a Lease: spec: expected an object'
        )
    kinds = {
        "holderIdentity": str,
        "leaseDurationSeconds": int,
        "leaseTransitions": int,
        "strategy": str,
        "preferredHolder": str,
    }
    for key, value in spec.items():
        if value is None:
            continue
        if key in ("acquireTime", "renewTime"):
            spec[key] = _micro_time(value, f"spec.{key}")
        elif key in kinds:
            if not isinstance(value, kinds[key]) or isinstance(value, bool):
                raise ApiError(
                    400,
                    "BadRequest",
                    f'Lease in version "v1" cannot be handled as a Lease: spec.{key}: expected {kinds[key].__name__}',
                )
        else:
            raise ApiError(
                400, "BadRequest", f'Lease in version "v1" cannot be handled as a Lease: json: unknown field "{key}"'
            )
    for key in ("leaseDurationSeconds", "leaseTransitions"):
        if isinstance(spec.get(key), int) and spec[key] < 0:
            raise ApiError(
                422,
                "Invalid",
                f'Lease.coordination.k8s.io "{obj["metadata"].get("name")}" is invalid: '
                f"spec.{key}: Invalid value: {spec[key]}: must be greater than or equal to 0",
            )
    return obj


RESOURCES: dict[str, ResourceType] = {
    "nodes": ResourceType("", "v1", "nodes", "Node", namespaced=False),
    "pods": ResourceType("", "v1", "pods", "Pod", namespaced=True),
    "datasets": ResourceType("dsagent.io", "v1alpha1", "datasets", "Dataset", namespaced=True, generation=True),
    # each node's published cache state (dsplatform/wire/nodecache.py): cluster-scoped, owned by
    # its Node, no status subresource (the agent writes its status with the object)
    "nodecaches": ResourceType(
        "dsagent.io", "v1alpha1", "nodecaches", "NodeCache", namespaced=False, status_subresource=False
    ),
    # the job's RoCE class, the Dataset controller's leader Lease and pack Jobs
    "leases": ResourceType(
        "coordination.k8s.io",
        "v1",
        "leases",
        "Lease",
        namespaced=True,
        status_subresource=False,
        validate=_validate_lease,
    ),
    "jobs": ResourceType("batch", "v1", "jobs", "Job", namespaced=True),
    # the Dataset controller's per-version copy counts for the agents
    "configmaps": ResourceType("", "v1", "configmaps", "ConfigMap", namespaced=True, status_subresource=False),
    # what the controller tells a Dataset's owner (a refusal, a bound held)
    "events": ResourceType("events.k8s.io", "v1", "events", "Event", namespaced=True, status_subresource=False),
    # the queue systems next-job preparation reads its order from
    "workloads": ResourceType("kueue.x-k8s.io", "v1beta1", "workloads", "Workload", namespaced=True, generation=True),
    "vcjobs": ResourceType(
        "batch.volcano.sh", "v1alpha1", "vcjobs", "Job", namespaced=True, generation=True, url_plural="jobs"
    ),
}


@dataclass(frozen=True)
class RecordedRequest:
    """One request a client sent, as the server saw it."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    body: Any

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch") in ("true", "1")


@dataclass
class _Event:
    rv: int
    plural: str
    type: str
    obj: JSON
    old: JSON | None = None  # the object before a MODIFIED, for selector transitions


class ApiError(Exception):
    """A Status the fake server answers with."""

    def __init__(self, code: int, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> JSON:
        body: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


# -- selectors ---------------------------------------------------------------------------


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        terms.append(current.strip())
    return terms


_SET_TERM = re.compile(r"^([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)$")
_EQ_TERM = re.compile(r"^([\w./-]+)\s*(==|!=|=)\s*(.*)$")


def label_selector_matches(selector: str | None, labels: dict[str, str] | None) -> bool:
    """True when ``labels`` satisfy the Kubernetes label selector string."""
    labels = labels or {}
    for term in _split_terms(selector or ""):
        set_term = _SET_TERM.match(term)
        eq_term = _EQ_TERM.match(term)
        if set_term:
            key, op, values = set_term.groups()
            wanted = {v.strip() for v in values.split(",") if v.strip()}
            if (labels.get(key) in wanted) != (op == "in"):
                return False
        elif eq_term:
            key, op, value = eq_term.groups()
            if (labels.get(key) == value.strip()) != (op != "!="):
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def _field_value(obj: JSON, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def field_selector_matches(selector: str | None, obj: JSON) -> bool:
    """True when ``obj`` satisfies a field selector like ``spec.nodeName=n1,status.phase!=Failed``."""
    for term in _split_terms(selector or ""):
        match = _EQ_TERM.match(term)
        if not match:
            raise ApiError(400, "BadRequest", f"invalid field selector term {term!r}")
        path, op, value = match.groups()
        if (_field_value(obj, path) == value.strip()) != (op != "!="):
            return False
    return True


# -- patches -----------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"invalid JSON pointer {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _resolve_parent(doc: Any, parts: list[str]) -> Any:
    for part in parts[:-1]:
        if isinstance(doc, list):
            doc = doc[int(part)]
        elif isinstance(doc, dict) and part in doc:
            doc = doc[part]
        else:
            raise ApiError(422, "Invalid", f"JSON patch path segment {part!r} does not exist")
    return doc


def _json_patch_get(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, list):
            doc = doc[int(part)]
        elif isinstance(doc, dict) and part in doc:
            doc = doc[part]
        else:
            raise ApiError(422, "Invalid", f"JSON patch path {'/'.join(parts)!r} does not exist")
    return doc


def _json_patch_remove(doc: Any, parts: list[str]) -> Any:
    parent = _resolve_parent(doc, parts)
    try:
        return parent.pop(int(parts[-1]) if isinstance(parent, list) else parts[-1])
    except (KeyError, IndexError, ValueError) as exc:
        raise ApiError(422, "Invalid", f"cannot remove missing path /{'/'.join(parts)}") from exc


def _json_patch_add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return copy.deepcopy(value)
    parent = _resolve_parent(doc, parts)
    key = parts[-1]
    if isinstance(parent, list):
        parent.insert(len(parent) if key == "-" else int(key), copy.deepcopy(value))
    elif isinstance(parent, dict):
        parent[key] = copy.deepcopy(value)
    else:
        raise ApiError(422, "Invalid", f"cannot add below a scalar at /{'/'.join(parts)}")
    return doc


def json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test)."""
    if not isinstance(operations, list):
        raise ApiError(
            400,
            "BadRequest",
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch",
        )
    doc = copy.deepcopy(doc)
    for op in operations:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        if kind == "add":
            doc = _json_patch_add(doc, parts, op.get("value"))
        elif kind == "remove":
            _json_patch_remove(doc, parts)
        elif kind == "replace":
            _json_patch_get(doc, parts)
            _json_patch_remove(doc, parts) if parts else None
            doc = _json_patch_add(doc, parts, op.get("value"))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = _json_patch_remove(doc, source) if kind == "move" else _json_patch_get(doc, source)
            doc = _json_patch_add(doc, parts, value)
        elif kind == "test":
            if _json_patch_get(doc, parts) != op.get("value"):
                raise ApiError(422, "Invalid", f"JSON patch test failed at {op.get('path')}")
        else:
            raise ApiError(422, "Invalid", f"unknown JSON patch op {kind!r}")
    return doc


#: the lists a strategic merge patch merges by a key instead of replacing (the API's
#: ``patchMergeKey``): a Node's conditions, by type
MERGE_KEYS = {("nodes", "conditions"): "type"}


def _merge_by_key(rt: ResourceType, obj: JSON, body: JSON) -> JSON:
    """``body`` with each list of :data:`MERGE_KEYS` under ``status`` merged into the
    object's by its key, as the real server's strategic merge does."""
    status = body.get("status")
    if not isinstance(status, dict):
        return body
    merged = dict(status)
    for (plural, field), key in MERGE_KEYS.items():
        items = status.get(field)
        if plural != rt.plural or not isinstance(items, list):
            continue
        current = list((obj.get("status") or {}).get(field) or [])
        for item in items:
            at = next((i for i, c in enumerate(current) if c.get(key) == item.get(key)), None)
            if at is None:
                current.append(item)
            else:
                current[at] = {**current[at], **item}
        merged[field] = current
    return {**body, "status": merged}


def apply_patch(rt: ResourceType, obj: JSON, content_type: str, body: Any) -> JSON:
    if content_type == "application/strategic-merge-patch+json" and rt.group:
        raise ApiError(415, "UnsupportedMediaType", "strategic merge patch is not supported for custom resources")
    if content_type == "application/json-patch+json":
        return json_patch(obj, body)
    if content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
        if content_type == "application/strategic-merge-patch+json":
            body = _merge_by_key(rt, obj, body)
        return merge_patch(obj, body)
    raise ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: "
        f"application/json-patch+json, application/merge-patch+json, "
        f"application/strategic-merge-patch+json (got {content_type!r})",
    )


# -- the store ---------------------------------------------------------------------------


def _now() -> str:
    return kubetime.format_time(time.time())


class Store:
    """Objects by (plural, namespace, name), one resourceVersion counter, an event log."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.objects: dict[tuple[str, str, str], JSON] = {}
        self.log: list[_Event] = []
        self.rv = 100
        self.compacted_rv = 0
        self.generation = 0  # bumped to end every open watch
        self.changes: dict[str, int] = {}  # plural -> events so far (what a cached list is valid for)

    def _emit(self, plural: str, type_: str, obj: JSON, old: JSON | None = None) -> None:
        self.changes[plural] = self.changes.get(plural, 0) + 1
        self.log.append(
            _Event(
                int(obj["metadata"]["resourceVersion"]),
                plural,
                type_,
                copy.deepcopy(obj),
                copy.deepcopy(old) if old else None,
            )
        )
        self.lock.notify_all()

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def list(self, plural: str, namespace: str | None) -> list[JSON]:
        return [copy.deepcopy(obj) for obj in self.view(plural, namespace)]

    def view(self, plural: str, namespace: str | None) -> list[JSON]:
        """The objects of a type, in :meth:`list`'s order, not copied: to be read under the
        lock and let go (a cached list's JSON is made from them)."""
        found = [
            (key, obj)
            for key, obj in self.objects.items()
            if key[0] == plural and (namespace is None or key[1] == namespace)
        ]
        return [obj for _, obj in sorted(found, key=lambda item: item[0])]

    def get(self, plural: str, namespace: str, name: str) -> JSON:
        obj = self.objects.get((plural, namespace, name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{plural} "{name}" not found', name=name, kind=plural)
        return obj

    def create(self, plural: str, namespace: str, obj: JSON) -> JSON:
        rt = RESOURCES[plural]
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", f"{rt.kind}: metadata.name: Required value")
        if rt.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        key = (plural, meta.get("namespace", ""), name)
        if key in self.objects:
            raise ApiError(409, "AlreadyExists", f'{plural} "{name}" already exists', name=name, kind=plural)
        obj["kind"], obj["apiVersion"] = rt.kind, rt.api_version
        if rt.validate is not None:
            obj = rt.validate(obj)
            meta = obj["metadata"]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), resourceVersion=self._next_rv())
        if rt.generation:
            meta["generation"] = 1
        self.objects[key] = obj
        self._emit(plural, "ADDED", obj)
        return copy.deepcopy(obj)

    def update(self, plural: str, namespace: str, name: str, new: JSON, *, subresource: str | None) -> JSON:
        """Store ``new`` as the object (the result of a PUT or patch), with API rules."""
        rt = RESOURCES[plural]
        old = self.get(plural, namespace, name)
        wanted_rv = (new.get("metadata") or {}).get("resourceVersion")
        if wanted_rv and wanted_rv != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {plural} "{name}": the object has been '
                f"modified; please apply your changes to the latest version and try again",
                name=name,
                kind=plural,
            )
        new = copy.deepcopy(new)
        if subresource == "*":  # a test hook: the whole object, status included
            result = new
        elif subresource == "status":
            result = copy.deepcopy(old)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
        else:
            result = new
            if rt.status_subresource:
                if "status" in old:
                    result["status"] = copy.deepcopy(old["status"])
                else:
                    result.pop("status", None)
        meta = result.setdefault("metadata", {})
        for immutable in ("name", "namespace", "uid", "creationTimestamp", "generation"):
            if immutable in old["metadata"]:
                meta[immutable] = old["metadata"][immutable]
        meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        result["kind"], result["apiVersion"] = rt.kind, rt.api_version
        if rt.validate is not None:
            result = rt.validate(result)
        if result == old:
            return copy.deepcopy(old)  # a no-op write: same resourceVersion, no event
        if rt.generation and result.get("spec") != old.get("spec"):
            meta["generation"] = old["metadata"].get("generation", 1) + 1
        meta["resourceVersion"] = self._next_rv()
        self.objects[(plural, namespace, name)] = result
        self._emit(plural, "MODIFIED", result, old)
        return copy.deepcopy(result)

    def delete(self, plural: str, namespace: str, name: str) -> JSON:
        obj = self.get(plural, namespace, name)
        del self.objects[(plural, namespace, name)]
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._emit(plural, "DELETED", obj)
        uid = obj["metadata"].get("uid")
        owned = [
            key
            for key, other in self.objects.items()
            if uid and any(ref.get("uid") == uid for ref in other["metadata"].get("ownerReferences") or ())
        ]
        for key in owned:  # the garbage collector's cascade, at once
            if key in self.objects:
                self.delete(*key)
        return obj


# -- HTTP --------------------------------------------------------------------------------

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<namespace>[^/]+))?/(?P<plural>[^/]+)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>status|eviction))?$"
)


@dataclass
class _Target:
    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


def _parse_path(path: str) -> _Target:
    match = _PATH.match(path)
    rt = None
    if match is not None:
        group = match.group("group") or ""
        version = match.group("core") or match.group("version")
        found = [r for r in RESOURCES.values() if (r.url_plural or r.plural) == match.group("plural")]
        rt = next((r for r in found if (r.group, r.version) == (group, version)), found[0] if found else None)
    if match is None or rt is None:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    if match.group("sub") == "eviction" and (rt.plural != "pods" or not match.group("name")):
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    if match.group("sub") == "status" and not rt.status_subresource:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    if (group, version) != (rt.group, rt.version) or (match.group("namespace") and not rt.namespaced):
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    return _Target(rt, match.group("namespace"), match.group("name"), match.group("sub"))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer
    # Headers and body go out in two writes: with Nagle's algorithm on, each keep-alive
    # reply waited for the client's delayed ACK (~40 ms a request), as a real API server does not.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence stderr
        pass

    # every verb goes through one dispatcher
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        fake = self.server.fake
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip() or None
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = raw.decode("utf-8", "replace")
        recorded = RecordedRequest(method, url.path, query, content_type, body)
        try:
            fake._record(recorded)
            fake._fault(recorded)
            if fake.write_latency and method != "GET":
                time.sleep(fake.write_latency)
            if url.path == "/version":
                self._send(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-fake"})
                return
            if isinstance(body, str):
                raise ApiError(400, "BadRequest", "the request body is not valid JSON")
            target = _parse_path(url.path)
            if method == "GET" and target.name is None and query.get("watch") in ("true", "1"):
                self._watch(target, query)
                return
            if method == "GET" and target.name is None and fake.list_cache:
                self._send_bytes(200, fake.list_bytes(target, query))
                return
            status, payload = fake._handle(method, target, query, content_type, body)
            self._send(status, payload)
        except ApiError as exc:
            self._send(exc.code, exc.status())

    def _send(self, status: int, payload: JSON) -> None:
        self._send_bytes(status, json.dumps(payload).encode())

    def _send_bytes(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, event: JSON) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _watch(self, target: _Target, query: dict[str, str]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            events_of = self.server.fake._watch_events(target, query, self._client_gone)
            with contextlib.closing(events_of) as events:
                for event in events:
                    self._chunk(event)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    def _client_gone(self) -> bool:
        """True when the client closed its end (a watch it stopped, a dropped connection)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], fake: FakeApiServer) -> None:
        self.fake = fake
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away before its answer (a watch closed, a process stopped)
        is not an error of the server's: only anything else is printed."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)

    def drop_connections(self) -> None:
        with self.connections_lock:
            connections = list(self.connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


# -- the fake server ---------------------------------------------------------------------


class FakeApiServer:
    """The fake API server; use as a context manager or call :meth:`start` / :meth:`stop`.

    ``bookmark_interval`` (seconds) makes every watch that asked for bookmarks receive one
    that often; without it, bookmarks are sent only by :meth:`send_bookmarks`.
    ``list_cache`` (the benchmarks): a list's JSON is made once per change of its resource
    type and served from those bytes, as the real API server serves lists from its watch
    cache, so that a client listing 15,000 Nodes times itself rather than this server's
    copying and encoding of them. ``write_latency`` (seconds, the benchmarks): every write
    (POST, PUT, PATCH, DELETE) is answered that much later, as a real API server's round
    trip to etcd takes milliseconds.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        bookmark_interval: float | None = None,
        list_cache: bool = False,
        write_latency: float = 0.0,
    ) -> None:
        self.store = Store()
        self.list_cache = list_cache
        self.write_latency = write_latency
        self._lists: dict[tuple[str, str | None, tuple[tuple[str, str], ...]], tuple[int, bytes]] = {}
        self._pages: dict[str, tuple[str, list[JSON], int]] = {}  # continue token -> the list's snapshot
        self.port = port
        self.bookmark_interval = bookmark_interval
        self.requests: list[RecordedRequest] = []
        self.open_watches = 0
        self.evictions: list[str] = []  # "namespace/name" of every pod evicted
        self.blocked_evictions: set[str] = set()  # pods a PodDisruptionBudget protects (429)
        self._bookmark_generation = 0
        self._httpd: _HTTPServer | None = None
        # while stopped, the port stays bound and refuses connections: nothing else (another
        # test's server, a client's outgoing connection) takes it before the next start
        self._port_held: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._faults: list[tuple[Callable[[RecordedRequest], bool], int | None]] = []
        self._fault_lock = threading.Lock()
        self._healed = threading.Event()
        self._healed.set()

    # -- life cycle

    def __enter__(self) -> FakeApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._release_port()  # done with it

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start serving (again, on the same port after a :meth:`stop`)."""
        deadline = time.monotonic() + 5
        while True:
            try:
                self._httpd = _HTTPServer(("127.0.0.1", self.port), self)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self._release_port()  # the server is bound beside it (both reuse the address)
        self.port = self._httpd.server_address[1]
        self._stopping = False
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-apiserver-{self.port}",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and drop every connection, as an API server restart does."""
        if self._httpd is None:
            return
        with self.store.lock:
            self._stopping = True
            self.store.lock.notify_all()
        self._healed.set()  # hanging requests end with the server
        self._httpd.shutdown()
        self._httpd.drop_connections()
        self._httpd.server_close()
        self._port_held = port_holder(self.port, "127.0.0.1")
        assert self._thread is not None
        self._thread.join(timeout=5)
        self._httpd = None

    def _release_port(self) -> None:
        if self._port_held is not None:
            self._port_held.close()
            self._port_held = None

    def restart(self, *, forget_history: bool = False) -> None:
        """Stop and start on the same port; ``forget_history`` also forces ``410 Gone``."""
        self.stop()
        if forget_history:
            self.compact()
        self.start()

    def configuration(self) -> Any:
        """A ``kubernetes.client.Configuration`` pointing at this server."""
        from kubernetes import client

        config = client.Configuration()
        config.host = self.url
        return config

    def api_client(self) -> Any:
        from kubernetes import client

        return client.ApiClient(self.configuration())

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig at ``path`` whose current context is this server (with a token it
        does not check): what a process under test is given as ``KUBECONFIG``."""
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "t"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        }  # fmt: skip
        path.write_text(json.dumps(config))  # JSON is YAML
        return path

    # -- objects (test side; these send watch events like API writes do)

    def create(self, obj: JSON) -> JSON:
        plural = _plural_of(obj)
        with self.store.lock:
            return self.store.create(plural, obj.get("metadata", {}).get("namespace", ""), obj)

    def get(self, plural: str, name: str, namespace: str = "") -> JSON | None:
        namespace = namespace or ("default" if RESOURCES[plural].namespaced else "")
        with self.store.lock:
            obj = self.store.objects.get((plural, namespace, name))
            return copy.deepcopy(obj) if obj else None

    def list(self, plural: str) -> list[JSON]:
        with self.store.lock:
            return self.store.list(plural, None)

    def patch(
        self, plural: str, name: str, patch: JSON, namespace: str = "", *, subresource: str | None = None
    ) -> JSON:
        """Merge-patch an object, status included (``subresource`` applies the API's rules)."""
        namespace = namespace or ("default" if RESOURCES[plural].namespaced else "")
        with self.store.lock:
            new = merge_patch(self.store.get(plural, namespace, name), patch)
            return self.store.update(plural, namespace, name, new, subresource=subresource or "*")

    def delete(self, plural: str, name: str, namespace: str = "") -> JSON:
        namespace = namespace or ("default" if RESOURCES[plural].namespaced else "")
        with self.store.lock:
            return self.store.delete(plural, namespace, name)

    # -- watch hooks

    def inject_event(self, plural: str, type_: str, obj: JSON) -> None:
        """Send a raw event to every matching watch without changing the store."""
        with self.store.lock:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            meta.setdefault("resourceVersion", self.store._next_rv())
            self.store._emit(plural, type_, obj)

    def send_bookmarks(self) -> None:
        """Send a BOOKMARK with the current resourceVersion to watches that allow them."""
        with self.store.lock:
            self._bookmark_generation += 1
            self.store.lock.notify_all()

    def compact(self) -> None:
        """Forget history: watches from any resourceVersion up to now get ``410 Gone``."""
        with self.store.lock:
            self.store.compacted_rv = self.store.rv + 1
            self.store.rv += 1
            self.store.generation += 1
            self.store.lock.notify_all()

    def close_watches(self) -> None:
        """End every open watch stream cleanly, as the API server's watch timeout does."""
        with self.store.lock:
            self.store.generation += 1
            self.store.lock.notify_all()

    # -- what clients sent

    # -- faults (test side): an API server that hangs or fails

    def hang(self, predicate: Callable[[RecordedRequest], bool] = lambda r: True) -> None:
        """Matching requests get no answer until :meth:`heal` (or :meth:`stop`)."""
        with self._fault_lock:
            self._faults.append((predicate, None))
            self._healed.clear()

    def fail(self, predicate: Callable[[RecordedRequest], bool] = lambda r: True, code: int = 500) -> None:
        """Matching requests are answered ``code`` with a Status until :meth:`heal`."""
        with self._fault_lock:
            self._faults.append((predicate, code))

    def heal(self) -> None:
        """End every fault; hanging requests are then served."""
        with self._fault_lock:
            self._faults.clear()
            self._healed.set()

    def _fault(self, request: RecordedRequest) -> None:
        with self._fault_lock:
            matching = [code for predicate, code in self._faults if predicate(request)]
        if not matching:
            return
        if matching[0] is not None:
            raise ApiError(matching[0], "InternalError" if matching[0] >= 500 else "BadRequest", "injected fault")
        self._healed.wait(timeout=120)

    def _record(self, request: RecordedRequest) -> None:
        with self.store.lock:
            if self._stopping:
                # a connection accepted just before stop(), handled after it: a stopped API
                # server answers nothing, and nothing it was asked after the stop counts
                raise ApiError(503, "ServiceUnavailable", "the API server is stopping")
            self.requests.append(request)
            self.store.lock.notify_all()

    def requests_matching(
        self, method: str, path: str | None = None, *, watch: bool | None = None
    ) -> list[RecordedRequest]:
        with self.store.lock:
            return [
                r
                for r in self.requests
                if r.method == method and (path is None or r.path == path) and (watch is None or r.is_watch == watch)
            ]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
        """Wait until ``predicate()`` holds (re-checked on every request and event)."""
        deadline = time.monotonic() + timeout
        with self.store.lock:
            while True:
                self.store.lock.release()
                try:
                    if predicate():
                        return
                finally:
                    self.store.lock.acquire()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
                self.store.lock.wait(min(remaining, 0.05))

    # -- server side of the verbs

    def _handle(
        self, method: str, target: _Target, query: dict[str, str], content_type: str | None, body: Any
    ) -> tuple[int, JSON]:
        rt, ns = target.rt, target.namespace or ""
        with self.store.lock:
            if target.name is None:
                if method == "GET":
                    return 200, self._list(target, query)
                if method == "POST":
                    if not isinstance(body, dict):
                        raise ApiError(400, "BadRequest", "the request body must be an object")
                    return 201, self.store.create(rt.plural, ns, body)
                raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on a collection")
            if target.subresource == "eviction":
                return self._evict(method, ns, target.name, body)
            if method == "GET":
                return 200, copy.deepcopy(self.store.get(rt.plural, ns, target.name))
            if method == "DELETE":
                return 200, self.store.delete(rt.plural, ns, target.name)
            if method == "PUT":
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "the request body must be an object")
                _check_pod(target, self.store.get(rt.plural, ns, target.name), body)
                return 200, self.store.update(rt.plural, ns, target.name, body, subresource=target.subresource)
            if method == "PATCH":
                old = self.store.get(rt.plural, ns, target.name)
                new = apply_patch(rt, old, content_type or "", body)
                _check_pod(target, old, new)
                return 200, self.store.update(rt.plural, ns, target.name, new, subresource=target.subresource)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed here")

    def _evict(self, method: str, ns: str, name: str, body: Any) -> tuple[int, JSON]:
        """POST pods/NAME/eviction (policy/v1 Eviction): the pod is deleted, unless
        ``blocked_evictions`` names it (a PodDisruptionBudget's 429). Records every eviction."""
        if method != "POST":
            raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on pods/eviction")
        if not isinstance(body, dict) or body.get("kind") != "Eviction":
            raise ApiError(400, "BadRequest", "the request body must be an Eviction")
        self.store.get("pods", ns, name)  # 404 when gone
        if f"{ns}/{name}" in self.blocked_evictions:
            raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.")
        self.store.delete("pods", ns, name)
        self.evictions.append(f"{ns}/{name}")
        return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}

    def list_bytes(self, target: _Target, query: dict[str, str]) -> bytes:
        """A list's JSON, made again only after its resource type changed (``list_cache``)."""
        key = (target.rt.plural, target.namespace, tuple(sorted(query.items())))
        with self.store.lock:
            stamp = self.store.changes.get(target.rt.plural, 0)
            cached = self._lists.get(key)
            if cached is not None and cached[0] == stamp:
                return cached[1]
            # serialised at once under the lock: the stored objects need no copy
            data = json.dumps(self._list(target, query, copied=False)).encode()
            self._lists[key] = (stamp, data)
            return data

    def _list(self, target: _Target, query: dict[str, str], *, copied: bool = True) -> JSON:
        """A list; in pages of ``limit`` (with ``continue`` tokens, each page of one snapshot, as
        etcd serves them) unless ``resourceVersion=0`` asks for the watch cache, which sends it
        whole."""
        token = query.get("continue")
        if token:
            found = self._pages.get(token)
            if found is None:
                raise ApiError(410, "Expired", "the continue token is too old")
            version, items, offset = found
        else:
            objects = (self.store.list if copied else self.store.view)(target.rt.plural, target.namespace)
            version, items, offset = str(self.store.rv), [obj for obj in objects if self._matches(obj, query)], 0
        limit = query.get("limit", "")
        size = int(limit) if limit.isdigit() and int(limit) > 0 and query.get("resourceVersion") != "0" else 0
        meta: JSON = {"resourceVersion": version}
        if size and offset + size < len(items):
            if not token and not copied:  # the later pages are served from this snapshot
                items = copy.deepcopy(items)
            following = uuid.uuid4().hex
            self._pages[following] = (version, items, offset + size)
            while len(self._pages) > PAGES_KEPT:
                self._pages.pop(next(iter(self._pages)))
            meta.update({"continue": following, "remainingItemCount": len(items) - offset - size})
            items = items[offset : offset + size]
        else:
            items = items[offset:]
        return {"kind": f"{target.rt.kind}List", "apiVersion": target.rt.api_version, "metadata": meta, "items": items}

    @staticmethod
    def _matches(obj: JSON, query: dict[str, str]) -> bool:
        return label_selector_matches(
            query.get("labelSelector"), obj["metadata"].get("labels")
        ) and field_selector_matches(query.get("fieldSelector"), obj)

    def _watch_events(
        self, target: _Target, query: dict[str, str], client_gone: Callable[[], bool] = lambda: False
    ) -> Iterator[JSON]:
        """The events of one watch stream, blocking between them; ends on timeout/stop."""
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        deadline = time.monotonic() + timeout if timeout else None
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        rt = target.rt
        lock = self.store.lock
        with lock:
            self.open_watches += 1
            try:
                yield from self._watch_locked(target, query, deadline, bookmarks, rt, client_gone)
            finally:
                self.open_watches -= 1
                lock.notify_all()

    def _watch_locked(
        self,
        target: _Target,
        query: dict[str, str],
        deadline: float | None,
        bookmarks: bool,
        rt: ResourceType,
        client_gone: Callable[[], bool],
    ) -> Iterator[JSON]:
        lock, store = self.store.lock, self.store
        start_rv = query.get("resourceVersion") or "0"
        generation, bookmark_generation = store.generation, self._bookmark_generation
        try:
            since = int(start_rv)
        except ValueError:
            raise ApiError(400, "BadRequest", f"invalid resourceVersion {start_rv!r}") from None
        if since != 0 and since < store.compacted_rv:
            yield {
                "type": "ERROR",
                "object": ApiError(
                    410, "Expired", f"too old resource version: {since} ({store.compacted_rv})"
                ).status(),
            }
            return
        if since == 0:  # a snapshot first, taken with the lock held, then what follows it
            snapshot = [obj for obj in store.list(rt.plural, target.namespace) if self._matches(obj, query)]
            since = store.rv
            for obj in snapshot:
                yield from self._unlocked({"type": "ADDED", "object": obj})
        position = next((i for i, e in enumerate(store.log) if e.rv > since), len(store.log))
        last_bookmark = time.monotonic()
        while True:
            if self._stopping or store.generation != generation or client_gone():
                return
            if deadline is not None and time.monotonic() >= deadline:
                return
            while position < len(store.log):
                event = store.log[position]
                position += 1
                out = self._project(event, target, query)
                if out is not None:
                    yield from self._unlocked(out)
            now = time.monotonic()
            due = self.bookmark_interval is not None and now - last_bookmark >= self.bookmark_interval
            if bookmarks and (bookmark_generation != self._bookmark_generation or due):
                bookmark_generation, last_bookmark = self._bookmark_generation, now
                yield from self._unlocked(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": rt.kind,
                            "apiVersion": rt.api_version,
                            "metadata": {"resourceVersion": str(store.rv)},
                        },
                    }
                )
                continue
            wait = 0.25 if deadline is None else max(0.0, min(0.25, deadline - time.monotonic()))
            lock.wait(wait)

    def _unlocked(self, event: JSON) -> Iterator[JSON]:
        """Yield with the store lock released, so a slow client never blocks the server."""
        self.store.lock.release()
        try:
            yield event
        finally:
            self.store.lock.acquire()

    def _project(self, event: _Event, target: _Target, query: dict[str, str]) -> JSON | None:
        """The event this watch sees, with selector transitions, or None."""
        if event.plural != target.rt.plural:
            return None
        ns = event.obj.get("metadata", {}).get("namespace", "")
        if target.namespace is not None and ns != target.namespace:
            return None
        matches_now = self._matches(event.obj, query)
        if event.type == "MODIFIED" and event.old is not None:
            matched_before = self._matches(event.old, query)
            if matched_before and not matches_now:
                return {"type": "DELETED", "object": event.obj}
            if matches_now and not matched_before:
                return {"type": "ADDED", "object": event.obj}
        if event.type in ("ADDED", "MODIFIED", "DELETED") and not matches_now:
            return None
        return {"type": event.type, "object": event.obj}


def _check_pod(target: _Target, old: JSON, new: JSON) -> None:
    """A client's write of a pod's spec keeps the API server's pod update rules (:mod:`tools.support.podrules`)."""
    if target.rt.plural == "pods" and target.subresource is None:
        try:
            check_pod_update(old, new)
        except PodUpdateRefused as exc:
            raise ApiError(422, "Invalid", exc.message, name=target.name, kind="Pod") from None


def _plural_of(obj: JSON) -> str:
    for plural, rt in RESOURCES.items():
        if rt.kind == obj.get("kind") and obj.get("apiVersion") in (None, rt.api_version):
            return plural
    raise ValueError(f"unknown kind {obj.get('kind')!r}; known: {sorted(RESOURCES)}")


# -- builders ----------------------------------------------------------------------------


def make_node(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    gpus: int = 8,
    extra_allocatable: dict[str, str] | None = None,
    address: str | None = None,
) -> JSON:
    """A realistic GPU Node as kubelet registers it; ``address``: its InternalIP (what a peer
    lookup of the cluster's inventories reaches its agent at)."""
    allocatable = {
        "cpu": "96",
        "memory": "1056345988Ki",
        "pods": "110",
        "ephemeral-storage": "3500000000Ki",
        "nvidia.com/gpu": str(gpus),
    }
    allocatable.update(extra_allocatable or {})
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "nvidia.com/gpu.present": "true",
                **(labels or {}),
            },
            "annotations": dict(annotations or {}),
        },
        "spec": {"podCIDR": "10.244.1.0/24"},
        "status": {
            **(
                {"addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}]}
                if address
                else {}
            ),
            "capacity": dict(allocatable),
            "allocatable": allocatable,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "lastHeartbeatTime": _now(),
                    "lastTransitionTime": _now(),
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": "b",
                "containerRuntimeVersion": "containerd://1.7.13",
                "kernelVersion": "5.15.0",
                "kubeProxyVersion": "v1.31.0",
                "kubeletVersion": "v1.31.0",
                "machineID": "m",
                "operatingSystem": "linux",
                "osImage": "Ubuntu 22.04.4 LTS",
                "systemUUID": "s",
            },
        },
    }


def make_pod(
    name: str,
    *,
    namespace: str = "default",
    node_name: str | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    gpus: int = 0,
    phase: str = "Pending",
    init_containers: Iterable[JSON] = (),
    scheduler_name: str = "default-scheduler",
) -> JSON:
    """A realistic training Pod, as a user submits it (plus ``nodeName`` once bound)."""
    resources: JSON = (
        {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    )
    spec: JSON = {
        "containers": [
            {
                "name": "train",
                "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "command": ["python", "train.py"],
                "resources": resources,
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Never",
        "schedulerName": scheduler_name,
        "serviceAccountName": "default",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "securityContext": {},
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],
    }
    if init_containers:
        spec["initContainers"] = list(init_containers)
    if node_name:
        spec["nodeName"] = node_name
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {"phase": phase, "qosClass": "BestEffort"},
    }


def make_lease(
    name: str,
    *,
    namespace: str = "default",
    holder: str | None = None,
    duration_s: int | None = None,
    renew_time: str | None = None,
) -> JSON:
    """A ``coordination.k8s.io/v1`` Lease."""
    spec: JSON = {}
    if holder is not None:
        spec["holderIdentity"] = holder
    if duration_s is not None:
        spec["leaseDurationSeconds"] = duration_s
    if renew_time is not None:
        spec["acquireTime"] = spec["renewTime"] = renew_time
    return {
        "kind": "Lease",
        "apiVersion": "coordination.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def make_dataset(
    name: str,
    *,
    namespace: str = "default",
    source: str = "s3://bucket/data",
    bundles: str | None = None,
    status: JSON | None = None,
) -> JSON:
    """A ``Dataset`` custom resource."""
    spec: JSON = {"source": source}
    if bundles:
        spec["bundles"] = bundles
    obj: JSON = {
        "kind": "Dataset",
        "apiVersion": "dsagent.io/v1alpha1",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def make_nodecache(
    node: str,
    *,
    inventory: str | None = None,
    topology: str | None = None,
    published_at: str | None = None,
    node_uid: str | None = None,
) -> JSON:
    """A ``NodeCache`` as a node's agent writes it (``node_uid``: owned by that Node)."""
    from dsplatform.wire import nodecache

    state = nodecache.status(inventory, topology, published_at or _now())
    return nodecache.document(node, node_uid, state)


def pod_review(pod: JSON, *, namespace: str = "default") -> JSON:
    """The AdmissionReview (v1) the API server sends a mutating webhook for creating ``pod``
    in ``namespace``; its uid names the pod (``review-<name>``)."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"review-{pod['metadata'].get('name') or pod['metadata'].get('generateName')}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"].get("name", ""),
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
        },
    }


__all__ = [
    "ApiError",
    "FakeApiServer",
    "RESOURCES",
    "RecordedRequest",
    "ResourceType",
    "field_selector_matches",
    "json_patch",
    "make_nodecache",
    "label_selector_matches",
    "make_dataset",
    "make_lease",
    "make_node",
    "make_pod",
    "merge_patch",
    "pod_review",
]
