"""``dsctl pack``'s progress gives the totals, a percentage and an ETA once the source is
listed, for a local source and for one digested first (any other source)."""

from __future__ import annotations

import io
from pathlib import Path

import fsspec
import pytest

from dsagent.cli.digesting import Counter
from dsagent.format.bundles.bundle import pack


def tree(root: Path, files: int) -> Path:
    root.mkdir()
    for i in range(files):
        (root / f"f{i:03d}.bin").write_bytes(bytes([i % 251]) * (1000 + i))
    return root


@pytest.mark.parametrize("where", ["local", "memory"])
def test_pack_tells_its_progress_the_totals_and_the_line_shows_them(tmp_path: Path, where: str) -> None:
    source = tree(tmp_path / "src", 30)
    total = sum(p.stat().st_size for p in source.iterdir())
    url: str | Path = source
    if where == "memory":  # another filesystem: digested first, then packed
        fs = fsspec.filesystem("memory")
        for p in source.iterdir():
            fs.pipe(f"/pack-progress-{tmp_path.name}/{p.name}", p.read_bytes())
        url = f"memory:///pack-progress-{tmp_path.name}"
    ticks = iter(range(10_000))
    shown = Counter("packing", stream=io.StringIO(), clock=lambda: float(next(ticks)))
    pack(url, tmp_path / "store", name="ds", max_files=8, progress=shown)
    assert (shown.total_files, shown.total_bytes) == (30, total)
    assert (shown.files, shown.bytes) == (30, total)
    line = shown.line(shown.clock())
    assert line.startswith("packing: 30/30 files, ") and "(100%)" in line and "/s" in line
    assert "packing: " in shown.stream.getvalue()


def test_before_the_totals_are_known_the_line_is_a_count() -> None:
    shown = Counter("packing", stream=io.StringIO(), clock=lambda: 0.0)
    shown(500, 3)
    assert shown.line(1.0) == "packing: 3 files, 500 B"
    shown.expect(2000, 12)
    assert shown.line(1.0) == "packing: 3/12 files, 500 B/2 kB (25%), 500 B/s, eta 3s"
