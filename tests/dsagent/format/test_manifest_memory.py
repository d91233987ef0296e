"""Reading a hostile-but-valid manifest of many small entries costs
memory in proportion to the entries it yields, with no whole-manifest temporaries on top.
Peak memory is the kernel's (``wait4`` rusage) for a fresh ``read_manifest`` process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dsagent.format.manifest import FileEntry, Manifest, read_manifest
from tools.support.harness import run_measured

pytestmark = pytest.mark.slow

ENTRIES = 200_000

#: Fresh-process peak allowed: imports (~32 MiB, fsspec being half of it) plus parse batches
#: (a few MiB) within 56 MiB, plus 150 bytes an entry. Entries are held column-wise
#: (manifest.EntryTable): ~104 bytes an entry (its path 64 and list slot 8, 16 digest bytes,
#: two 8-byte numbers), plus the columns' growth. Measured (Python 3.11): 74 MiB for 200,000
#: entries and 169 MiB for 10^6, against bounds of 84.6 and 199 MiB; FileEntry objects in a
#: tuple took 89 and 267 MiB.
PEAK_FIXED = 56 << 20
PEAK_PER_ENTRY = 150

_READ = "import sys; from dsagent.format.manifest import read_manifest; print(read_manifest(sys.argv[1], 'big').digest)"


def test_a_manifest_of_many_entries_is_read_in_memory_proportional_to_them(tmp_path: Path) -> None:
    entries = [FileEntry(f"d{i // 1000:04d}/f{i:07d}", 1, 0, f"{i:032x}") for i in range(ENTRIES)]
    written = Manifest.create("big", entries)
    del entries
    store = tmp_path / "store"
    (store / "big").mkdir(parents=True)
    (store / "big" / "manifest").write_bytes(written.to_bytes())

    code, peak, output = run_measured([sys.executable, "-c", _READ, str(store)])
    assert code == 0, output
    assert output.strip() == written.digest, output
    bound = PEAK_FIXED + PEAK_PER_ENTRY * ENTRIES
    assert peak < bound, f"read_manifest peaked at {peak >> 20} MiB (bound {bound >> 20} MiB)"

    read = read_manifest(str(store), "big")
    assert read.digest == written.digest
    assert read.entries == written.entries
    assert read == written


def test_the_path_order_is_checked_across_parse_batches() -> None:
    from dsagent.format.manifest import _BodyChecks

    def columns(*paths: str, digest: str = "0" * 32) -> tuple[list[object], ...]:
        return list(paths), [1] * len(paths), [0] * len(paths), [digest] * len(paths)

    for second in ("a/b", "a/a"):  # equal to, then before, the previous batch's last path
        checks = _BodyChecks()
        assert checks.batch(columns("a/a", "a/b"))  # type: ignore[arg-type]
        assert checks.batch(columns(second, "z"))  # type: ignore[arg-type]
        assert checks.disordered and not checks.malformed
    checks = _BodyChecks()
    checks.batch(columns("a/a", "a/b"))  # type: ignore[arg-type]
    checks.batch(columns("a/c"))  # type: ignore[arg-type]
    assert not checks.disordered and not checks.malformed
    assert not checks.batch(columns("b", digest="0" * 31 + "G"))  # type: ignore[arg-type]
    assert checks.malformed


def test_a_digest_of_two_hex_blocks_joined_by_a_newline_is_refused() -> None:
    import io

    import pytest
    import zstandard

    from dsagent.errors import IntegrityError
    from dsagent.format.manifest import FileEntry, Manifest, read_manifest_stream

    honest = Manifest.create("forged", [FileEntry("a.jpg", 1, 0, "a" * 32)]).to_bytes()
    header = honest.partition(b"\n")[0]  # the header is not authenticated: the body's checks decide
    line = '["a.jpg",1,0,"' + "a" * 32 + "\\n" + "b" * 32 + '"]\n'
    data = header + b"\n" + zstandard.ZstdCompressor().compress(line.encode())
    with pytest.raises(IntegrityError, match="malformed file entry"):
        read_manifest_stream(io.BytesIO(data))


def test_a_manifest_listing_more_files_than_allowed_is_refused_before_its_body_is_read() -> None:
    import io

    import pytest

    from dsagent.errors import InvalidInput
    from dsagent.format.manifest import read_manifest_stream

    entries = [FileEntry(f"f{i:04d}", 1, 0, f"{i:032x}") for i in range(100)]
    data = Manifest.create("many", entries).to_bytes()
    header = data.partition(b"\n")[0] + b"\n"
    assert read_manifest_stream(io.BytesIO(data), max_files=100).file_count == 100
    with pytest.raises(InvalidInput, match="lists 100 files; this agent accepts at most 99"):
        read_manifest_stream(io.BytesIO(header + b"not even zstd"), max_files=99)  # the body is never read
