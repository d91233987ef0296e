"""``dsctl digest / pack / unpack / verify``: summary lines, JSON, and distinct exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsagent.cli import main
from dsagent.format.manifest import read_manifest
from tests.dsagent.conftest import AWKWARD_FILES


@pytest.fixture(autouse=True)
def private_digest_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "digests.sqlite"
    monkeypatch.setenv("DSAGENT_DIGEST_CACHE", str(path))
    return path


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_pack_unpack_verify_round_trip_prints_one_summary_line_each(
    awkward_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, dest = tmp_path / "store", tmp_path / "out"
    code, out, _ = _run(
        ["pack", str(awkward_dataset), "--name", "awk", "--to", str(store), "--max-files", "3", "--max-bytes", "20kB"],
        capsys,
    )
    manifest = read_manifest(str(store), "awk")
    assert code == 0 and out.count("\n") == 1
    assert out.startswith(f"packed awk: {len(AWKWARD_FILES)} files") and manifest.digest in out
    assert f"into {len(manifest.bundles)} bundles ({len(manifest.bundles)} written, 0 reused" in out

    code, out, _ = _run(
        ["pack", str(awkward_dataset), "--name", "awk", "--to", str(store), "--max-files", "3", "--max-bytes", "20kB"],
        capsys,
    )
    assert code == 0 and f"(0 written, {len(manifest.bundles)} reused" in out

    code, out, _ = _run(["unpack", str(store), str(dest), "--name", "awk"], capsys)
    assert (
        code == 0 and out.startswith(f"unpacked awk into {dest}: {len(AWKWARD_FILES)} files") and "all verified" in out
    )
    code, out, _ = _run(["verify", str(dest), "--manifest", str(store), "--name", "awk"], capsys)
    assert code == 0 and out.startswith(f"{dest} matches awk")


def test_digest_prints_the_digest_or_the_manifest_as_json(
    awkward_dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(["digest", str(awkward_dataset), "--json"], capsys)
    body = json.loads(out)
    assert code == 0 and body["name"] == "source" and body["files"] == len(AWKWARD_FILES)
    assert sorted(e["path"] for e in body["entries"]) == sorted(AWKWARD_FILES)
    code, out, _ = _run(["digest", str(awkward_dataset)], capsys)
    assert code == 0 and body["digest"] in out and out.startswith(f"source: {len(AWKWARD_FILES)} files")


def test_the_cli_uses_the_digest_cache_unless_told_not_to(
    awkward_dataset: Path, private_digest_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(["digest", str(awkward_dataset), "--no-digest-cache"], capsys)
    assert not private_digest_cache.exists()
    _run(["digest", str(awkward_dataset)], capsys)
    assert private_digest_cache.exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "exit_code", "message"),
    [
        (["pack", "{src}", "--name", "d", "--to", "{store}", "--max-bytes", "12XB"], 2, "invalid size '12XB'"),
        (["pack", "{src}", "--name", "bad/name", "--to", "{store}"], 2, "invalid dataset name"),
        (["pack", "{tmp}/missing", "--name", "d", "--to", "{store}"], 3, "does not exist"),
        (["unpack", "{store}", "{tmp}/out", "--name", "never-packed"], 3, "no dataset 'never-packed'"),
        (["digest", "{src}", "--source-option", "novalue"], 2, "not KEY=VALUE"),
        (["digest", "{src}", "-o", "endpoint_url=x"], 2, "is not one of"),
        (["digest", "nosuchproto://x"], 2, "not a known fsspec protocol"),
        (["digest", "s3://"], 2, "names no bucket or path"),
        (["digest", "{src}", "--option", "anno=true"], 2, "'anno' does nothing for the local path"),
        (["pack", "{src}", "--name", "d", "--to", "{src}/big.bin"], 2, "is a file, not a directory"),
        (["pack", "{src}", "--name", "d", "--to", "http://127.0.0.1:9/store"], 2, "are read-only"),
    ],
)
def test_bad_input_gets_one_clear_line_and_a_distinct_exit_code(
    args: list[str],
    exit_code: int,
    message: str,
    awkward_dataset: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    filled = [a.format(src=awkward_dataset, store=tmp_path / "store", tmp=tmp_path) for a in args]
    code, out, err = _run(filled, capsys)
    assert code == exit_code
    assert err.startswith("dsctl: error: ") and message in err and err.count("\n") == 1
    assert out == ""


def test_verify_reports_a_damaged_copy_with_the_integrity_exit_code(
    awkward_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, dest = tmp_path / "store", tmp_path / "out"
    _run(["pack", str(awkward_dataset), "--name", "awk", "--to", str(store)], capsys)
    _run(["unpack", str(store), str(dest), "--name", "awk"], capsys)
    (dest / "big.bin").write_bytes(b"")
    code, _, err = _run(["verify", str(dest), "--manifest", str(store), "--name", "awk"], capsys)
    assert code == 5 and "wrong size: big.bin" in err


def test_verify_of_a_directory_that_does_not_exist_is_not_found(
    awkward_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # as digest and unpack answer a missing path (exit 3); it was "not a directory", exit 2
    store = tmp_path / "store"
    _run(["pack", str(awkward_dataset), "--name", "awk", "--to", str(store)], capsys)
    code, _, err = _run(["verify", str(tmp_path / "nodir"), "--manifest", str(store), "--name", "awk"], capsys)
    assert code == 3 and "nodir does not exist" in err and err.count("\n") == 1


def test_unpack_into_a_non_empty_directory_is_a_conflict(
    awkward_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, dest = tmp_path / "store", tmp_path / "out"
    _run(["pack", str(awkward_dataset), "--name", "awk", "--to", str(store)], capsys)
    dest.mkdir()
    (dest / "x").write_text("mine")
    code, _, err = _run(["unpack", str(store), str(dest), "--name", "awk"], capsys)
    assert code == 4 and "not empty" in err
