"""``dsctl gc``: bundles no manifest references are listed, and deleted only when asked and
only when older than the grace period; on a local store and on S3 (moto in server mode).

re-packing with other caps left most bundles orphaned and
nothing told a live bundle from a dead one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsagent.cli import main
from dsagent.format.bundles.bundlegc import StoredBundle, plan_collection
from dsagent.format.manifest import read_manifest
from tests.dsagent.conftest import AWKWARD_FILES
from tools.support.s3server import S3Server


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


def pack_twice(capsys: pytest.CaptureFixture[str], source: Path, store: str, *options: str) -> tuple[int, int]:
    """Pack with 1 file per bundle, then re-pack with 3: the first pack's bundles are orphans."""
    counts = []
    for cap in ("1", "3"):
        code, out, err = dsctl(
            capsys, "pack", str(source), "--name", "awk", "--to", store, "--max-files", cap, "-o", "json", *options
        )
        assert code == 0, err
        counts.append(json.loads(out)["bundles"])
    return counts[0], counts[1]


def gc(capsys: pytest.CaptureFixture[str], store: str, *args: str) -> dict:
    code, out, err = dsctl(capsys, "gc", store, "-o", "json", *args)
    assert code == 0, err
    return json.loads(out)


def check_gc(capsys: pytest.CaptureFixture[str], source: Path, store: str, *options: str) -> None:
    first, second = pack_twice(capsys, source, store, *options)
    store_options = {"endpoint_url": options[1].partition("=")[2]} if options else None
    live = {ref.digest for ref in read_manifest(store, "awk", storage_options=store_options).bundles}
    assert len(live) == second

    young = gc(capsys, store, *options)  # default grace 24 h: everything was just written
    assert young["orphans"] == [] and len(young["young"]) >= first - second > 0 and young["dryRun"]
    assert young["referenced"] == second and young["manifests"] == 1

    dry = gc(capsys, store, "--grace", "0s", *options)
    assert set(dry["orphans"]) == set(young["young"]) and not set(dry["orphans"]) & live
    assert dry["deleted"] == [] and dry["reclaimableBytes"] > 0
    assert gc(capsys, store, "--grace", "0s", *options)["orphans"] == dry["orphans"]  # nothing was deleted

    done = gc(capsys, store, "--grace", "0s", "--delete", *options)
    assert set(done["deleted"]) == set(dry["orphans"])
    assert gc(capsys, store, "--grace", "0s", *options)["orphans"] == []


def test_gc_lists_then_deletes_only_old_orphans_on_a_local_store(
    awkward_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(tmp_path / "store")
    check_gc(capsys, awkward_dataset, store)
    code, _, err = dsctl(capsys, "unpack", store, str(tmp_path / "out"), "--name", "awk")
    assert code == 0, err
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file()) == (
        sorted(AWKWARD_FILES)
    )


def test_gc_on_s3_deletes_orphans_and_keeps_the_dataset_whole(
    s3: S3Server, awkward_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s3.create_bucket("datasets")
    store = "s3://datasets/store"
    check_gc(capsys, awkward_dataset, store, "--store-option", f"endpoint_url={s3.endpoint}")
    code, _, err = dsctl(
        capsys, "unpack", store, str(tmp_path / "out"), "--name", "awk", "--store-option", f"endpoint_url={s3.endpoint}"
    )
    assert code == 0, err


def test_a_damaged_manifest_stops_gc_before_anything_is_deleted(
    awkward_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    pack_twice(capsys, awkward_dataset, str(store))
    bundles_before = sorted((store / "bundles").iterdir())
    (store / "awk" / "manifest").write_bytes(b"not a manifest\n")
    code, out, err = dsctl(capsys, "gc", str(store), "--grace", "0s", "--delete")
    assert code == 5 and err.startswith("dsctl: error: cannot read the manifest of 'awk'") and err.count("\n") == 1
    assert "nothing was deleted" in err
    assert sorted((store / "bundles").iterdir()) == bundles_before


def test_a_bad_grace_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = dsctl(capsys, "gc", str(tmp_path), "--grace", "soon")
    assert code == 2 and "--grace" in err and err.count("\n") == 1


def test_a_store_that_does_not_exist_is_not_found_but_an_empty_one_is_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a mistyped store used to report "0 orphaned bundles" and exit 0, as if it were clean
    code, _, err = dsctl(capsys, "gc", str(tmp_path / "nostore"))
    assert code == 3 and "no bundle store at" in err and "nostore" in err and err.count("\n") == 1
    (tmp_path / "empty").mkdir()
    code, out, _ = dsctl(capsys, "gc", str(tmp_path / "empty"))
    assert code == 0 and out.startswith("0 orphaned bundles")


def test_the_plan_keeps_referenced_young_and_undated_bundles() -> None:
    def b(digest: str, modified: float | None) -> StoredBundle:
        return StoredBundle(digest, f"s/bundles/{digest}.tar.zst", 10, modified)

    bundles = {"a" * 32: b("a" * 32, 0.0), "b" * 32: b("b" * 32, 0.0), "c" * 32: b("c" * 32, 990.0)}
    bundles["d" * 32] = b("d" * 32, None)
    plan = plan_collection(bundles, {"a" * 32}, now=1000.0, grace_seconds=100.0)
    assert [x.digest for x in plan.delete] == ["b" * 32]
    assert [x.digest for x in plan.young] == ["c" * 32, "d" * 32]
    assert plan.referenced == 1 and plan.reclaimable_bytes == 10
