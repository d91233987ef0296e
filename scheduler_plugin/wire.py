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

The big payload (thousands of Node objects) never goes through a validation library.
When the body has exactly the layout Go's ``json.Marshal`` gives it, :func:`decode_args`
does not parse the Node objects at all: it cuts the ``items`` array into one
:class:`RawNode` per node (its name, resourceVersion and exact bytes) by searching for
the only place the text ``{"metadata":{"name":"`` can occur unescaped, at the start of
an item, so that nodes already seen at the same resourceVersion cost a dictionary
lookup and a filter reply echoes their bytes unchanged. Anything else (another field
order, ``kind`` set, whitespace, a node without a resourceVersion) takes the plain path:
the stdlib ``json`` parses everything into dicts typed as the ``TypedDict``s below.
This module owns decoding and encoding only; :mod:`scheduler_plugin.app` calls it.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _quote
from typing import Any, Literal, NamedTuple, TypedDict, cast

from scheduler_plugin.errors import InvalidRequest

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


class RawNode(NamedTuple):
    """One Node of a request, not parsed yet: its identity and its exact JSON bytes.

    A named tuple rather than a dataclass: 5,000 of them are made per request.
    """

    name: str
    resource_version: str
    raw: memoryview

    def parse(self) -> Node:
        """The Node object; :class:`InvalidRequest` when its bytes are not that node."""
        try:
            node = json.loads(bytes(self.raw))
        except RecursionError:  # the C scanner's own bound on nesting: a clear refusal, not a traceback
            raise InvalidRequest(f"node {self.name}: nested too deeply") from None
        except ValueError as exc:
            raise InvalidRequest(f"node {self.name}: not JSON: {exc}") from exc
        if not isinstance(node, dict) or (node.get("metadata") or {}).get("name") != self.name:
            raise InvalidRequest(f"node {self.name}: unexpected object")
        return cast(Node, node)


@dataclass(frozen=True)
class ExtenderArgs:
    """One decoded ``ExtenderArgs``: exactly one of ``nodes``, ``raw_nodes`` (the same
    Nodes, cut from a Go-marshaled body but not parsed) and ``node_names`` is set."""

    pod: Pod
    nodes: list[Node] | None
    node_names: list[str] | None
    raw_nodes: list[RawNode] | None = None

    @property
    def node_field(self) -> NodeField:
        """The field the request used, which the filter reply must use too."""
        return "NodeNames" if self.node_names is not None else "Nodes"

    @property
    def names(self) -> list[str]:
        """Candidate node names, in request order."""
        if self.node_names is not None:
            return self.node_names
        if self.raw_nodes is not None:
            return [node.name for node in self.raw_nodes]
        return [node["metadata"]["name"] for node in self.nodes or ()]


_POD_HEAD = b'{"Pod":'
_NODES_HEAD = b',"Nodes":{"metadata":{},"items":['
_NODES_TAIL = b']},"NodeNames":null}'
_METADATA = b'"metadata":{"name":"'
_POD_KEY = re.compile(rb'"[Pp][Oo][Dd]"\s*:')
_WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")  # what bytes.rstrip() strips
_ITEM_HEAD = re.compile(rb'\{"metadata":\{"name":"([^"\\]+)","uid":"[^"\\]*","resourceVersion":"([^"\\]+)"')


class BodyNotJson(InvalidRequest):
    """A verb's body that is not a JSON object: never one kube-scheduler sends, so it is
    answered 400 (not the verbs' 200 with ``Error`` set) and says which of the two it is."""

    code = "invalid_json"


#: bodies without a Pod key up to this size are parsed to say exactly what is wrong;
#: larger ones are judged by their first byte (a parse of megabytes holds the GIL)
_EXPLAIN_BYTES = 1 << 20
_JSON_SCALAR_START = frozenset(b'["-0123456789tfn')
_LEADING_SPACE = re.compile(rb"[ \t\n\r\x0b\x0c]*")


def decode_args(body: bytes | bytearray) -> ExtenderArgs:
    """Decode a filter/prioritize request body; :class:`InvalidRequest` says what is wrong
    (:class:`BodyNotJson` when it is not a JSON object at all)."""
    fast = _split_go_layout(body)
    if fast is not None:
        return fast
    if _POD_KEY.search(body) is None:  # a cheap scan in C before a parse of megabytes
        raise _without_pod(body)
    try:
        doc = json.loads(body)
    except RecursionError:
        raise InvalidRequest("request body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _not_json(exc) from exc
    try:
        return _args_of(doc)
    except InvalidRequest as exc:
        exc.names = salvage_from(doc)  # type: ignore[attr-defined]  # one parse per body: the names come from this one
        raise


def _not_json(exc: Exception) -> BodyNotJson:
    reason = " ".join(str(exc).split())[:200]  # one line
    return BodyNotJson(f"request body is not JSON: {reason}", hint="send ExtenderArgs, a JSON object with a Pod")


def _not_an_object(kind: str) -> BodyNotJson:
    return BodyNotJson(
        f"request body is JSON but not an object: got {kind}", hint="send ExtenderArgs, a JSON object with a Pod"
    )


def _without_pod(body: bytes | bytearray) -> InvalidRequest:
    """Why a body with no Pod key is refused: not JSON, JSON but not an object, or an
    object without a Pod. Exact for small bodies; by the first byte for large ones."""
    start = _LEADING_SPACE.match(body).end()  # type: ignore[union-attr]  # always matches
    if start >= len(body):
        return BodyNotJson("request body is empty", hint="send ExtenderArgs, a JSON object with a Pod")
    if len(body) <= _EXPLAIN_BYTES:
        try:
            doc = json.loads(body)
        except RecursionError:
            return InvalidRequest("request body is nested too deeply")
        except (ValueError, UnicodeDecodeError) as exc:
            return _not_json(exc)
        if not isinstance(doc, dict):
            return _not_an_object(_json_kind(doc))
        return InvalidRequest("ExtenderArgs has no Pod")
    first = body[start]
    if first == 0x7B:  # "{"
        return InvalidRequest("ExtenderArgs has no Pod")
    if first in _JSON_SCALAR_START:
        return _not_an_object("an array" if first == 0x5B else "a scalar")
    return BodyNotJson(f"request body is not JSON: it starts with {bytes(body[start : start + 1])!r}")


def _json_kind(doc: Any) -> str:
    if isinstance(doc, list):
        return "an array"
    if isinstance(doc, str):
        return "a string"
    if doc is None:
        return "null"
    if isinstance(doc, bool):
        return "a boolean"
    return "a number"


def _args_of(doc: Any) -> ExtenderArgs:
    if not isinstance(doc, dict):
        raise _not_an_object(_json_kind(doc))
    pod = _field(doc, "Pod")
    if not isinstance(pod, dict):
        raise InvalidRequest("ExtenderArgs.Pod must be a v1.Pod object")
    raw_nodes, raw_names = _field(doc, "Nodes"), _field(doc, "NodeNames")
    if raw_names is not None:
        return ExtenderArgs(cast(Pod, pod), None, _decode_names(raw_names))
    if raw_nodes is not None:
        return ExtenderArgs(cast(Pod, pod), _decode_node_list(raw_nodes), None)
    raise InvalidRequest("ExtenderArgs has neither Nodes nor NodeNames")


def _split_go_layout(body: bytes | bytearray) -> ExtenderArgs | None:
    """Cut a Go-marshaled ``Nodes`` request into :class:`RawNode`s; None for any other layout."""
    # Trailing whitespace is skipped, not stripped: rstrip() would copy a bytearray body.
    stop = len(body)
    while stop and body[stop - 1] in _WHITESPACE:
        stop -= 1
    if not body.startswith(_POD_HEAD) or not body.endswith(_NODES_TAIL, 0, stop):
        return None
    # `,"Nodes":{` cannot occur unescaped inside the Pod: it has no such key.
    pod_end = body.find(_NODES_HEAD, 0, stop)
    start, end = pod_end + len(_NODES_HEAD), stop - len(_NODES_TAIL)
    if pod_end < 0 or start > end:
        return None
    # Every Node has exactly one "metadata" key, and it must open the item (no "kind"
    # before it): then each match below is one node, and the items tile the array.
    starts = []
    position = body.find(_METADATA, start, end)
    while position >= 0:
        if body[position - 1] != 0x7B:  # "{"
            return None
        starts.append(position - 1)
        position = body.find(_METADATA, position + len(_METADATA), end)
    if (starts and starts[0] != start) or (not starts and start != end):
        return None
    view = memoryview(body)
    match = _ITEM_HEAD.match
    nodes = []
    last = len(starts) - 1
    for index, item_start in enumerate(starts):
        item_end = starts[index + 1] - 1 if index < last else end
        head = match(body, item_start, item_end)
        if head is None or body[item_end - 1] != 0x7D or (index < last and body[item_end] != 0x2C):  # "}" ","
            return None
        nodes.append(RawNode(head.group(1).decode(), head.group(2).decode(), view[item_start:item_end]))
    try:
        pod = json.loads(body[len(_POD_HEAD) : pod_end])
    except (ValueError, RecursionError):  # the general path says what is wrong
        return None
    if not isinstance(pod, dict):
        return None
    return ExtenderArgs(cast(Pod, pod), None, None, raw_nodes=nodes)


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


def salvage_from(doc: Any) -> list[str]:
    """The candidate names in an already parsed body (empty when there are none)."""
    try:
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
    if args is not None and args.raw_nodes is not None:
        keep = set(passed)
        echoed = b",".join([node.raw for node in args.raw_nodes if node.name in keep])
        result["Nodes"] = {"metadata": {}, "items": []}
        # "Nodes" is the first key, so the first `"items":[]` is its own (an unescaped
        # quote cannot occur inside the JSON strings that follow).
        head, tail = json.dumps(result, separators=(",", ":")).encode().split(b'"items":[]', 1)
        return head + b'"items":[' + echoed + b"]" + tail
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
    # Formatted directly (names escaped by json's own C encoder) from a table of the
    # eleven possible score tails, all in C: 3x faster than json.dumps of a list of
    # dicts, which matters at 5,000 nodes.
    if not set(map(type, scores)) <= {int} or (scores and (min(scores) < MIN_SCORE or max(scores) > MAX_SCORE)):
        scores = [MAX_SCORE if s > MAX_SCORE else MIN_SCORE if s < MIN_SCORE else int(s) for s in scores]
    items = map(operator.add, map(_HOST.__add__, map(_quote, hosts)), map(_SCORE_TAILS.__getitem__, scores))
    return ("[" + ",".join(items) + "]").encode()


_HOST = '{"Host":'
_SCORE_TAILS = [f',"Score":{score}}}' for score in range(MAX_SCORE + 1)]


__all__ = [
    "MAX_SCORE",
    "MIN_SCORE",
    "BodyNotJson",
    "Container",
    "ExtenderArgs",
    "Node",
    "NodeField",
    "NodeStatus",
    "ObjectMeta",
    "Pod",
    "PodSpec",
    "PodStatus",
    "RawNode",
    "ResourceRequirements",
    "decode_args",
    "encode_filter_result",
    "encode_priorities",
]
