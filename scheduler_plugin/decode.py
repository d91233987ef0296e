"""Decoding the extender's request bodies (:class:`~scheduler_plugin.wire.ExtenderArgs`) without
parsing thousands of Node objects into one tree (the format and the reason:
:mod:`scheduler_plugin.wire`).

Who calls it: :mod:`scheduler_plugin.app`, for every filter and prioritize body. Two paths:
:func:`split_go_layout` cuts a body in the exact layout Go's ``json.Marshal`` gives it into
one :class:`~scheduler_plugin.wire.RawNode` per node; any other JSON object is read by
:class:`_Walk`, a window at a time, answering exactly what ``json.loads`` of the whole body
would have. Encoding the replies stays in :mod:`scheduler_plugin.wire`.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable
from json.decoder import JSONDecodeError
from typing import Any, cast

from dsplatform.boundedjson import DuplicateKey, unique_keys
from scheduler_plugin.errors import InvalidRequest
from scheduler_plugin.wire import (
    BodyNotJson,
    ExtenderArgs,
    RawNode,
    args_of,
    decode_names,
    decode_node_list,
    duplicate,
    field_of,
    json_kind,
    not_an_object,
    not_json,
    pod_of,
    salvage_from,
)
from scheduling.kubeobjects import Pod

_POD_HEAD = b'{"Pod":'
_NODES_HEAD = b',"Nodes":{"metadata":{},"items":['
_NODES_TAIL = b']},"NodeNames":null}'
_METADATA = b'"metadata":{"name":"'
_POD_KEY = re.compile(rb'"[Pp][Oo][Dd]"\s*:')
_WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")  # what bytes.rstrip() strips
_ITEM_HEAD = re.compile(rb'\{"metadata":\{"name":"([^"\\]+)","uid":"[^"\\]*","resourceVersion":"([^"\\]+)"')


#: bodies without a Pod key up to this size are parsed to say exactly what is wrong;
#: larger ones are judged by their first byte (a parse of megabytes holds the GIL)
_EXPLAIN_BYTES = 1 << 20
_JSON_SCALAR_START = frozenset(b'["-0123456789tfn')
_LEADING_SPACE = re.compile(rb"[ \t\n\r\x0b\x0c]*")
_JSON_SPACE = re.compile(rb"[ \t\n\r]*")  # what json.loads skips


def decode_args(body: bytes | bytearray) -> ExtenderArgs:
    """Decode a filter/prioritize request body; :class:`InvalidRequest` says what is wrong
    (:class:`BodyNotJson` when it is not a JSON object at all)."""
    fast = split_go_layout(body)
    if fast is not None:
        return fast
    if _POD_KEY.search(body) is None:  # a cheap scan in C before a parse of megabytes
        raise _without_pod(body)
    start = _JSON_SPACE.match(body).end()  # type: ignore[union-attr]  # always matches
    if body[start : start + 1] == b"{" and json.detect_encoding(bytes(body[:4])) == "utf-8":
        return _Walk(body, start).args()
    try:
        doc = json.loads(body, object_pairs_hook=unique_keys)
    except RecursionError:
        raise InvalidRequest("request body is nested too deeply") from None
    except DuplicateKey as exc:
        raise duplicate(exc) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise not_json(exc) from exc
    try:
        return args_of(doc)
    except InvalidRequest as exc:
        exc.names = salvage_from(doc)  # type: ignore[attr-defined]  # one parse per body: the names come from this one
        raise


def _without_pod(body: bytes | bytearray) -> InvalidRequest:
    """Why a body with no Pod key is refused: not JSON, JSON but not an object, or an
    object without a Pod. Exact for small bodies; by the first byte for large ones."""
    start = _LEADING_SPACE.match(body).end()  # type: ignore[union-attr]  # always matches
    if start >= len(body):
        return BodyNotJson("request body is empty", hint="send ExtenderArgs, a JSON object with a Pod")
    if len(body) <= _EXPLAIN_BYTES:
        try:
            doc = json.loads(body, object_pairs_hook=unique_keys)
        except RecursionError:
            return InvalidRequest("request body is nested too deeply")
        except DuplicateKey as exc:
            return duplicate(exc)
        except (ValueError, UnicodeDecodeError) as exc:
            return not_json(exc)
        if not isinstance(doc, dict):
            return not_an_object(json_kind(doc))
        return InvalidRequest("ExtenderArgs has no Pod")
    first = body[start]
    if first == 0x7B:  # "{"
        return InvalidRequest("ExtenderArgs has no Pod")
    if first in _JSON_SCALAR_START:
        return not_an_object("an array" if first == 0x5B else "a scalar")
    return BodyNotJson(f"request body is not JSON: it starts with {bytes(body[start : start + 1])!r}")


#: text decoded from the body at a time by the walk (a window grows for a longer value)
_WINDOW = 1 << 20
_TEXT_SPACE = re.compile(r"[ \t\n\r]*")
#: the C scanner: (text, index) -> (value, end); StopIteration(index) where no value starts
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder(object_pairs_hook=unique_keys).scan_once  # type: ignore[attr-defined]
#: (text, index after the opening quote, strict) -> (string, end)
_scanstring: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


def _scanstring_at(text: str, quote: int) -> tuple[str, int]:
    return _scanstring(text, quote + 1, True)


class _NodeList:
    """What the walk kept of one ``Nodes`` object: its items as :class:`RawNode`s (None
    when ``items`` is absent or null), the first reason they are not a node list, and
    the names a failed request salvages (as :func:`salvage_from` would from a parse)."""

    def __init__(self) -> None:
        self.items: list[RawNode] | None = None
        self.error: str | None = None
        self.salvage: list[str] = []


class _Walk:
    """One JSON object body, read as ``json.loads`` would read it but never held whole.

    The body is decoded a window of ``_WINDOW`` bytes at a time (``text``; ``pos`` and
    ``char`` are the byte and character offsets of ``text[i]``). The top-level object and
    the ``Nodes`` object are walked here with json's own rules and wording; every value
    in them is read by the C scanner from the window (a value that runs past the window
    is read again from a window twice as long). Each item of ``Nodes.items`` becomes a
    :class:`RawNode` viewing its bytes; its parsed dict is checked and dropped. A syntax
    error says what ``json.loads`` would say (a UTF-8 error anywhere wins, as there,
    because ``json.loads`` decodes the whole body first); a semantic error is raised
    only once the whole body is known to be JSON.
    """

    def __init__(self, body: bytes | bytearray, start: int) -> None:
        self.body = body
        self.view = memoryview(body)
        self.text = ""
        self.i = 0
        self.pos = start
        self.char = start  # only JSON whitespace (ASCII) precedes the object
        self.final = False
        self.ascii = True
        self.stop = start  # the byte after the window
        self._read_result: tuple[Any, int] = (None, 0)
        self._load(_WINDOW)

    # -- reading ------------------------------------------------------------------

    def _load(self, size: int) -> None:
        """Decode the window of ``size`` bytes that starts at ``pos``."""
        end = len(self.body)
        stop = min(end, self.pos + size)
        self.text = ""  # one window at a time
        try:
            text, used = codecs.utf_8_decode(self.view[self.pos : stop], "surrogatepass", stop == end)
        except UnicodeDecodeError as exc:
            raise self._bad_utf8(exc, self.pos) from None
        self.text, self.i, self.ascii = text, 0, used == len(text)
        self.stop = self.pos + used
        self.final = self.stop == end

    def _more(self) -> bool:
        """Read again from ``pos`` with a window twice as long; False at the body's end."""
        if self.final:
            return False
        self._load(max(_WINDOW, 2 * (self.stop - self.pos)))
        return True

    def _advance(self, j: int) -> None:
        text, i = self.text, self.i
        self.pos += j - i if self.ascii else len(text[i:j].encode("utf-8", "surrogatepass"))
        self.char += j - i
        self.i = j

    def _skip(self) -> None:
        while True:
            j = _TEXT_SPACE.match(self.text, self.i).end()  # type: ignore[union-attr]  # always matches
            self._advance(j)
            if j < len(self.text) or self.final:
                return
            self._load(_WINDOW)

    def _peek(self) -> str:
        return self.text[self.i : self.i + 1]

    def _value(self) -> Any:
        """The value at ``pos`` (a failure or a value at the window's end is read again
        from a longer window until the body's end: a window may cut any value short)."""
        while True:
            failure = self._read(_scan)
            if failure is None:
                value, j = self._read_result
                if j == len(self.text) and self._more():
                    continue  # a number or a literal may go on past the window
                self._advance(j)
                return value
            if not self._more():
                raise self._syntax(*failure)

    def _key(self) -> str:
        while True:
            failure = self._read(_scanstring_at)
            if failure is None:
                key, j = self._read_result
                self._advance(j)
                return str(key)
            if not self._more():
                raise self._syntax(*failure)

    def _read(self, scan: Callable[[str, int], tuple[Any, int]]) -> tuple[str, int] | None:
        """Run ``scan`` at ``text[i]``: None (its result in ``_read_result``), or why and
        where it failed. The failure is returned, not kept as an exception: a
        JSONDecodeError holds the whole window, which would then live on beside the next."""
        try:
            self._read_result = scan(self.text, self.i)
        except StopIteration as stop:
            return "Expecting value", int(stop.value)
        except JSONDecodeError as exc:
            return exc.msg, exc.pos
        except RecursionError:  # the C scanner's own bound on nesting
            raise self._failed(InvalidRequest("request body is nested too deeply")) from None
        except DuplicateKey as exc:
            raise self._failed(duplicate(exc)) from None
        return None

    def _object(self, pair: Callable[[str], None]) -> None:
        """Walk the object at ``pos``; ``pair(key)`` reads each value (json's rules and messages)."""
        self._advance(self.i + 1)
        self._skip()
        if self._peek() == "}":
            self._advance(self.i + 1)
            return
        seen: set[str] = set()
        twice: str | None = None  # refused where the object ends, as json.loads' hook does
        while True:
            if self._peek() != '"':
                raise self._syntax("Expecting property name enclosed in double quotes", self.i)
            key = self._key()
            if key in seen and twice is None:
                twice = key
            seen.add(key)
            self._skip()
            if self._peek() != ":":
                raise self._syntax("Expecting ':' delimiter", self.i)
            self._advance(self.i + 1)
            self._skip()
            pair(key)
            self._skip()
            nextchar = self._peek()
            if nextchar != "}" and nextchar != ",":
                raise self._syntax("Expecting ',' delimiter", self.i)
            self._advance(self.i + 1)
            if nextchar == "}":
                if twice is not None:
                    raise self._failed(duplicate(DuplicateKey(twice)))
                return
            self._skip()

    # -- errors -------------------------------------------------------------------

    def _syntax(self, message: str, index: int) -> Exception:
        """json.loads' error for ``message`` at ``text[index]``: line, column and character."""
        char = self.char + index - self.i
        text = self.text[self.i : index] if index > self.i else ""
        at = self.pos + (len(text) if self.ascii else len(text.encode("utf-8", "surrogatepass")))
        newline = self.body.rfind(b"\n", 0, at)
        line = self.body.count(b"\n", 0, at) + 1
        column = char + 1 if newline < 0 else len(codecs.utf_8_decode(self.view[newline:at], "surrogatepass")[0])
        return self._failed(not_json(ValueError(f"{message}: line {line} column {column} (char {char})")))

    def _failed(self, exc: InvalidRequest) -> InvalidRequest:
        """``exc``, unless the rest of the body is not UTF-8: json.loads decodes it all first."""
        position = self.stop
        end = len(self.body)
        while position < end:
            stop = min(end, position + _WINDOW)
            try:
                position += codecs.utf_8_decode(self.view[position:stop], "surrogatepass", stop == end)[1]
            except UnicodeDecodeError as bad:
                return self._bad_utf8(bad, position)
        return exc

    @staticmethod
    def _bad_utf8(exc: UnicodeDecodeError, base: int) -> BodyNotJson:
        start, end = base + exc.start, base + exc.end
        where = (
            f"byte 0x{exc.object[exc.start]:02x} in position {start}"
            if end - start == 1
            else (f"bytes in position {start}-{end - 1}")
        )
        return not_json(ValueError(f"'utf-8' codec can't decode {where}: {exc.reason}"))

    # -- ExtenderArgs ---------------------------------------------------------------

    def args(self) -> ExtenderArgs:
        """The body's ExtenderArgs, decided as :func:`args_of` decides a parsed body."""
        top: dict[str, Any] = {}

        def pair(key: str) -> None:
            lowered = key.lower()
            if lowered == "nodes" and self._peek() == "{":
                top[key] = self._node_list()
                return
            value = self._value()  # every value is read: the whole body must be JSON
            top[key] = value if lowered in ("pod", "nodenames", "nodes") else None

        self._object(pair)
        self._skip()
        if self.i < len(self.text):
            raise self._syntax("Extra data", self.i)
        self.view.release()  # the raw nodes keep views of their own
        try:
            return self._decide(top)
        except InvalidRequest as exc:
            names = field_of(top, "NodeNames")
            nodes = field_of(top, "Nodes")
            salvage = names if isinstance(names, list) else nodes.salvage if isinstance(nodes, _NodeList) else []
            exc.names = [n for n in salvage if isinstance(n, str)]  # type: ignore[attr-defined]
            raise

    @staticmethod
    def _decide(top: dict[str, Any]) -> ExtenderArgs:
        pod = pod_of(top)
        raw_nodes, raw_names = field_of(top, "Nodes"), field_of(top, "NodeNames")
        if raw_names is not None:
            return ExtenderArgs(pod, None, decode_names(raw_names))
        if isinstance(raw_nodes, _NodeList):
            if raw_nodes.error is not None:
                raise InvalidRequest(raw_nodes.error)
            return ExtenderArgs(pod, None, None, raw_nodes=raw_nodes.items or [], echo_raw=False)
        if raw_nodes is not None:
            decode_node_list(raw_nodes)  # not an object: raises
        raise InvalidRequest("ExtenderArgs has neither Nodes nor NodeNames")

    def _node_list(self) -> _NodeList:
        """Walk a ``Nodes`` object; the last ``items`` wins, as in a parsed dict."""
        found = _NodeList()

        def pair(key: str) -> None:
            nonlocal found
            if key != "items":
                self._value()
            elif self._peek() == "[":
                found = self._items()
            else:
                found = _NodeList()
                value = self._value()
                if value is not None:
                    found.error = "ExtenderArgs.Nodes.items must be a list of v1.Node"

        self._object(pair)
        return found

    def _items(self) -> _NodeList:
        """Walk an ``items`` array into raw nodes (json's rules and messages for arrays)."""
        found = _NodeList()
        items: list[RawNode] = []
        salvage: list[str] | None = []
        self._advance(self.i + 1)
        self._skip()
        if self._peek() == "]":
            self._advance(self.i + 1)
        else:
            while True:
                start = self.pos
                item = self._value()
                meta = item.get("metadata") if isinstance(item, dict) else None
                name = meta.get("name") if isinstance(meta, dict) else None
                if (not isinstance(name, str) or not name) and found.error is None:
                    found.error = f"ExtenderArgs.Nodes.items[{len(items)}] has no metadata.name"
                if salvage is not None:  # salvage_from gives up on an item that is not an object
                    if not isinstance(item, dict) or not isinstance(item.get("metadata", {}), dict):
                        salvage = None
                    elif isinstance(name, str):
                        salvage.append(name)
                version = meta.get("resourceVersion") if isinstance(meta, dict) else None
                # "" for a node without a resourceVersion: never found in the facts cache
                raw = self.view[start : self.pos]
                items.append(
                    RawNode(name if isinstance(name, str) else "", version if isinstance(version, str) else "", raw)
                )
                del item, meta
                self._skip()
                nextchar = self._peek()
                if nextchar != "]" and nextchar != ",":
                    raise self._syntax("Expecting ',' delimiter", self.i)
                self._advance(self.i + 1)
                if nextchar == "]":
                    break
                self._skip()
        found.items = items
        found.salvage = salvage or []
        return found


def split_go_layout(body: bytes | bytearray) -> ExtenderArgs | None:
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
        pod = json.loads(body[len(_POD_HEAD) : pod_end], object_pairs_hook=unique_keys)
    except (ValueError, RecursionError):  # the general path says what is wrong
        return None
    if not isinstance(pod, dict):
        return None
    return ExtenderArgs(cast(Pod, pod), None, None, raw_nodes=nodes)


__all__ = ["decode_args"]
