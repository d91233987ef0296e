"""The ``dsagent.io/datasets`` annotation: both forms, and every way it can be wrong."""

from __future__ import annotations

import pytest

from dsplatform.errors import InvalidInput
from dsplatform.wire.podannotations import DatasetRef, datasets_of, encode, parse


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, ()),
        ("", ()),
        ("  ", ()),
        ("imagenet", (DatasetRef("imagenet"),)),
        ("imagenet,coco", (DatasetRef("imagenet"), DatasetRef("coco"))),
        (" imagenet , coco ,", (DatasetRef("imagenet"), DatasetRef("coco"))),
        ('["imagenet"]', (DatasetRef("imagenet"),)),
        ('[{"name": "imagenet"}]', (DatasetRef("imagenet"),)),
        (
            '[{"name": "a", "source": "s3://b/a", "bundles": "s3://b/bundles"}]',
            (DatasetRef("a", "s3://b/a", "s3://b/bundles"),),
        ),
        (
            '[{"name": "a", "source": "/nfs/a", "digest": "' + "f" * 32 + '"}]',
            (DatasetRef("a", "/nfs/a", digest="f" * 32),),
        ),
    ],
)
def test_accepted_forms(text: str | None, expected: tuple[DatasetRef, ...]) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("[", "is not JSON"),
        ('{"name": "a"}', "comma-separated"),
        ('[{"source": "s3://x"}]', "'name'"),
        ('[{"name": "a", "src": "s3://x"}]', "unknown keys ['src']"),
        ('[{"name": "a", "digest": "xyz"}]', "32 lowercase hex"),
        ('[{"name": "a", "source": ""}]', "non-empty string"),
        ('[{"name": "a", "storage_options": "key=secret"}]', "must be an object"),
        ("../etc", "invalid dataset name"),
        ("a,a", "more than once"),
        ('[{"name": "a b"}]', "invalid dataset name"),
    ],
)
def test_rejected_forms_say_what_is_wrong(text: str, complaint: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse(text)
    assert complaint in str(info.value)


def test_storage_options_are_kept_but_never_printed() -> None:
    [ref] = parse('[{"name": "a", "source": "s3://b/a", "storage_options": {"secret": "hunter2"}}]')
    assert ref.storage_options == {"secret": "hunter2"}
    assert "hunter2" not in repr(ref)


def test_pods_without_the_annotation_ask_for_nothing() -> None:
    assert datasets_of({"metadata": {"name": "p"}}) == ()
    assert datasets_of({"metadata": {"annotations": {"dsagent.io/datasets": "x"}}}) == (DatasetRef("x"),)


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, "[" + " " * (256 * 1024) + "]"])
def test_a_nested_or_oversized_annotation_is_invalid_input_not_a_recursion_error(text: str) -> None:
    # the old parse raised RecursionError, which the webhook saw as a bug
    with pytest.raises(InvalidInput, match="nested deeper|over"):
        parse(text)


@pytest.mark.parametrize(
    "refs",
    [
        (DatasetRef("imagenet"),),
        (DatasetRef("a", "s3://b/a", "s3://b/bundles"), DatasetRef("coco", "/nfs/coco", digest="f" * 32)),
        (DatasetRef("a", "s3://b/a", storage_options={"anon": True}),),
    ],
)
def test_what_encode_writes_parse_reads_back(refs: tuple[DatasetRef, ...]) -> None:
    back = parse(encode(refs))
    assert back == refs
    assert [r.storage_options for r in back] == [r.storage_options for r in refs]  # not part of ==


def test_what_encode_planned_writes_decode_planned_reads_back() -> None:
    from dsplatform.wire.podannotations import Planned, decode_planned, encode_planned

    text = encode_planned(4, {"gpu-a": 2, "gpu-b": 2}, "cross-expected", "efficiency", "2026-11-22T18:00:00Z", "gpu-b")
    assert decode_planned(text) == Planned(
        4, {"gpu-a": 2, "gpu-b": 2}, "cross-expected", "efficiency", "2026-11-22T18:00:00Z", "gpu-b"
    )
    assert decode_planned(encode_planned(2, {"n1": 2}, "single-late", "efficiency", None)).node is None


@pytest.mark.parametrize(
    "text",
    [
        None,
        "not json",
        "[]",
        '{"gpus": 4, "nodes": {"a": 2}}',
        '{"gpus": 2, "nodes": {"a": 2}, "node": "b"}',
        '{"gpus": 2, "nodes": {"A_": 2}}',
        '{"gpus": true, "nodes": {"a": 1}}',
        '{"gpus": 2, "nodes": {"a": 2}, "branch": ["x"]}',
        '{"gpus": 2, "nodes": {"a": 2}, "pad": "' + "x" * 70_000 + '"}',
        "[" * 5000,
    ],
)
def test_decode_planned_refuses_what_encode_planned_never_writes(text: object) -> None:
    from dsplatform.wire.podannotations import decode_planned

    with pytest.raises(InvalidInput):
        decode_planned(text)
