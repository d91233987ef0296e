"""dsplatform.boundedjson: other parties' JSON is refused by size, depth or syntax, never
with a RecursionError or by reading it whole."""

from __future__ import annotations

import pytest

from dsplatform import boundedjson
from dsplatform.boundedjson import JsonRefused


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
