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


def _read_overwritten_midway(s3: Any, bucket: str, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """Read ``bucket/big.bin`` (12 MiB, 5 MiB blocks) and overwrite it after the first range GET."""
    from s3fs import core

    client = _client(s3)
    client.create_bucket(Bucket=bucket)
    first, second = bytes([1]) * (12 * MIB), bytes([2]) * (12 * MIB)
    client.put_object(Bucket=bucket, Key="big.bin", Body=first)
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    real, calls = core._inner_fetch, []

    async def overwriting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[4:6])
        if len(calls) == 2:
            client.put_object(Bucket=bucket, Key="big.bin", Body=second)
        return await real(*args, **kwargs)

    monkeypatch.setattr(core, "_inner_fetch", overwriting)
    fs, _ = resolve(f"s3://{bucket}/", s3.options(default_block_size=5 * MIB, skip_instance_cache=True))
    fs.find(f"{bucket}/", detail=True)  # the listing: the version seen first
    with open_whole(fs, f"{bucket}/big.bin", size=len(first)) as stream:
        data = b"".join(iter(lambda: stream.read(MIB), b""))  # as a copy reads it
    assert len(calls) >= 2, calls
    return data


def test_an_s3_object_overwritten_between_range_reads_fails_as_integrity(
    s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dsagent.format.storage import translate_errors

    with pytest.raises(IntegrityError, match="changed while it was read") as failure:
        with translate_errors("source file 'big.bin'"):
            _read_overwritten_midway(s3, "torn", monkeypatch)
    assert "again" in (failure.value.hint or "")
