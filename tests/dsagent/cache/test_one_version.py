"""A cached file is one version of its source file (docs/design.md#one-version-per-file).

A real HTTP server on 127.0.0.1 whose ``big.bin`` (7 MiB, read in two range GETs) turns
from version A into version B (same size) after the first GET: a file rewritten while the
agent copies it. Whatever the server says about versions, the agent's copy ends as
``integrity`` or ready with exactly one version, never A's head with B's tail. The same
on a real S3 server (moto in server mode): the object is overwritten between two range
reads.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dsagent.cache.service import CacheService, DatasetRequest
from dsagent.cache.settings import Settings
from dsagent.errors import IntegrityError
from dsagent.format.oneversion import identifies_content
from dsagent.format.storage import open_whole, resolve, version_of
from tools.support.versioned_http import VersionedServer

MIB = 1 << 20
A = bytes(range(256)) * (7 * MIB // 256)
B = bytes(reversed(range(256))) * (7 * MIB // 256)


def _files() -> dict[str, list[bytes]]:
    return {"big.bin": [A, B], "small/one.txt": [b"one\n"]}


async def _cache(root: Path, url: str) -> Any:
    service = CacheService(Settings(root=root, sweep_interval=3600))
    await service.start()
    try:
        return await service.submit_task("pod-a", [DatasetRequest("torn", url)], wait=60)
    finally:
        await service.stop()


def _cached(record: Any) -> bytes:
    return (Path(str(record.datasets[0].path)) / "big.bin").read_bytes()


@pytest.mark.parametrize("validators", ["etag", "ignored", "none"])
def test_a_file_rewritten_between_range_gets_is_never_cached_as_a_mix_of_versions(
    tmp_path: Path, validators: str
) -> None:
    server = VersionedServer(_files(), validators=validators)
    try:
        first = asyncio.run(_cache(tmp_path / "cache", server.url))
        if first.state == "ready":
            assert _cached(first) in (A, B), "a mix of two versions was reported ready"
            assert validators == "none", "a server that names versions must fail the torn copy"
        else:
            assert first.state == "failed", first
            error = first.datasets[0].error
            assert error["code"] == "integrity", error
            assert "changed while" in error["message"] and "again" in error["hint"], error
            assert not any((tmp_path / "cache" / "datasets").rglob("big.bin")), "a torn copy was left published"
        if validators == "etag":
            assert server.refused >= 1, "the second range GET was not conditional on the first version"
        server.settle()
        again = asyncio.run(_cache(tmp_path / "cache2", server.url))
        assert again.state == "ready", again
        assert _cached(again) == B
    finally:
        server.close()


@pytest.mark.parametrize("validators", ["same-second", "nginx", "apache", "weak"])
def test_validators_that_stay_while_the_bytes_change_never_make_a_torn_copy_ready(
    tmp_path: Path, validators: str
) -> None:
    """A 7 MiB file rewritten between two reads, its size and second unchanged: the
    server's ``Last-Modified``, its ETag made of mtime and size, or its weak ETag, stay
    the same. Such validators pin nothing: the file is read in one GET, without ranges and
    without ``If-Match`` (a weak ETag there is a 412 from a server that honours it), so the
    copy is one whole version."""
    server = VersionedServer(_files(), validators=validators)
    try:
        first = asyncio.run(_cache(tmp_path / "cache", server.url))
        assert first.state == "ready", first  # cacheable at all: no 412 on a weak ETag
        assert _cached(first) == A, "not one whole version of the file"
        assert server.ranged == 0 and server.refused == 0, (server.ranged, server.refused)
        server.settle()
        again = asyncio.run(_cache(tmp_path / "cache2", server.url))
        assert again.state == "ready" and _cached(again) == B, again
    finally:
        server.close()


def test_a_file_read_in_one_request_is_checked_against_its_validators_at_the_end(tmp_path: Path) -> None:
    """A server whose only validator is ``Last-Modified`` (read in one GET): a version that
    moved on by the end of the read fails the copy as ``integrity``, never ready."""
    server = VersionedServer(_files(), validators="last-modified")
    try:
        first = asyncio.run(_cache(tmp_path / "cache", server.url))
        assert first.state == "failed", first
        error = first.datasets[0].error
        assert error["code"] == "integrity" and "changed while it was read" in error["message"], error
        assert "again" in error["hint"] and server.ranged == 0
        assert not any((tmp_path / "cache" / "datasets").rglob("big.bin")), "a copy was left published"
    finally:
        server.close()


def test_which_validators_identify_an_objects_content() -> None:
    size = 7 * MIB
    assert identifies_content({"ETag": '"9b2cf535f27731c974343645a3985328"', "size": size})  # S3 (MD5)
    assert identifies_content({"ETag": '"9b2cf535f27731c974343645a3985328-3"', "size": size})  # S3 multipart
    assert identifies_content({"ETag": '"a3f1e2-0"', "size": size})  # opaque, not the size
    assert not identifies_content({"ETag": f'"6553f100-{size:x}"', "size": size})  # nginx
    assert not identifies_content({"ETag": f'"2a1b7-{size:x}-5e8d1a0c9e3c0"', "size": size})  # Apache
    assert not identifies_content({"ETag": '"6553f100-700000"'})  # nginx's form, size unknown
    assert not identifies_content({"ETag": 'W/"9b2cf535f27731c974343645a3985328"', "size": size})  # weak
    assert not identifies_content({"Last-Modified": "Tue, 14 Nov 2023 22:13:20 GMT", "size": size})
    assert not identifies_content({"size": size})


def test_a_server_without_validators_is_read_in_one_request(tmp_path: Path) -> None:
    server = VersionedServer(_files(), validators="none", flip_after=None)
    try:
        fs, root = resolve(server.url)
        before = server.requests("GET")
        with open_whole(fs, f"{root.rstrip('/')}/big.bin", size=len(A)) as stream:
            assert stream.read() == A
        assert server.requests("GET") - before == 1
    finally:
        server.close()


def test_version_of_names_each_backends_version_fields() -> None:
    assert version_of({"ETag": '"x"', "VersionId": "null", "size": 3}) == {"ETag": '"x"'}
    assert version_of({"generation": 17, "etag": "CJ"}) == {"generation": "17", "etag": "CJ"}
    assert version_of({"Last-Modified": "Tue, 14 Nov 2023 22:13:20 GMT"}) == {
        "Last-Modified": "Tue, 14 Nov 2023 22:13:20 GMT"
    }
    assert version_of({"size": 3, "type": "file"}) == {}


# -- S3 (moto server mode) ----------------------------------------------------------------
# ``s3`` is the session's server (tests/conftest.py), emptied for each test.


def _client(s3: Any) -> Any:
    import boto3

    from tools.support.s3server import KEY, SECRET

    return boto3.client(
        "s3", endpoint_url=s3.endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name="us-east-1"
    )


def _put(s3: Any, bucket: str, monkeypatch: pytest.MonkeyPatch, body: bytes) -> Any:
    client = _client(s3)
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="big.bin", Body=body)
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    return client


def _read_broken_midway(
    s3: Any, bucket: str, monkeypatch: pytest.MonkeyPatch, *, overwrite: bool, breaks: int = 1
) -> tuple[bytes, list[int]]:
    """Read ``bucket/big.bin`` (12 MiB, one streamed GET) as a copy reads it, the body
    breaking off (as a reset does: botocore's streaming error) after the first MiB, ``breaks``
    times; with ``overwrite``, the object is rewritten before the read asks for the rest."""
    from aiobotocore.response import ResponseStreamingError

    from dsagent.format import s3stream

    first, second = bytes([1]) * (12 * MIB), bytes([2]) * (12 * MIB)
    client = _put(s3, bucket, monkeypatch, first)
    real, reads, opened = s3stream.S3Stream._gather, [0], []
    real_open = s3stream.S3Stream._open

    async def breaking(self: Any, body: Any, want: int) -> bytes:
        reads[0] += 1
        if reads[0] >= 2 and len(opened) <= breaks:
            if overwrite:
                client.put_object(Bucket=bucket, Key="big.bin", Body=second)
            raise ResponseStreamingError(error=ConnectionResetError("reset by peer"))
        return await real(self, body, want)

    def counting_open(self: Any) -> None:
        opened.append(self._at)
        real_open(self)

    monkeypatch.setattr(s3stream.S3Stream, "_gather", breaking)
    monkeypatch.setattr(s3stream.S3Stream, "_open", counting_open)
    fs, _ = resolve(f"s3://{bucket}/", s3.options(skip_instance_cache=True))
    fs.find(f"{bucket}/", detail=True)  # the listing: the version seen first
    with open_whole(fs, f"{bucket}/big.bin", size=len(first)) as stream:
        data = b"".join(iter(lambda: stream.read(MIB), b""))  # as a copy reads it
    return data, opened


def test_an_s3_body_that_breaks_off_is_asked_again_from_where_it_stopped(
    s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, opened = _read_broken_midway(s3, "resumed", monkeypatch, overwrite=False)
    assert data == bytes([1]) * (12 * MIB)
    assert opened == [0, MIB]  # the second GET asks from the first byte not yet read


def test_an_s3_body_that_keeps_breaking_fails_with_the_backends_error(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiobotocore.response import ResponseStreamingError

    with pytest.raises(ResponseStreamingError):
        _read_broken_midway(s3, "broken", monkeypatch, overwrite=False, breaks=5)


def test_an_s3_object_overwritten_before_the_rest_is_read_fails_as_integrity(
    s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dsagent.format.storage import translate_errors

    with pytest.raises(IntegrityError, match="changed while it was read") as failure:
        with translate_errors("source file 'big.bin'"):
            _read_broken_midway(s3, "torn", monkeypatch, overwrite=True)
    assert "again" in (failure.value.hint or "")


def test_an_s3_object_overwritten_between_its_head_and_its_get_is_refused_by_its_etag(
    s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dsagent.format.storage import translate_errors

    client = _put(s3, "raced", monkeypatch, bytes([1]) * (12 * MIB))
    fs, _ = resolve("s3://raced/", s3.options(skip_instance_cache=True))
    head = fs.info

    def head_then_overwrite(path: str, **kwargs: Any) -> Any:
        answer = head(path, **kwargs)
        client.put_object(Bucket="raced", Key="big.bin", Body=bytes([2]) * (12 * MIB))
        return answer

    monkeypatch.setattr(fs, "info", head_then_overwrite)
    with pytest.raises(IntegrityError, match="pre-conditions"):
        with translate_errors("bundle 'big.bin'"):
            with open_whole(fs, "raced/big.bin", size=12 * MIB) as stream:
                stream.read(MIB)


def test_a_small_s3_object_is_one_head_and_one_get(monkeypatch: pytest.MonkeyPatch) -> None:
    """A manifest (and a small per-file copy): the HEAD that takes its version, then one GET
    pinned to it; s3fs's own file asked the HEAD a second time."""
    from tools.support.faststore import FastStore

    body = bytes(range(256)) * 1000
    store = FastStore(workers=1, latency_ms=0, get_rate=None)
    store.add_object("small", "manifest", body)  # before it starts: its workers serve what they were given
    with store:
        options = {"endpoint_url": store.endpoint, "key": "any", "secret": "thing", "skip_instance_cache": True}
        fs, _ = resolve("s3://small/", options)
        before = store.stats()
        with open_whole(fs, "small/manifest") as stream:
            data = b"".join(iter(lambda: stream.read(MIB), b""))
        after = store.stats()
    assert data == body
    assert (after["head"] - before["head"], after["get"] - before["get"]) == (1, 1)


def test_a_small_s3_object_overwritten_between_its_head_and_its_get_is_refused_by_its_etag(
    s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dsagent.format.storage import translate_errors

    client = _put(s3, "raced-small", monkeypatch, b"first version")
    fs, _ = resolve("s3://raced-small/", s3.options(skip_instance_cache=True))
    head = fs.info

    def head_then_overwrite(path: str, **kwargs: Any) -> Any:
        answer = head(path, **kwargs)
        client.put_object(Bucket="raced-small", Key="big.bin", Body=b"second version, longer")
        return answer

    monkeypatch.setattr(fs, "info", head_then_overwrite)
    with pytest.raises(IntegrityError, match="pre-conditions"):
        with translate_errors("manifest 'big.bin'"):
            with open_whole(fs, "raced-small/big.bin") as stream:
                stream.read(MIB)
