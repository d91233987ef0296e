"""Fixtures shared by the dsagent tests (append-only: the bundle and agent work both add here)."""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import pytest

# --------------------------------------------------------------------------- bundles

#: An awkward little dataset: unicode, a path over 100 bytes, empty files, deep nesting,
#: an empty directory, and one file bigger than the small ``max_bytes`` the tests use.
AWKWARD_FILES: dict[str, bytes] = {
    "train/cat/0001.jpg": b"\xff\xd8" + bytes(range(256)) * 40,
    "train/cat/0002.jpg": b"\xff\xd8" + b"meow" * 1000,
    "train/dog/0001.jpg": b"\xff\xd8" + b"woof" * 700,
    "train/dog/empty.jpg": b"",
    "val/\u00e9t\u00e9/\u65e5\u672c\u8a9e-\U0001f600.png": b"unicode " * 100,
    "deep/" + "/".join(f"level{i}" for i in range(20)) + "/leaf.bin": b"deep",
    "long/" + "x" * 150 + ".bin": b"long name" * 10,
    "big.bin": bytes(random.Random(7).getrandbits(8) for _ in range(40_000)),
    "zero-size": b"",
}
AWKWARD_EMPTY_DIRS = ("val/empty-class", "zz-empty")


def write_tree(root: Path, files: dict[str, bytes], empty_dirs: tuple[str, ...] = ()) -> Path:
    """Materialise ``files`` (relative path -> bytes) and ``empty_dirs`` under ``root``."""
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for rel in empty_dirs:
        (root / rel).mkdir(parents=True, exist_ok=True)
    return root


@pytest.fixture
def awkward_dataset(tmp_path: Path) -> Path:
    """A local source directory holding :data:`AWKWARD_FILES` and :data:`AWKWARD_EMPTY_DIRS`."""
    return write_tree(tmp_path / "source", AWKWARD_FILES, AWKWARD_EMPTY_DIRS)


@pytest.fixture
def memory_root() -> Iterator[str]:
    """A fresh ``memory://`` prefix, removed afterwards (the memory filesystem is global)."""
    root = f"memory://dsagent-tests/{os.urandom(6).hex()}"
    yield root
    fs = fsspec.filesystem("memory")
    path = root.split("://", 1)[1]
    if fs.exists(path):
        fs.rm(path, recursive=True)


# --------------------------------------------------------------------------- agent

from typing import Any  # noqa: E402 - this file is append-only


@pytest.fixture
def loopback(tmp_path: Path) -> Iterator[tuple[Path, str, Any]]:
    """``(directory, url, server)``: a real HTTP server on 127.0.0.1 serving a fresh directory."""
    from tools.support.harness import LoopbackServer

    directory = tmp_path / "www"
    directory.mkdir()
    server = LoopbackServer(directory)
    yield directory, server.url, server
    server.close()


@pytest.fixture
def agent_factory(tmp_path: Path) -> Iterator[Any]:
    """Start real ``dsagent serve`` processes; every one is stopped after the test."""
    from tools.support.harness import AgentProcess

    started: list[AgentProcess] = []

    def start(name: str = "agent", **kwargs: Any) -> AgentProcess:
        agent = AgentProcess(tmp_path / name, **kwargs).start()
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()


# --------------------------------------------------------------------------- full disks


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``mount(size)``: a new tmpfs of ``size`` (``mount -o size=``, e.g. ``"24m"``) in the
    test's directory, unmounted afterwards; the test is skipped (saying why) without root."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a small filesystem needs root")
        disk = tmp_path / f"disk{len(mounted)}"
        disk.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
        mounted.append(disk)
        return disk

    yield mount
    for disk in mounted:
        subprocess.run(["umount", "-l", str(disk)], check=False)
