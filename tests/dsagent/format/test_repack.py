"""Re-packing (:mod:`dsagent.format.bundles.repack`): a bundle made again from its unpacked files
unpacks verified, is read whole from a directory renamed mid-stream, and is cut when a
cached file changed (docs/design.md#peers)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from dsagent.errors import IntegrityError
from dsagent.format.bundles.bundle import pack, unpack_bundle
from dsagent.format.bundles.extract import unpack_bundle_stream
from dsagent.format.bundles.repack import repack, repack_at
from dsagent.format.manifest import bundle_path
from tests.dsagent.conftest import write_tree

FILES = {f"class{i % 3}/img{i:03d}.jpg": bytes([i % 251]) * (3000 + 97 * i) for i in range(24)}


def test_a_repacked_bundle_unpacks_verified(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", FILES)
    manifest = pack(tmp_path / "src", tmp_path / "store", name="imgs", max_files=4)
    bundle = manifest.bundles[1]
    (tmp_path / "peer" / "bundles").mkdir(parents=True)
    Path(bundle_path(str(tmp_path / "peer"), bundle.digest)).write_bytes(
        b"".join(repack(tmp_path / "src", manifest.bundle_entries(bundle)))
    )
    (tmp_path / "out").mkdir()
    unpack_bundle(tmp_path / "peer", manifest, bundle, tmp_path / "out")
    for entry in manifest.bundle_entries(bundle):
        assert (tmp_path / "out" / entry.path).read_bytes() == FILES[entry.path]


def test_a_directory_renamed_mid_stream_is_still_served_whole(tmp_path: Path) -> None:
    """A version's staging directory is renamed into place while one of its finished bundles
    is served: the files are opened relative to the directory, not by path."""
    write_tree(tmp_path / "staging", FILES)
    manifest = pack(tmp_path / "staging", tmp_path / "store", name="imgs", max_files=8)
    bundle = max(manifest.bundles, key=lambda b: b.count)
    root = os.open(tmp_path / "staging", os.O_RDONLY | os.O_DIRECTORY)
    try:
        stream = repack_at(root, manifest.bundle_entries(bundle), level=1)
        first = next(stream)
        (tmp_path / "staging").rename(tmp_path / "ready")
        body = first + b"".join(stream)
    finally:
        os.close(root)
    (tmp_path / "out").mkdir()
    unpack_bundle_stream(io.BytesIO(body), manifest, bundle, tmp_path / "out")
    assert {e.path: (tmp_path / "out" / e.path).read_bytes() for e in manifest.bundle_entries(bundle)} == {
        e.path: FILES[e.path] for e in manifest.bundle_entries(bundle)
    }


def test_a_changed_cached_file_cuts_the_stream(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", FILES)
    manifest = pack(tmp_path / "src", tmp_path / "store", name="imgs", max_files=4)
    members = manifest.bundle_entries(manifest.bundles[0])
    (tmp_path / "src" / members[-1].path).write_bytes(b"x" * members[-1].size)
    with pytest.raises(IntegrityError):
        b"".join(repack(tmp_path / "src", members))
