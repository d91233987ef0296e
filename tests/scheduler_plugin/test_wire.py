"""Decoding ExtenderArgs and encoding replies: the Go-layout fast path and the plain path
must agree on every body, and anything unusual must take the plain path."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler_plugin.errors import InvalidRequest
from scheduler_plugin.testing import (
    args_body,
    holding,
    inventory_json,
    node,
    pod,
    topology_json,
)
from scheduler_plugin.wire import decode_args, encode_filter_result, encode_priorities


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
def test_any_other_layout_takes_the_plain_path_with_the_same_result(rewrite: Any) -> None:
    body = rewrite(json.loads(go_body(nodes())))
    args = decode_args(body)
    assert args.raw_nodes is None and args.nodes is not None
    assert args.names == ["n1", "n2", "n3"]


def test_one_node_in_another_layout_sends_the_whole_body_down_the_plain_path() -> None:
    doc = json.loads(go_body(nodes()))
    doc["Nodes"]["items"][1] = {"kind": "Node", **doc["Nodes"]["items"][1]}
    args = decode_args(json.dumps(doc, separators=(",", ":")).encode())
    assert args.raw_nodes is None and args.names == ["n1", "n2", "n3"]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b'},{"metadata":{"name":"n2"', b'}, {"metadata":{"name":"n2"'),  # space between items
        (b'},{"metadata":{"name":"n3"', b'}\n,{"metadata":{"name":"n3"'),  # newline before a comma
        (b'"items":[{"metadata"', b'"items":[ {"metadata"'),  # space before the first
    ],
    ids=["space-between", "newline-before-comma", "space-before-first"],
)
def test_items_that_do_not_tile_the_array_take_the_plain_path(old: bytes, new: bytes) -> None:
    body = go_body(nodes())
    assert body.count(old) == 1
    args = decode_args(body.replace(old, new))
    assert args.raw_nodes is None and args.nodes == nodes()


def test_a_single_node_is_cut_too() -> None:
    args = decode_args(go_body(nodes()[:1]))
    assert args.raw_nodes is not None and [raw.parse() for raw in args.raw_nodes] == nodes()[:1]


def test_nodes_without_a_resource_version_take_the_plain_path() -> None:
    items = nodes()
    del items[1]["metadata"]["resourceVersion"]
    args = decode_args(go_body(items))
    assert args.raw_nodes is None and args.nodes == items


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
