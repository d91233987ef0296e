"""Decoding ExtenderArgs and encoding replies: the Go-layout fast path and the plain path
must agree on every body, and anything unusual must take the plain path."""

from __future__ import annotations

import json
import random
import tracemalloc
from typing import Any

import pytest

from dsplatform.boundedjson import DuplicateKey, unique_keys
from scheduler_plugin import decode, wire
from scheduler_plugin.decode import decode_args
from scheduler_plugin.errors import InvalidRequest
from scheduler_plugin.testing import (
    args_body,
    holding,
    inventory_json,
    node,
    pod,
    topology_json,
)
from scheduler_plugin.wire import encode_filter_result, encode_priorities


def nodes() -> list[dict[str, Any]]:
    return [
        node(
            "n1", inventory=inventory_json(datasets={"imagenet": holding()}), topology=topology_json(), free_gpus=[0, 1]
        ),
        node("n2", free_gpus=""),
        node("n3", inventory='{"not": "an inventory \\"items\\":[] {\\"metadata\\":{\\"name\\":\\"x\\""}'),
    ]


def go_body(items: list[dict[str, Any]]) -> bytes:
    return args_body(pod(gpus=1), items, node_cache_capable=False)


def test_a_go_layout_body_is_cut_into_raw_nodes_without_parsing_them() -> None:
    args = decode_args(go_body(nodes()))
    assert args.raw_nodes is not None and args.nodes is None and args.node_field == "Nodes"
    assert args.names == ["n1", "n2", "n3"]
    assert [raw.parse() for raw in args.raw_nodes] == nodes()
    assert args.pod == pod(gpus=1)


@pytest.mark.parametrize(
    "rewrite",
    [
        lambda d: json.dumps(d).encode(),  # whitespace
        lambda d: json.dumps({"NodeNames": None, **d}).encode(),  # another field order
        lambda d: json.dumps({k.lower(): v for k, v in d.items()}, separators=(",", ":")).encode(),
        lambda d: json.dumps(
            {**d, "Nodes": {"metadata": {}, "items": [{"kind": "Node", **n} for n in d["Nodes"]["items"]]}},
            separators=(",", ":"),
        ).encode(),  # TypeMeta set
    ],
    ids=["whitespace", "field-order", "lowercase-keys", "kind-set"],
)
def test_any_other_layout_is_walked_with_the_same_result(rewrite: Any) -> None:
    body = rewrite(json.loads(go_body(nodes())))
    args = decode_args(body)
    assert args.raw_nodes is not None and not args.echo_raw  # walked, not cut: echoed re-serialized
    assert args.names == ["n1", "n2", "n3"]
    assert [{k: v for k, v in raw.parse().items() if k != "kind"} for raw in args.raw_nodes] == nodes()


def test_one_node_in_another_layout_sends_the_whole_body_down_the_walk() -> None:
    doc = json.loads(go_body(nodes()))
    doc["Nodes"]["items"][1] = {"kind": "Node", **doc["Nodes"]["items"][1]}
    args = decode_args(json.dumps(doc, separators=(",", ":")).encode())
    assert args.raw_nodes is not None and not args.echo_raw and args.names == ["n1", "n2", "n3"]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b'},{"metadata":{"name":"n2"', b'}, {"metadata":{"name":"n2"'),  # space between items
        (b'},{"metadata":{"name":"n3"', b'}\n,{"metadata":{"name":"n3"'),  # newline before a comma
        (b'"items":[{"metadata"', b'"items":[ {"metadata"'),  # space before the first
    ],
    ids=["space-between", "newline-before-comma", "space-before-first"],
)
def test_items_that_do_not_tile_the_array_are_walked(old: bytes, new: bytes) -> None:
    body = go_body(nodes())
    assert body.count(old) == 1
    args = decode_args(body.replace(old, new))
    assert args.raw_nodes is not None and not args.echo_raw and [raw.parse() for raw in args.raw_nodes] == nodes()


def test_a_single_node_is_cut_too() -> None:
    args = decode_args(go_body(nodes()[:1]))
    assert args.raw_nodes is not None and [raw.parse() for raw in args.raw_nodes] == nodes()[:1]


def test_nodes_without_a_resource_version_are_walked() -> None:
    items = nodes()
    del items[1]["metadata"]["resourceVersion"]
    args = decode_args(go_body(items))
    assert args.raw_nodes is not None and not args.echo_raw and [raw.parse() for raw in args.raw_nodes] == items
    assert args.raw_nodes[1].resource_version == ""  # never found in the facts cache


def test_an_empty_node_list_in_either_go_form() -> None:
    assert decode_args(go_body([])).names == []  # items: null
    empty = b'{"Pod":{},"Nodes":{"metadata":{},"items":[]},"NodeNames":null}'  # items: []
    assert decode_args(empty).names == [] and decode_args(empty).node_field == "Nodes"


def test_filter_reply_echoes_the_exact_bytes_of_passing_nodes() -> None:
    body = go_body(nodes())
    args = decode_args(body)
    reply = encode_filter_result(args, ["n3", "n1"], {"n2": 'reason with "items":[] in it'})
    decoded = json.loads(reply)
    assert decoded["Nodes"]["items"] == [nodes()[0], nodes()[2]]
    assert decoded["NodeNames"] is None and decoded["FailedNodes"] == {"n2": 'reason with "items":[] in it'}
    assert bytes(args.raw_nodes[0].raw) in reply  # type: ignore[index]


def test_filter_reply_in_names_mode_and_on_error() -> None:
    args = decode_args(args_body(pod(), nodes(), node_cache_capable=True))
    assert json.loads(encode_filter_result(args, ["n2"]))["NodeNames"] == ["n2"]
    failed = json.loads(encode_filter_result(None, error="bad"))
    assert failed == {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "bad",
    }


def test_priorities_are_integers_clamped_and_names_escaped() -> None:
    reply = encode_priorities(["a", 'we"ird'], [12, -3])
    assert reply == b'[{"Host":"a","Score":10},{"Host":"we\\"ird","Score":0}]'
    assert json.loads(reply)[1]["Host"] == 'we"ird'


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ([0, 10, 5], [0, 10, 5]),
        ([11, -1, 3], [10, 0, 3]),
        ([7.9, 3], [7, 3]),  # rounded down, as int64 scores are
        ([True, False], [1, 0]),  # bools are ints to Python, written as numbers
        ([4, 5, 6], [4, 5, 6]),
        ([], []),
    ],
)
def test_every_priority_is_an_integer_from_0_to_10(scores: list[float], expected: list[int]) -> None:
    hosts = [f"n{i}" for i in range(len(scores))]
    reply = json.loads(encode_priorities(hosts, scores))
    assert reply == [{"Host": h, "Score": s} for h, s in zip(hosts, expected)]
    assert all(type(item["Score"]) is int for item in reply)


def test_priorities_stay_exact_as_the_kept_host_heads_fill_and_start_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    # the escaped '{"Host":...' heads are kept between requests; a full table starts afresh
    from scheduler_plugin import wire

    monkeypatch.setattr(wire, "_MAX_HEADS", 8)
    monkeypatch.setattr(wire, "_HEADS", {})
    rounds = [["a", "b", 'c"q'], ["a", "b", 'c"q'], ["d", "e\\", "f", "g", "h", "a"], ["x", "a"], ["é", "\u2028"]]
    for i, hosts in enumerate(rounds):
        scores = [(i + j) % 11 for j in range(len(hosts))]
        expected = json.dumps([{"Host": h, "Score": s} for h, s in zip(hosts, scores)], separators=(",", ":"))
        assert encode_priorities(hosts, scores) == expected.encode()
        assert len(wire._HEADS) <= 8


@pytest.mark.parametrize(
    "body",
    [b"", b"{", b"[]", b'{"Pod":[]}', b'{"Pod":{},"Nodes":{"items":{}}}', b'{"Pod":{},"NodeNames":[""]}'],
)
def test_malformed_bodies_raise_invalid_request(body: bytes) -> None:
    with pytest.raises(InvalidRequest):
        decode_args(body)


def test_a_corrupt_raw_node_is_an_invalid_request_when_parsed() -> None:
    body = go_body(nodes()[:2])
    second = body.index(b'"status":{"capacity"', body.index(b'"name":"n2"'))
    broken = body[:second] + b'"status":["capacity"' + body[second + len(b'"status":{"capacity"') :]
    args = decode_args(broken)
    assert args.raw_nodes is not None and args.raw_nodes[0].parse() == nodes()[0]
    with pytest.raises(InvalidRequest, match="node n2"):
        args.raw_nodes[1].parse()


def test_a_go_layout_body_in_a_bytearray_with_a_trailing_newline_is_cut_alike() -> None:
    # Go's json.Encoder ends its output with a newline; the app hands bodies over as bytearrays.
    body = bytearray(go_body(nodes()) + b"\n")
    args = decode_args(body)
    assert args.raw_nodes is not None and [raw.parse() for raw in args.raw_nodes] == nodes()
    assert json.loads(encode_filter_result(args, ["n1"]))["Nodes"]["items"] == nodes()[:1]


# -- any other layout is walked a node at a time, with json.loads' answers -------


def parsed_whole(body: bytes) -> Any:
    """What the old decode answered: the Go cut, else json.loads of the whole body and the checks."""
    fast = decode.split_go_layout(body)
    if fast is not None:
        return fast
    if decode._POD_KEY.search(body) is None:
        return ("refused", str(decode._without_pod(body)), None)
    try:
        doc = json.loads(body, object_pairs_hook=unique_keys)
    except RecursionError:
        return ("refused", "request body is nested too deeply", None)
    except DuplicateKey as exc:
        return ("refused", str(wire.duplicate(exc)), None)
    except ValueError as exc:
        return ("refused", str(wire.not_json(exc)), None)
    try:
        args = wire.args_of(doc)
    except InvalidRequest as exc:
        return ("refused", str(exc), wire.salvage_from(doc))
    return args


def walked(body: bytes) -> Any:
    try:
        return decode_args(body)
    except InvalidRequest as exc:
        return ("refused", str(exc), getattr(exc, "names", None))


def assert_walked_like_parsed_whole(body: bytes) -> None:
    old, new = parsed_whole(body), walked(body)
    if isinstance(old, tuple) or isinstance(new, tuple):
        assert new == old, body[:300]
        return
    assert (new.pod, new.names, new.node_field, new.node_names) == (old.pod, old.names, old.node_field, old.node_names)
    if old.nodes is not None:
        assert new.raw_nodes is not None and [raw.parse() for raw in new.raw_nodes] == old.nodes
    passed = new.names[::2]
    assert encode_filter_result(new, passed, {"x": "y"}) == encode_filter_result(old, passed, {"x": "y"})


def other_layouts() -> list[bytes]:
    doc = json.loads(go_body([*nodes(), node("nœud-ü", free_gpus=[3])]))
    return [
        json.dumps(doc).encode(),
        json.dumps(doc, indent=2, ensure_ascii=False).encode(),  # raw UTF-8, as Go writes it
        json.dumps({"NodeNames": None, **doc}).encode(),
        b'\n {"Pod":{},"Nodes":{"items":[{"metadata":{"name":"a","resourceVersion":7}}],"metadata":{}}} \r\n',
        b'{"Pod":{},"Nodes":{"items":[{"metadata":{"name":"a"}}],"items":null}}',  # the last items wins
        json.dumps({**doc, "Nodes": {"items": [{"metadata": {"name": "a"}}, 3, {"metadata": {"name": ""}}]}}).encode(),
        json.dumps({**doc, "Nodes": {"items": "x"}, "Extra": [1, {"a": None}]}).encode(),
        json.dumps({**doc, "nodes": 5, "Nodes": None}).encode(),
        json.dumps({"Pod": 1, "Nodes": {"items": [{"metadata": {"name": "q"}}]}}).encode(),
    ]


@pytest.mark.parametrize("window", [1 << 20, 64, 7], ids=["1MiB", "64B", "7B"])
def test_the_walk_answers_as_a_parse_of_the_whole_body_for_any_edit(
    window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every truncation and many one-byte edits of bodies in other layouts get the same
    args, replies (byte for byte) and errors (to the character) as json.loads of the
    whole body; small windows cut values, keys and UTF-8 sequences at every place."""
    monkeypatch.setattr(decode, "_WINDOW", window)
    rng = random.Random(21)
    for body in other_layouts():
        assert_walked_like_parsed_whole(body)
        for cut in range(0, len(body), max(1, len(body) // 80)):
            assert_walked_like_parsed_whole(body[:cut])
        for _ in range(60 if window > 64 else 15):
            i = rng.randrange(len(body))
            assert_walked_like_parsed_whole(body[:i] + bytes([rng.choice(b'{}[]:,"\\ \n\xff\xc3a1-')]) + body[i + 1 :])
            assert_walked_like_parsed_whole(body[:i] + body[i + 1 :])


def test_a_deep_value_in_the_walk_is_refused_as_nested_unless_the_body_is_not_utf8() -> None:
    deep = b'{"Pod":{},"Other":' + b"[" * 100_000 + b"]" * 100_000 + b',"NodeNames":["n"]}'
    assert walked(deep) == ("refused", "request body is nested too deeply", None)
    assert walked(deep + b"\xff")[1].startswith("request body is not JSON: 'utf-8' codec can't decode byte 0xff")


@pytest.mark.slow
def test_a_walked_body_never_becomes_one_parsed_tree() -> None:
    """A 50 MB body in any layout but Go's was parsed whole (~4x its size in
    dicts), which put the extender at 380 MiB. Walked, the decode allocates a window and
    one node at a time: far less than the body, whatever its size."""
    items = [
        node(f"n{i}", inventory=inventory_json(datasets={"imagenet": holding()}), free_gpus=[1]) for i in range(1500)
    ]
    body = json.dumps({"Pod": pod(), "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}).encode()
    assert len(body) > 5 << 20
    tracemalloc.start()
    try:
        args = decode_args(body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # a whole parse allocates ~4x the body; the walk a 1 MiB window and ~400 bytes a node
    assert peak < len(body) // 2, f"decoding a {len(body)}-byte body allocated {peak} bytes at its peak"
    assert args.raw_nodes is not None and len(args.raw_nodes) == 1500


def test_scores_already_clamped_are_written_alike_without_the_checks() -> None:
    from scheduler_plugin.wire import Clamped

    hosts = [f"n{i}" for i in range(23)]
    scores = [i % 11 for i in range(23)]
    assert encode_priorities(hosts, Clamped(scores)) == encode_priorities(hosts, scores)
    assert encode_priorities([], Clamped()) == b"[]"
