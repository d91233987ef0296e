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

The big payload (thousands of Node objects) never goes through a validation library,
and is never parsed into one tree: a 48 MiB body parsed whole is ~190 MiB of dicts,
which put the extender's peak at 380 MiB (the bound is 256 MB,
``tools/bench/extender_memory.py`` measures it). When the body has exactly the layout
Go's ``json.Marshal`` gives it, :func:`decode_args` does not parse the Node objects at
all: it cuts the ``items`` array into one :class:`RawNode` per node (its name,
resourceVersion and exact bytes) by searching for the only place the text
``{"metadata":{"name":"`` can occur unescaped, at the start of an item, so that nodes
already seen at the same resourceVersion cost a dictionary lookup and a filter reply
echoes their bytes unchanged. Any other JSON object (another field order, ``kind`` set,
whitespace, a node without a resourceVersion) is walked by :class:`_Walk`: the two
outer objects by hand, every value with the stdlib's C scanner, one Node at a time
over the body decoded a window at a time, so that it too becomes :class:`RawNode`s
(parsed once for their name and to check them, then dropped) and never a whole tree.
The walk answers exactly what ``json.loads`` of the whole body would have (the same
error, at the same line, column and character; the same args; the same replies, byte
for byte: its nodes are re-serialized compactly when echoed). A body that is not an
object keeps the plain ``json.loads``. Filter replies are built as a list of parts
(views of the request body, for the Go layout) that the app sends a batch at a time,
so no copy of the echoed nodes is ever made whole.
This module owns the format and its encoding; decoding a body is :mod:`scheduler_plugin.decode`'s.
:mod:`scheduler_plugin.app` calls both.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from json.encoder import encode_basestring_ascii as _quote
from typing import Any, Literal, NamedTuple, cast

from dsplatform.boundedjson import DuplicateKey, unique_keys
from scheduler_plugin.errors import InvalidRequest
from scheduling.kubeobjects import Node, Pod

MIN_SCORE = 0
MAX_SCORE = 10


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
            node = json.loads(bytes(self.raw), object_pairs_hook=unique_keys)
        except RecursionError:  # the C scanner's own bound on nesting: a clear refusal, not a traceback
            raise InvalidRequest(f"node {self.name}: nested too deeply") from None
        except DuplicateKey as exc:
            raise InvalidRequest(f"node {self.name}: {exc}") from None
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
    #: the raw nodes' bytes are Go's compact JSON, echoed as they are; False (any other
    #: layout): a filter reply re-serializes them compactly, as a parse of the whole body did
    echo_raw: bool = True

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


class BodyNotJson(InvalidRequest):
    """A verb's body that is not a JSON object: never one kube-scheduler sends, so it is
    answered 400 (not the verbs' 200 with ``Error`` set) and says which of the two it is."""

    code = "invalid_json"


def not_json(exc: Exception) -> BodyNotJson:
    reason = " ".join(str(exc).split())[:200]  # one line
    return BodyNotJson(f"request body is not JSON: {reason}", hint="send ExtenderArgs, a JSON object with a Pod")


def duplicate(exc: DuplicateKey) -> BodyNotJson:
    """A body with a key twice in one object: ``json.loads`` would keep the last silently,
    Go's decoder too; no kube-scheduler sends one, so it is refused (400) naming the key."""
    return BodyNotJson(f"request body: {exc}", hint="send each key once per object")


def not_an_object(kind: str) -> BodyNotJson:
    return BodyNotJson(
        f"request body is JSON but not an object: got {kind}", hint="send ExtenderArgs, a JSON object with a Pod"
    )


def json_kind(doc: Any) -> str:
    if isinstance(doc, list):
        return "an array"
    if isinstance(doc, str):
        return "a string"
    if doc is None:
        return "null"
    if isinstance(doc, bool):
        return "a boolean"
    return "a number"


def pod_of(doc: Mapping[str, Any]) -> Pod:
    """ExtenderArgs' Pod, which must be an object."""
    pod = field_of(doc, "Pod")
    if not isinstance(pod, dict):
        raise InvalidRequest("ExtenderArgs.Pod must be a v1.Pod object")
    return cast(Pod, pod)


def args_of(doc: Any) -> ExtenderArgs:
    if not isinstance(doc, dict):
        raise not_an_object(json_kind(doc))
    pod = pod_of(doc)
    raw_nodes, raw_names = field_of(doc, "Nodes"), field_of(doc, "NodeNames")
    if raw_names is not None:
        return ExtenderArgs(pod, None, decode_names(raw_names))
    if raw_nodes is not None:
        return ExtenderArgs(pod, decode_node_list(raw_nodes), None)
    raise InvalidRequest("ExtenderArgs has neither Nodes nor NodeNames")


def field_of(doc: Mapping[str, Any], name: str) -> Any:
    # Go's encoding/json matches keys case-insensitively; kube-scheduler sends PascalCase.
    if name in doc:
        return doc[name]
    lowered = name.lower()
    for key, value in doc.items():
        if key.lower() == lowered:
            return value
    return None


def decode_names(raw: Any) -> list[str]:
    # Both checks run in C: join refuses an item that is not a str, and all() then finds
    # an empty name (~0.1 ms at 15,000 names, against ~0.25 ms for a set of the types).
    if not isinstance(raw, list):
        raise InvalidRequest("ExtenderArgs.NodeNames must be a list of node names")
    try:
        "".join(raw)
    except TypeError:
        raise InvalidRequest("ExtenderArgs.NodeNames must be a list of node names") from None
    if not all(raw):
        raise InvalidRequest("ExtenderArgs.NodeNames must be a list of node names")
    return raw


def decode_node_list(raw: Any) -> list[Node]:
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
        names = field_of(doc, "NodeNames") if isinstance(doc, dict) else None
        if isinstance(names, list):
            return [n for n in names if isinstance(n, str)]
        items = (field_of(doc, "Nodes") or {}).get("items") if isinstance(doc, dict) else None
        return [i["metadata"]["name"] for i in items or () if isinstance(i.get("metadata", {}).get("name"), str)]
    except Exception:  # salvage only: a body this broken gets an empty list
        return []


def encode_filter_result(*args: Any, **kwargs: Any) -> bytes:
    """An ``ExtenderFilterResult`` that sets the node field the request used: the parts of
    :func:`filter_result_parts` (the same arguments) joined.

    ``passed`` are node names; in ``Nodes`` mode the request's own Node objects are
    echoed back, because older kube-schedulers use the returned objects themselves.
    """
    return b"".join(filter_result_parts(*args, **kwargs))


def filter_result_parts(
    args: ExtenderArgs | None,
    passed: Iterable[str] = (),
    failed: Mapping[str, str] | None = None,
    unresolvable: Mapping[str, str] | None = None,
    error: str = "",
) -> list[bytes | memoryview]:
    """:func:`encode_filter_result` as the parts whose concatenation it is: the echoed
    raw nodes are views of the request body, so the app sends them a batch at a time
    instead of copying ~48 MiB of nodes into one reply (or more: each copy on the way)."""
    result: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": dict(failed or {}),
        "FailedAndUnresolvableNodes": dict(unresolvable or {}),
        "Error": error,
    }
    if args is not None and args.raw_nodes is not None:
        keep = set(passed)
        result["Nodes"] = {"metadata": {}, "items": []}
        # "Nodes" is the first key, so the first `"items":[]` is its own (an unescaped
        # quote cannot occur inside the JSON strings that follow).
        head, tail = json.dumps(result, separators=(",", ":")).encode().split(b'"items":[]', 1)
        parts: list[bytes | memoryview] = [head + b'"items":[']
        for node in args.raw_nodes:
            if node.name in keep:
                # re-serialized one at a time as json.dumps of a parsed body wrote them
                parts.append(node.raw if args.echo_raw else _compact(node.raw))
                parts.append(b",")
        if len(parts) > 1:
            parts.pop()
        parts.append(b"]" + tail)
        return parts
    if args is not None:
        keep = set(passed)
        if args.nodes is not None:
            items = [node for node in args.nodes if node["metadata"]["name"] in keep]
            result["Nodes"] = {"metadata": {}, "items": items}
        else:
            result["NodeNames"] = [name for name in args.node_names or () if name in keep]
    return [json.dumps(result, separators=(",", ":")).encode()]


def _compact(raw: memoryview) -> bytes:
    return json.dumps(json.loads(bytes(raw)), separators=(",", ":")).encode()


class Clamped(list[int]):
    """Scores known to be ints within kube-scheduler's 0..10 (the names-only path builds
    them from a table of such values): :func:`encode_priorities` then skips its checks,
    three passes over the scores (~0.4 ms at 15,000 nodes)."""


def encode_priorities(hosts: Sequence[str], scores: Sequence[int]) -> bytes:
    """A ``HostPriorityList``: integer scores clamped to kube-scheduler's 0..10."""
    # Formatted directly from a table of the eleven possible score tails and each host's
    # escaped ``{"Host":"name"`` head, all in C: 3x faster than json.dumps of a list of
    # dicts, which matters at 5,000 nodes. The heads are kept between requests (the same
    # nodes are scored again and again: escaping 5,000 names was ~1.5 ms of a ~3.4 ms
    # encode); the table is bounded and starts afresh when full. Each tail carries the
    # comma after it, and head and tail are joined as they come (no string per host):
    # the last comma is cut from the bytes.
    if not isinstance(scores, Clamped) and (
        not set(map(type, scores)) <= {int} or (scores and (min(scores) < MIN_SCORE or max(scores) > MAX_SCORE))
    ):
        scores = [MAX_SCORE if s > MAX_SCORE else MIN_SCORE if s < MIN_SCORE else int(s) for s in scores]
    if not hosts:
        return b"[]"
    try:
        heads = list(map(_HEADS.__getitem__, hosts))
    except KeyError:
        if len(_HEADS) + len(hosts) > _MAX_HEADS:
            _HEADS.clear()
        heads = list(map(_head, hosts))
    text = "".join(chain.from_iterable(zip(heads, map(_SCORE_TAILS.__getitem__, scores))))
    return b"[" + text.encode()[:-1] + b"]"


def _head(host: str) -> str:
    head = _HEADS.get(host)
    if head is None:
        head = _HEADS[host] = _HOST + _quote(host)
    return head


_HOST = '{"Host":'
_SCORE_TAILS = [f',"Score":{score}}},' for score in range(MAX_SCORE + 1)]
_HEADS: dict[str, str] = {}  # host name -> '{"Host":"<name escaped>"', shared by every request
_MAX_HEADS = 65_536


__all__ = [
    "MAX_SCORE",
    "MIN_SCORE",
    "BodyNotJson",
    "ExtenderArgs",
    "Node",
    "NodeField",
    "Pod",
    "RawNode",
    "args_of",
    "decode_names",
    "decode_node_list",
    "field_of",
    "json_kind",
    "not_an_object",
    "not_json",
    "pod_of",
    "encode_filter_result",
    "Clamped",
    "encode_priorities",
    "filter_result_parts",
]
