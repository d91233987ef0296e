"""A bounded, seeded differential fuzz of the native loops against the pure-Python ones.

Random datasets (names short and over 100 bytes, ASCII and not, nested; sizes around the
512-byte blocks, empty, larger than a read) are packed, manifested and unpacked with the
native loops and with the pure ones: the same manifest bytes, bundle bytes and files. Then
random damage to random bundles (bytes flipped, cut, dropped or repeated, mostly in the
headers: ``tools/fuzz/native_unpack.py``'s mutations) is refused or accepted alike, with the
same error class and message and nothing left behind. About 300 cases, a few seconds;
``tools/ci/native-asan.sh`` runs them against the extension built with the sanitizers.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from types import ModuleType

import pytest
import zstandard

from dsagent.format import native
from dsagent.format.bundles.bundle import pack, unpack
from dsagent.format.manifest import Manifest, bundle_path, encode_manifest
from tests.dsagent.conftest import write_tree
from tests.dsagent.format import test_native, test_native_unpack
from tools.fuzz.native_unpack import mutations

extension = test_native.extension
with_native = test_native.with_native

pytestmark = pytest.mark.slow  # a few hundred packs and unpacks

DATASETS = 60  # random datasets, each packed and unpacked by both
DAMAGED = 30  # random one-bundle datasets, each damaged DAMAGE_EACH times
DAMAGE_EACH = 8
_NAME_PARTS = ["a", "img", "Z9", "caf\u00e9", "\u65e5\u672c", "x" * 60, "long-" * 12, "sp ace", "d.o.t"]


def _random_tree(rng: random.Random, most: int) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for _ in range(rng.randint(1, most)):
        depth = rng.randint(0, 3)
        parts = [rng.choice(_NAME_PARTS) + str(rng.randint(0, 9)) for _ in range(depth + 1)]
        path = "/".join(parts) + rng.choice(["", ".jpg", ".bin"])
        if any(p.startswith(q + "/") or q.startswith(p + "/") for q in files for p in (path,)):
            continue  # a file where another path needs a directory
        size = rng.choice([0, 1, 511, 512, 513, 1024, rng.randint(0, 5000), rng.randint(60_000, 140_000)])
        files[path] = rng.randbytes(size) if rng.random() < 0.7 else bytes([rng.randint(0, 255)]) * size
    return files


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    found = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            found[str(path.relative_to(root))] = (path.read_bytes(), path.stat().st_mtime_ns)
    return found


def _store(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _packed(src: Path, store: Path, use: bool, max_bytes: int, monkeypatch: pytest.MonkeyPatch) -> Manifest:
    monkeypatch.setattr(native, "AVAILABLE", use)
    try:
        return pack(src, store, name="d", max_bytes=max_bytes)
    finally:
        monkeypatch.setattr(native, "AVAILABLE", True)


@pytest.mark.parametrize("seed", range(3))
def test_random_datasets_pack_manifest_and_unpack_alike(
    seed: int, tmp_path: Path, with_native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    for case in range(DATASETS // 3):
        base = tmp_path / str(case)
        src = write_tree(base / "src", _random_tree(rng, 25))
        max_bytes = rng.choice([4096, 20_000, 1 << 20])
        by = {use: _packed(src, base / f"store-{use}", use, max_bytes, monkeypatch) for use in (True, False)}
        assert by[True] == by[False], case
        assert encode_manifest(by[True]) == encode_manifest(by[False])
        assert _store(base / "store-True") == _store(base / "store-False"), case  # bundle bytes too
        for use in (True, False):
            unpack(base / "store-True", name="d", dest=base / f"out-{use}", native=use, workers=1)
        assert _tree(base / "out-True") == _tree(base / "out-False")
        assert {k: v[0] for k, v in _tree(base / "out-True").items()} == {k: v[0] for k, v in _tree(src).items()}


@pytest.mark.parametrize("seed", range(3))
def test_random_damage_to_random_bundles_is_refused_alike(seed: int, tmp_path: Path, with_native: ModuleType) -> None:
    rng = random.Random(1000 + seed)
    for case in range(DAMAGED // 3):
        base = tmp_path / str(case)
        files = _random_tree(rng, 6)
        store = base / "store"
        manifest = pack(write_tree(base / "src", files), store, name="d", max_bytes=1 << 30)
        assert len(manifest.bundles) == 1
        path = Path(bundle_path(str(store), manifest.bundles[0].digest))
        tar = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())
        damaged = mutations(rng, tar)
        for n in range(DAMAGE_EACH):
            stream = next(damaged)
            test_native_unpack._replace_bundle(store, manifest, stream)
            where = base / f"damage-{n}"
            where.mkdir()
            pure = test_native_unpack._outcome(store, manifest, where / "pure", False)
            assert test_native_unpack._outcome(store, manifest, where / "native", True) == pure, (seed, case, n)
