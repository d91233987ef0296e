"""S3 through a real S3 server on loopback (moto in server mode): the bundle commands work,
and every storage failure is one line with a hint and its documented exit code."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsagent.cli import main
from dsagent.errors import (
    InvalidInput,
    NotFound,
    SourceUnavailable,
    StorageCredentials,
    StorageForbidden,
)
from dsagent.format.manifest import read_manifest
from dsagent.format.storage import resolve, translate_errors
from tests.conftest import isolate_aws
from tests.dsagent.conftest import AWKWARD_FILES
from tools.support.s3server import S3Server, strict_s3_server

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def private_digest_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSAGENT_DIGEST_CACHE", str(tmp_path / "digests.sqlite"))


def dsctl(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line(err: str) -> str:
    assert err.startswith("dsctl: error: ") and err.count("\n") == 1, err
    return err


def test_pack_unpack_verify_and_digest_through_s3(
    s3: S3Server, awkward_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s3.create_bucket("datasets")
    ep = f"endpoint_url={s3.endpoint}"
    code, out, err = dsctl(
        capsys,
        "pack",
        str(awkward_dataset),
        "--name",
        "awk",
        "--to",
        "s3://datasets/store",
        "--store-option",
        ep,
        "--max-files",
        "3",
        "-o",
        "json",
    )
    assert code == 0, err
    packed = json.loads(out)
    assert packed["files"] == len(AWKWARD_FILES) and packed["written"] == packed["bundles"] > 1

    options_file = tmp_path / "store.json"
    options_file.write_text(json.dumps({"endpoint_url": s3.endpoint}))
    code, out, err = dsctl(
        capsys,
        "unpack",
        "s3://datasets/store",
        str(tmp_path / "out"),
        "--name",
        "awk",
        "--store-options-file",
        str(options_file),
    )
    assert code == 0, err
    assert f"digest {packed['digest']}" in out
    code, out, err = dsctl(
        capsys,
        "verify",
        str(tmp_path / "out"),
        "--manifest",
        "s3://datasets/store",
        "--name",
        "awk",
        "--store-option",
        ep,
    )
    assert code == 0, err

    code, out, err = dsctl(capsys, "digest", "s3://datasets/store/bundles", "--source-option", ep, "-o", "json")
    assert code == 0, err
    assert json.loads(out)["files"] == packed["bundles"]
    assert (
        read_manifest("s3://datasets/store", "awk", storage_options={"endpoint_url": s3.endpoint}).digest
        == packed["digest"]
    )


def test_pack_never_creates_a_bucket(s3: S3Server, awkward_dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s3.create_bucket("datasets")
    code, _, err = dsctl(
        capsys,
        "pack",
        str(awkward_dataset),
        "--name",
        "awk",
        "--to",
        "s3://datasetz/store",
        "--store-option",
        f"endpoint_url={s3.endpoint}",
    )
    assert code == 3
    assert "bucket 'datasetz' does not exist" in one_line(err) and "never creates buckets" in err
    assert s3.buckets() == ["datasets"]


def test_unreachable_endpoint_fails_fast_with_one_line(
    awkward_dataset: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tools.support.harness import held_port

    isolate_aws(monkeypatch)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("DSAGENT_STORAGE_CONNECT_TIMEOUT", "2s")
    start = time.monotonic()
    with held_port() as port:  # held, never listened on: nothing answers there
        code, _, err = dsctl(
            capsys,
            "unpack",
            "s3://datasets/store",
            "/nonexistent/out",
            "--name",
            "awk",
            "--store-option",
            f"endpoint_url=http://127.0.0.1:{port}",
        )
    assert code == 7
    assert "store unreachable" in one_line(err) and "endpoint_url" in err
    # a bound, not a speed figure: the default retries with backoff take minutes; a loaded
    # test machine takes tens of seconds for the process's own work
    assert time.monotonic() - start < 45


def test_missing_credentials_name_the_environment_variables(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    s3.create_bucket("datasets")
    isolate_aws(monkeypatch)
    code, _, err = dsctl(capsys, "digest", "s3://datasets/x", "--source-option", f"endpoint_url={s3.endpoint}")
    assert code == 11
    assert "credentials missing or refused" in one_line(err) and "AWS_ACCESS_KEY_ID" in err


def test_an_option_the_backend_rejects_is_bad_input(s3: S3Server, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = dsctl(
        capsys,
        "digest",
        "s3://datasets/x",
        "--source-option",
        f"endpoint_url={s3.endpoint}",
        "--source-option",
        "bogus=1",
    )
    assert code == 2
    assert "storage option 'bogus' is not accepted" in one_line(err)
    assert "AioSession" not in err, "the backend's internals are not the user's words"


@pytest.mark.parametrize(
    ("option", "says"),
    [
        # a misspelt key named aiobotocore's AioSession; now the key and its likely meaning
        (
            "endpiont_url=http://127.0.0.1:9",
            "storage option 'endpiont_url' is not accepted by this filesystem (did you mean 'endpoint_url'?)",
        ),
        # an endpoint without a scheme was "internal error: ValueError: Invalid endpoint"
        ("endpoint_url=127.0.0.1:5055", "storage option 'endpoint_url' must be an http:// or https:// URL with a host"),
        # anon=maybe was taken as true
        ("anon=maybe", "storage option 'anon' must be true or false, not 'maybe'"),
    ],
)
def test_a_mistyped_storage_option_is_one_line_naming_it(
    option: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = dsctl(capsys, "digest", "s3://datasets/x", "--source-option", option)
    assert code == 2, err
    assert says in one_line(err)


def test_a_missing_object_is_not_found(s3: S3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s3.create_bucket("datasets")
    code, _, err = dsctl(
        capsys,
        "unpack",
        "s3://datasets/store",
        str(tmp_path / "out"),
        "--name",
        "nothing",
        "--store-option",
        f"endpoint_url={s3.endpoint}",
    )
    assert code == 3
    one_line(err)


@pytest.mark.parametrize("url", ["s3:/datasets/x", "s3:datasets/x", "gs:/bucket"])
def test_a_near_url_is_called_malformed(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = dsctl(capsys, "digest", url)
    assert code == 2
    assert f"malformed URL {url!r}" in one_line(err)
    with pytest.raises(InvalidInput, match="malformed URL"):
        resolve(url)


# -- a server that checks credentials ------------------------------------------------


@pytest.fixture(scope="module")
def strict_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3Server, dict[str, str]]]:
    server, user = strict_s3_server(tmp_path_factory.mktemp("strict-s3") / "moto.log")
    yield server, user
    server.close()


def test_refused_credentials_and_denied_permission_are_told_apart(
    strict_s3: tuple[S3Server, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, user = strict_s3
    isolate_aws(monkeypatch)
    fs, _ = resolve("s3://datasets/x", {"endpoint_url": server.endpoint, "key": "AKIAWRONG", "secret": "wrong"})
    with (
        pytest.raises(StorageCredentials, match="credentials missing or refused") as refused,
        translate_errors("source 's3://datasets/x'"),
    ):
        fs.ls("datasets/x")
    assert refused.value.http_status == 403 and refused.value.exit_code == 11
    fs, _ = resolve("s3://datasets/x", {"endpoint_url": server.endpoint, **user})
    with (
        pytest.raises(StorageForbidden, match="permission denied") as denied,
        translate_errors("source 's3://datasets/x'"),
    ):
        fs.ls("datasets/x")
    assert denied.value.exit_code == 12 and "bucket policy" in str(denied.value)


def test_foreign_errors_map_to_the_tree_by_their_meaning() -> None:
    with pytest.raises(NotFound), translate_errors("x"):
        raise FileNotFoundError("gone")
    with pytest.raises(SourceUnavailable, match="store unreachable"), translate_errors("x"):
        raise ConnectionRefusedError("refused")
    with pytest.raises(StorageForbidden), translate_errors("x"):
        raise PermissionError("no")
    with pytest.raises(ZeroDivisionError), translate_errors("x"):  # not a storage error: passes unchanged
        raise ZeroDivisionError
