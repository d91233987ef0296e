"""kill -9 in the middle of packing or unpacking leaves nothing half-written in sight."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from dsagent.errors import NotFound
from dsagent.format.bundles.bundle import pack, unpack, verify_tree
from dsagent.format.manifest import read_manifest
from tests.dsagent.conftest import write_tree

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]


def _dataset(root: Path) -> Path:
    rng = __import__("random").Random(3)
    return write_tree(root, {f"c{i % 5}/{i:04d}.bin": rng.randbytes(40_000) for i in range(300)})


def _kill_when(args: list[str], ready: Callable[[], bool]) -> None:
    """Run ``dsctl args`` in a child and SIGKILL it as soon as ``ready()`` holds."""
    env = {**os.environ, "DSAGENT_DIGEST_CACHE": os.devnull + "-unused", "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-m", "dsagent.cli", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while not ready():
            if child.poll() is not None or time.monotonic() > deadline:
                pytest.skip("the child finished before it could be killed mid-write")
            time.sleep(0.002)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()


def test_a_pack_killed_mid_bundle_publishes_no_bundle_and_no_manifest(tmp_path: Path) -> None:
    src, store = _dataset(tmp_path / "src"), tmp_path / "store"
    bundles = store / "bundles"
    _kill_when(
        [
            "pack",
            str(src),
            "--name",
            "d",
            "--to",
            str(store),
            "--level",
            "19",
            "--max-bytes",
            "4MB",
            "--no-digest-cache",
        ],
        lambda: bundles.is_dir() and any(p.name.endswith(".tmp") for p in bundles.iterdir()),
    )
    for published in (p for p in bundles.iterdir() if not p.name.startswith(".")):
        decompressor = zstandard.ZstdDecompressor().decompressobj()
        decompressor.decompress(published.read_bytes())
        assert decompressor.eof, f"{published.name} was published incomplete"
    with pytest.raises(NotFound):
        read_manifest(str(store), "d")
    manifest = pack(src, store, name="d", max_bytes=4_000_000)  # a rerun completes and reads back whole
    assert read_manifest(str(store), "d") == manifest


def test_an_unpack_killed_mid_way_leaves_no_target(tmp_path: Path) -> None:
    src, store, dest = _dataset(tmp_path / "src"), tmp_path / "store", tmp_path / "cache" / "d"
    manifest = pack(src, store, name="d", max_bytes=2_000_000)
    _kill_when(
        ["unpack", str(store), str(dest), "--name", "d", "--workers", "1"],
        lambda: any(p.name.startswith(".d.staging-") for p in dest.parent.iterdir()) if dest.parent.is_dir() else False,
    )
    assert not dest.exists()
    unpack(store, name="d", dest=dest)
    verify_tree(dest, manifest)
