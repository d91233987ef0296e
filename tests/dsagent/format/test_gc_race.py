"""Gc and pack at once (docs/design.md#store-gc): a pack that *reuses* a
bundle the store already holds can come to reference an old orphan gc is removing. Both
sides close it: gc moves orphans aside, reads the manifests a third time and puts back any
now referenced; a pack checks its reused bundles after its manifest and writes a missing
one again. Each side is driven into the race deterministically (the other side's step is
run at the exact point between two of its own), on a local store and on S3 (moto)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dsagent.format.bundles import bundle as bundle_module
from dsagent.format.bundles import bundlegc
from dsagent.format.bundles.bundle import pack_dataset, unpack, write_manifest
from dsagent.format.manifest import read_manifest
from tests.dsagent.conftest import AWKWARD_FILES
from tools.support.s3server import S3Server

pytestmark = pytest.mark.slow


def stores(tmp_path: Path, s3: S3Server | None) -> tuple[str, dict[str, Any] | None]:
    if s3 is None:
        return str(tmp_path / "store"), None
    s3.create_bucket("datasets")
    return "s3://datasets/store", {"endpoint_url": s3.endpoint}


def unpacked(store: str, options: dict[str, Any] | None, target: Path) -> list[str]:
    unpack(store, name="awk", dest=target, storage_options=options)
    return sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any] | None]:
    if request.param == "local":
        return stores(tmp_path, None)
    return stores(tmp_path, request.getfixturevalue("s3"))


def test_gc_puts_back_an_orphan_a_manifest_came_to_reference_while_it_was_moved_aside(
    store: tuple[str, dict[str, Any] | None],
    awkward_dataset: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, options = store
    first, _ = pack_dataset(awkward_dataset, url, name="awk", max_files=1, store_options=options)
    second, _ = pack_dataset(awkward_dataset, url, name="awk", max_files=3, store_options=options)
    orphans = {b.digest for b in first.bundles} - {b.digest for b in second.bundles}
    assert orphans
    reading = bundlegc.referenced_digests
    reads = []

    def then_a_pack_publishes(*args: Any) -> tuple[set[str], int]:
        answer = reading(*args)
        reads.append(answer)
        if len(reads) == 2:  # gc's read just before it deletes: every orphan is still one
            assert not answer[0] & orphans
            # a pack that saw those bundles in the store writes its manifest right now
            write_manifest(first, url, store_options=options)
        return answer

    monkeypatch.setattr(bundlegc, "referenced_digests", then_a_pack_publishes)
    plan = bundlegc.collect(url, options, grace_seconds=0, delete=True)
    assert read_manifest(url, "awk", storage_options=options).bundles == first.bundles
    assert unpacked(url, options, tmp_path / "out") == sorted(AWKWARD_FILES)  # no bundle lost
    assert set(plan.restored) == orphans and plan.deleted == ()
    monkeypatch.undo()
    # now the re-pack's own bundles are the orphans, and nothing is left aside
    replaced = {b.digest for b in second.bundles} - {b.digest for b in first.bundles}
    assert {b.digest for b in bundlegc.scan(url, options, grace_seconds=0).delete} == replaced
    assert bundlegc._set_aside(*bundlegc.resolve(url, options), url) == {}


def test_bundles_an_interrupted_gc_left_aside_are_put_back_or_removed(
    store: tuple[str, dict[str, Any] | None], awkward_dataset: Path, tmp_path: Path
) -> None:
    url, options = store
    first, _ = pack_dataset(awkward_dataset, url, name="awk", max_files=1, store_options=options)
    second, _ = pack_dataset(awkward_dataset, url, name="awk", max_files=3, store_options=options)
    fs, root = bundlegc.resolve(url, options)
    live = second.bundles[0].digest
    dead = sorted({b.digest for b in first.bundles} - {b.digest for b in second.bundles})
    # a gc killed between its moves and its third read: one live bundle and the orphans aside
    plan = bundlegc.scan(url, options, grace_seconds=0)
    bundlegc._move_aside(
        fs,
        root,
        url,
        [b for b in plan.delete] + [bundlegc.StoredBundle(live, bundlegc.bundle_path(root, live), 0, None)],
    )
    with pytest.raises(Exception):  # noqa: B017,PT011 - the dataset is broken until the next gc
        unpacked(url, options, tmp_path / "broken")
    done = bundlegc.collect(url, options, grace_seconds=0, delete=True)
    assert done.restored == (live,) and sorted(b.digest for b in done.deleted) == []  # orphans went as leftovers
    assert bundlegc._set_aside(fs, root, url) == {}
    assert not any(fs.exists(bundlegc.bundle_path(root, d)) for d in dead)
    assert unpacked(url, options, tmp_path / "out") == sorted(AWKWARD_FILES)


def test_a_pack_writes_again_a_reused_bundle_gc_removed_before_its_manifest(
    store: tuple[str, dict[str, Any] | None],
    awkward_dataset: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, options = store
    first, _ = pack_dataset(awkward_dataset, url, name="awk", max_files=3, store_options=options)
    fs, root = bundlegc.resolve(url, options)
    taken = first.bundles[0].digest
    writing = bundle_module.write_manifest

    def gc_strikes_first(manifest: Any, where: Any, **kwargs: Any) -> None:
        # the re-pack found every bundle in the store; gc (its third read before this
        # manifest) removes one of them now, then the manifest lands
        path = bundlegc.bundle_path(root, taken)
        if fs.exists(path):
            fs.rm_file(path)
        writing(manifest, where, **kwargs)

    monkeypatch.setattr(bundle_module, "write_manifest", gc_strikes_first)
    again, reused = pack_dataset(awkward_dataset, url, name="awk", max_files=3, store_options=options)
    assert reused == len(first.bundles) and again.bundles == first.bundles
    assert fs.exists(bundlegc.bundle_path(root, taken))
    assert unpacked(url, options, tmp_path / "out") == sorted(AWKWARD_FILES)


def test_dsctl_gc_says_what_it_put_back(
    awkward_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from dsagent.cli import main

    url = str(tmp_path / "store")
    second, _ = pack_dataset(awkward_dataset, url, name="awk", max_files=3)
    fs, root = bundlegc.resolve(url, None)
    live = second.bundles[0].digest
    bundlegc._move_aside(fs, root, url, [bundlegc.StoredBundle(live, bundlegc.bundle_path(root, live), 0, None)])
    main(["gc", url, "--delete", "--grace", "0s", "-o", "json"])
    answer = json.loads(capsys.readouterr().out)
    assert answer["restored"] == [live] and answer["deleted"] == []
    bundlegc._move_aside(fs, root, url, [bundlegc.StoredBundle(live, bundlegc.bundle_path(root, live), 0, None)])
    main(["gc", url, "--delete", "--grace", "0s"])
    assert f"put back 1 bundles a manifest references again: {live}" in capsys.readouterr().out
