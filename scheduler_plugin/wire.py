"""The kube-scheduler extender wire format (``k8s.io/kube-scheduler/extender/v1``).

kube-scheduler's ``HTTPExtender`` marshals Go structs without JSON tags, so the field
names on the wire are the Go names in PascalCase::

    ExtenderArgs          {"Pod": v1.Pod, "Nodes": v1.NodeList | null, "NodeNames": [str] | null}
    ExtenderFilterResult  {"Nodes": v1.NodeList | null, "NodeNames": [str] | null,
                           "FailedNodes": {name: reason}, "FailedAndUnresolvableNodes": {...},
                           "Error": str}
    HostPriorityList      [{"Host": str, "Score": int64 0..10}]

With ``nodeCacheCapable: false`` kube-scheduler fills ``Nodes`` (whole Node objects;
``items`` is ``null`` when empty) and leaves ``NodeNames`` null; with ``true`` the
reverse. A filter reply must set the same field, or kube-scheduler reads it as "no node
passed". Go's decoder matches field names case-insensitively, so this module does too.

The big payload (thousands of Node objects) is parsed with the stdlib ``json`` into
plain dicts typed as the ``TypedDict``s below; no validation library runs over it.
This module owns decoding and encoding only; :mod:`scheduler_plugin.app` calls it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _quote
from typing import Any, Literal, TypedDict, cast

from scheduler_plugin.errors import InvalidRequest

try:  # orjson, when installed, parses 5,000-node bodies several times faster
    from orjson import loads as _loads
except ImportError:  # the stdlib parser is the default
    from json import loads as _loads

MIN_SCORE = 0
MAX_SCORE = 10


class ObjectMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    labels: dict[str, str]
    annotations: dict[str, str]


class ResourceRequirements(TypedDict, total=False):
    requests: dict[str, str]
    limits: dict[str, str]


class Container(TypedDict, total=False):
    name: str
    resources: ResourceRequirements


class PodSpec(TypedDict, total=False):
    nodeName: str
    containers: list[Container]
    initContainers: list[Container]


class PodStatus(TypedDict, total=False):
    phase: str


class Pod(TypedDict, total=False):
    metadata: ObjectMeta
    spec: PodSpec
    status: PodStatus


class NodeStatus(TypedDict, total=False):
    capacity: dict[str, str]
    allocatable: dict[str, str]


class Node(TypedDict, total=False):
    metadata: ObjectMeta
    status: NodeStatus


NodeField = Literal["Nodes", "NodeNames"]


@dataclass(frozen=True)
class ExtenderArgs:
    """One decoded ``ExtenderArgs``: exactly one of ``nodes`` / ``node_names`` is set."""

    pod: Pod
    nodes: list[Node] | None
    node_names: list[str] | None

    @property
    def node_field(self) -> NodeField:
        """The field the request used, which the filter reply must use too."""
        return "Nodes" if self.nodes is not None else "NodeNames"

    @property
    def names(self) -> list[str]:
        """Candidate node names, in request order."""
        if self.node_names is not None:
            return self.node_names
        return [node["metadata"]["name"] for node in self.nodes or ()]


def decode_args(body: bytes) -> ExtenderArgs:
    """Decode a filter/prioritize request body; :class:`InvalidRequest` says what is wrong."""
    try:
        doc = _loads(body)
    except (ValueError, UnicodeDecodeError) as exc:  # orjson's error is a ValueError too
        raise InvalidRequest(f"request body is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise InvalidRequest(f"ExtenderArgs must be a JSON object, got {type(doc).__name__}")
    pod = _field(doc, "Pod")
    if not isinstance(pod, dict):
        raise InvalidRequest("ExtenderArgs.Pod must be a v1.Pod object")
    raw_nodes, raw_names = _field(doc, "Nodes"), _field(doc, "NodeNames")
    if raw_names is not None:
        return ExtenderArgs(cast(Pod, pod), None, _decode_names(raw_names))
    if raw_nodes is not None:
        return ExtenderArgs(cast(Pod, pod), _decode_node_list(raw_nodes), None)
    raise InvalidRequest("ExtenderArgs has neither Nodes nor NodeNames")


def _field(doc: Mapping[str, Any], name: str) -> Any:
    # Go's encoding/json matches keys case-insensitively; kube-scheduler sends PascalCase.
    if name in doc:
        return doc[name]
    lowered = name.lower()
    for key, value in doc.items():
        if key.lower() == lowered:
            return value
    return None


def _decode_names(raw: Any) -> list[str]:
    # set(map(type, ...)) runs in C: this check costs microseconds at 5,000 names.
    if not isinstance(raw, list) or not set(map(type, raw)) <= {str} or "" in raw:
        raise InvalidRequest("ExtenderArgs.NodeNames must be a list of node names")
    return raw


def _decode_node_list(raw: Any) -> list[Node]:
    if not isinstance(raw, dict):
        raise InvalidRequest("ExtenderArgs.Nodes must be a v1.NodeList object")
    items = raw.get("items")
    if items is None:  # Go marshals an empty slice of a fresh NodeList as null
        return []
    if not isinstance(items, list):
        raise InvalidRequest("ExtenderArgs.Nodes.items must be a list of v1.Node")
    for index, item in enumerate(items):
        meta = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
            raise InvalidRequest(f"ExtenderArgs.Nodes.items[{index}] has no metadata.name")
    return cast("list[Node]", items)


def salvage_names(body: bytes | None) -> list[str]:
    """Best effort: the candidate names of a request that failed to decode, so that a
    prioritize reply can still give each of them an explicit 0."""
    try:
        doc = json.loads(body) if body else None
        names = _field(doc, "NodeNames") if isinstance(doc, dict) else None
        if isinstance(names, list):
            return [n for n in names if isinstance(n, str)]
        items = (_field(doc, "Nodes") or {}).get("items") if isinstance(doc, dict) else None
        return [i["metadata"]["name"] for i in items or () if isinstance(i.get("metadata", {}).get("name"), str)]
    except Exception:  # salvage only: a body this broken gets an empty list
        return []


def encode_filter_result(
    args: ExtenderArgs | None,
    passed: Iterable[str] = (),
    failed: Mapping[str, str] | None = None,
    unresolvable: Mapping[str, str] | None = None,
    error: str = "",
) -> bytes:
    """An ``ExtenderFilterResult`` that sets the node field the request used.

    ``passed`` are node names; in ``Nodes`` mode the request's own Node objects are
    echoed back, because older kube-schedulers use the returned objects themselves.
    """
    result: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": dict(failed or {}),
        "FailedAndUnresolvableNodes": dict(unresolvable or {}),
        "Error": error,
    }
    if args is not None:
        keep = set(passed)
        if args.nodes is not None:
            items = [node for node in args.nodes if node["metadata"]["name"] in keep]
            result["Nodes"] = {"metadata": {}, "items": items}
        else:
            result["NodeNames"] = [name for name in args.node_names or () if name in keep]
    return json.dumps(result, separators=(",", ":")).encode()


def encode_priorities(hosts: Sequence[str], scores: Sequence[int]) -> bytes:
    """A ``HostPriorityList``: integer scores clamped to kube-scheduler's 0..10."""
    # Formatted directly (names escaped by json's own C encoder): 2-3x faster than
    # json.dumps of a list of dicts, which matters at 5,000 nodes.
    items = [
        f'{{"Host":{_quote(host)},"Score":{MAX_SCORE if s > MAX_SCORE else MIN_SCORE if s < MIN_SCORE else int(s)}}}'
        for host, s in zip(hosts, scores)
    ]
    return ("[" + ",".join(items) + "]").encode()


__all__ = [
    "MAX_SCORE",
    "MIN_SCORE",
    "Container",
    "ExtenderArgs",
    "Node",
    "NodeField",
    "NodeStatus",
    "ObjectMeta",
    "Pod",
    "PodSpec",
    "PodStatus",
    "ResourceRequirements",
    "decode_args",
    "encode_filter_result",
    "encode_priorities",
    "salvage_names",
]
