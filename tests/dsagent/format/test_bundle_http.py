"""A bundle store served over real HTTP on 127.0.0.1, read through fsspec's http filesystem."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsagent.errors import IntegrityError, NotFound
from dsagent.format.bundles.bundle import pack, unpack, unpack_bundle, verify_tree
from dsagent.format.manifest import bundle_path, read_manifest, read_manifest_header
from tests.dsagent.conftest import AWKWARD_FILES

pytest.importorskip("aiohttp")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """``(directory, url)``: a plain HTTP file server over ``directory``."""
    root = tmp_path / "www"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_store_served_over_http_unpacks_verified(
    awkward_dataset: Path, served: tuple[Path, str], tmp_path: Path
) -> None:
    root, url = served
    manifest = pack(awkward_dataset, root / "store", name="awk", max_files=4)
    assert read_manifest(f"{url}/store", "awk") == manifest
    assert read_manifest_header(f"{url}/store", "awk").digest == manifest.digest
    unpack(f"{url}/store", name="awk", dest=tmp_path / "out")
    verify_tree(tmp_path / "out", manifest)
    assert {p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file()} == set(
        AWKWARD_FILES
    )


def test_a_corrupt_bundle_over_http_is_an_integrity_error(
    awkward_dataset: Path, served: tuple[Path, str], tmp_path: Path
) -> None:
    root, url = served
    manifest = pack(awkward_dataset, root / "store", name="awk")
    path = Path(bundle_path(str(root / "store"), manifest.bundles[0].digest))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    (tmp_path / "cache").mkdir()
    with pytest.raises(IntegrityError):
        unpack_bundle(f"{url}/store", manifest, manifest.bundles[0], tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_an_absent_dataset_over_http_is_not_found(served: tuple[Path, str]) -> None:
    _, url = served
    with pytest.raises(NotFound):
        read_manifest(f"{url}/store", "nothing")


def test_a_dataset_served_over_http_is_digested_and_packed(
    awkward_dataset: Path, served: tuple[Path, str], tmp_path: Path
) -> None:
    import shutil

    from dsagent.format.digester import build_manifest

    root, url = served
    shutil.copytree(awkward_dataset, root / "data")
    local = build_manifest(awkward_dataset, name="awk")
    remote = pack(f"{url}/data", tmp_path / "store", name="awk", max_files=4)
    assert [(e.path, e.size, e.digest) for e in remote.entries] == [(e.path, e.size, e.digest) for e in local.entries]
    unpack(tmp_path / "store", name="awk", dest=tmp_path / "out")
    verify_tree(tmp_path / "out", remote)
