"""The paced background writeback of unpacked files (durable.Writeback): when it flushes, how
many flushes at once, what it holds, and that an unpack drives it."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from dsagent.format import durable
from dsagent.format.bundles.bundle import pack, unpack
from dsagent.format.durable import Writeback, writeback_for
from tests.dsagent.conftest import write_tree


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def flushes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """Each flush as (the device it synced, the thread it ran on), recorded around the real syncfs."""
    seen: list[tuple[int, str]] = []
    real = durable._syncfs_fd

    def spy(fd: int) -> bool:
        seen.append((os.fstat(fd).st_dev, threading.current_thread().name))
        return real(fd)

    monkeypatch.setattr(durable, "_syncfs_fd", spy)
    return seen


def test_a_flush_starts_each_step_on_a_background_thread_unless_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flushes: list[tuple[int, str]]
) -> None:
    monkeypatch.setattr(durable, "WRITEBACK_STEP", 1000)
    writeback = Writeback()
    with open(tmp_path / "f", "wb") as fh:
        fh.write(b"x" * 3000)
        writeback.written(fh.fileno(), 999)
        writeback.wait()
        assert flushes == []  # under one step: nothing yet
        writeback.written(fh.fileno(), 1)
        writeback.wait()
        assert flushes == [(os.stat(tmp_path).st_dev, "dsagent-writeback")]
        writeback.written(fh.fileno(), 1500)  # the count starts again after each flush
        writeback.wait()
        assert len(flushes) == 2
        monkeypatch.setattr(durable, "WRITEBACK_STEP", 0)  # off
        writeback.written(fh.fileno(), 1 << 40)
        writeback.wait()
        assert len(flushes) == 2


def test_one_flush_at_a_time_and_no_descriptor_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(durable, "WRITEBACK_STEP", 10)
    release, entered = threading.Event(), threading.Event()
    started: list[int] = []

    def slow(fd: int) -> bool:
        started.append(fd)
        entered.set()
        return release.wait(10)

    monkeypatch.setattr(durable, "_syncfs_fd", slow)
    writeback = Writeback()
    before = _open_fds()
    with open(tmp_path / "f", "wb") as fh:
        writeback.written(fh.fileno(), 10)
        assert entered.wait(10)
        for _ in range(50):  # 50 more steps while the first flush is still running
            writeback.written(fh.fileno(), 10)
        assert len(started) == 1
        release.set()
        writeback.wait()
        writeback.written(fh.fileno(), 10)  # the flush ended: the next step starts another
        writeback.wait()
    assert len(started) == 2
    assert _open_fds() == before  # each flush's copy of the descriptor was closed


def test_one_writeback_per_filesystem(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert writeback_for(tmp_path / "a") is writeback_for(tmp_path / "b")
    if os.path.isdir("/dev/shm") and os.stat("/dev/shm").st_dev != os.stat(tmp_path).st_dev:
        assert writeback_for("/dev/shm") is not writeback_for(tmp_path)


def test_an_unpack_flushes_as_it_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flushes: list[tuple[int, str]]
) -> None:
    """Every 8 kB unpacked starts a background flush of the target's filesystem (when none is
    running), and the tree is whole and verified."""
    monkeypatch.setattr(durable, "WRITEBACK_STEP", 8000)
    files = {f"d{i % 4}/f{i:03d}": os.urandom(3000 + i) for i in range(40)}
    pack(write_tree(tmp_path / "src", files), tmp_path / "store", name="p")
    unpack(tmp_path / "store", name="p", dest=tmp_path / "out")
    writeback_for(tmp_path).wait()
    assert {
        p.relative_to(tmp_path / "out").as_posix(): p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()
    } == files
    background = [device for device, thread in flushes if thread == "dsagent-writeback"]
    assert background  # besides the unpack's own syncfs calls before and after publishing
    assert set(background) == {os.stat(tmp_path).st_dev}


def test_a_failed_background_flush_fails_every_writer_since_naming_the_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel reports a writeback error to one syncfs only: the background flush's is
    kept and raised to each writer that marked before it, naming a directory of the
    filesystem (so it reads as the cache disk's, not a source's), with the flush's errno."""
    monkeypatch.setattr(durable, "WRITEBACK_STEP", 10)

    def failing(fd: int) -> bool:
        raise OSError(errno.ENOSPC, "No space left on device")  # nameless, as the kernel's

    monkeypatch.setattr(durable, "_syncfs_fd", failing)
    writeback = Writeback(tmp_path)  # as writeback_for makes it for the filesystem's first directory
    before = writeback.mark()
    with open(tmp_path / "f", "wb") as fh:
        writeback.written(fh.fileno(), 10)
    with pytest.raises(durable.WritebackError) as failed:
        writeback.check(before)
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(tmp_path)
    writeback.check(writeback.mark())  # a writer that marked after it is not failed
