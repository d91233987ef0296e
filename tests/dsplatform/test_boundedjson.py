"""dsplatform.boundedjson: other parties' JSON is refused by size, depth or syntax, never
with a RecursionError or by reading it whole."""

from __future__ import annotations

import pytest

from dsplatform import boundedjson
from dsplatform.boundedjson import JsonRefused, count


def test_a_document_within_its_limits_parses() -> None:
    assert boundedjson.loads(b'{"a": [1, {"b": 2}]}', what="x", max_bytes=100) == {"a": [1, {"b": 2}]}
    assert boundedjson.loads("[]", what="x", max_bytes=2) == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 32 levels"),  # the C parser's RecursionError
        ("[" * 33 + "]" * 33, "nested deeper than 32 levels"),  # within the stack, past the limit
        (b'{"a": 1', "not JSON"),
        (b"\xff\xfe", "not JSON"),
        ('"' + "é" * 60 + '"', "over 100 bytes"),  # 60 characters, 122 bytes
    ],
)
def test_too_deep_too_large_or_broken_json_is_refused_with_a_reason(data: bytes | str, message: str) -> None:
    with pytest.raises(JsonRefused, match=f"peer inventory is {message}") as refused:
        boundedjson.loads(data, what="peer inventory", max_bytes=100 if len(data) < 1000 else 1 << 20)
    assert refused.value.http_status == 400 and refused.value.exit_code == 2


def test_depth_counts_containers_only() -> None:
    assert boundedjson.depth(5) == 0
    assert boundedjson.depth({"a": [1, [2]], "b": {}}) == 3
    assert boundedjson.depth([[[]], []]) == 3


@pytest.mark.parametrize(
    ("data", "key"),
    [('{"name":"d","name":"e"}', "name"), ('{"a":[{"x":1,"y":2,"x":3}]}', "x"), ('[{}, {"k":1,"k":1}]', "k")],
)
def test_an_object_with_a_key_twice_is_refused_naming_the_key(data: str, key: str) -> None:
    with pytest.raises(JsonRefused, match=f"has the key '{key}' twice"):
        boundedjson.loads(data, what="the body", max_bytes=1000)


def test_the_same_key_in_different_objects_is_fine() -> None:
    assert boundedjson.loads('[{"k":1},{"k":2},{"o":{"k":3}}]', what="x", max_bytes=100) == [
        {"k": 1},
        {"k": 2},
        {"o": {"k": 3}},
    ]


@pytest.mark.parametrize(
    ("value", "read"), [(0, 0), (7, 7), (2**40, 2**40), (-1, 0), (True, 0), (1.0, 0), ("3", 0), (None, 0)]
)
def test_a_count_is_a_whole_number_at_least_zero_or_nothing(value: object, read: int) -> None:
    assert count(value) == read
