"""Decompression bombs. A bundle yields at most what its manifest
declares (plus tar headers) and nothing after the tar's end; a manifest's body is bounded
by its header and parsed as a stream. Real tar + zstd, a real ``dsctl unpack`` process and
a real agent; peak memory is the kernel's (``wait4`` rusage / ``VmHWM``).


"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import zstandard

from dsagent.errors import IntegrityError
from dsagent.format.bundles.bundle import pack
from dsagent.format.manifest import (
    FORMAT,
    FORMAT_VERSION,
    BundleRef,
    FileEntry,
    Manifest,
    bundle_digest,
    bundle_path,
    dataset_digest,
    read_manifest,
)
from tools.support.harness import ADMIN_TOKEN, LoopbackServer, run_measured

pytestmark = pytest.mark.slow

#: Zeros hidden after the tar's end / in the manifest body: 1 GiB, compressed to ~32 KB.
BOMB_BYTES = 1 << 30
PEAK_LIMIT = 256 << 20


def _zstd_of(head: bytes, zeros: int, fill: bytes = b"\0") -> bytes:
    """One zstd frame (with checksum and content size, as one-shot compression writes it)
    of ``head`` then ``zeros`` bytes of ``fill``."""
    out = bytearray()

    class Sink:
        def write(self, data: bytes) -> int:
            out.extend(data)
            return len(data)

    block = fill * (16 << 20)
    with zstandard.ZstdCompressor(level=1, write_checksum=True).stream_writer(
        Sink(), size=len(head) + zeros, closefd=False
    ) as writer:  # type: ignore[arg-type]
        writer.write(head)
        left = zeros
        while left:
            writer.write(block[: min(left, len(block))])
            left -= min(left, len(block))
    return bytes(out)


@pytest.fixture(scope="module")
def bundle_bomb(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A store whose one bundle holds its real file, then 1 GiB of zeros after the tar's end."""
    base = tmp_path_factory.mktemp("bomb")
    (base / "src").mkdir()
    (base / "src" / "real.bin").write_bytes(b"real data " * 100)
    manifest = pack(base / "src", base / "www" / "store", name="bomb")
    path = Path(bundle_path(str(base / "www" / "store"), manifest.bundles[0].digest))
    tar = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())
    end = tar.index(bytes(1024), 1024)  # the end-of-archive blocks after the one member
    path.write_bytes(_zstd_of(tar[: end + 1024], BOMB_BYTES))
    assert path.stat().st_size < 200_000
    return base, "bomb"


@pytest.fixture(scope="module")
def manifest_bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store whose manifest declares no files and whose body is 1 GiB of whitespace."""
    store = tmp_path_factory.mktemp("mbomb") / "store"
    header = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "name": "empty",
        "files": 0,
        "bytes": 0,
        "digest": dataset_digest([]),
        "bundles": [],
        "directories": [],
    }
    (store / "empty").mkdir(parents=True)
    (store / "empty" / "manifest").write_bytes(json.dumps(header).encode() + b"\n" + _zstd_of(b"", BOMB_BYTES, b" "))
    return store


#: Entries of the many-entries manifest: 3 MB manifest (727 MB, 11.6 s).
MANY = 1_000_000


@pytest.fixture(scope="module")
def many_entries(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store whose valid manifest lists 10^6 one-byte files in 20 bundles (2.6 MB stored),
    none of which exist: reading the manifest is the whole cost."""
    store = tmp_path_factory.mktemp("many") / "store"
    plain = Manifest.create("many", (FileEntry(f"d{i // 1000:04d}/f{i:07d}", 1, 0, f"{i:032x}") for i in range(MANY)))
    step = MANY // 20
    refs = [BundleRef(bundle_digest(plain.entries[i : i + step]), i, step, step, 1000) for i in range(0, MANY, step)]
    (store / "many").mkdir(parents=True)
    (store / "many" / "manifest").write_bytes(plain.with_bundles(refs).to_bytes())
    return store


def test_a_bundle_with_data_after_the_tar_end_is_refused_in_bounded_memory(
    bundle_bomb: tuple[Path, str], tmp_path: Path
) -> None:
    base, name = bundle_bomb
    code, peak, output = run_measured(
        [
            sys.executable,
            "-m",
            "dsagent.cli",
            "unpack",
            str(base / "www" / "store"),
            str(tmp_path / "out"),
            "--name",
            name,
        ]
    )
    assert code == IntegrityError.exit_code, output
    assert "after the end of its tar" in output or "more than" in output, output
    assert peak < PEAK_LIMIT, f"dsctl unpack peaked at {peak >> 20} MiB"
    assert not (tmp_path / "out").exists()


def test_a_manifest_bomb_is_refused_in_bounded_memory(manifest_bomb: Path, tmp_path: Path) -> None:
    code, peak, output = run_measured(
        [sys.executable, "-m", "dsagent.cli", "unpack", str(manifest_bomb), str(tmp_path / "out"), "--name", "empty"]
    )
    assert code == IntegrityError.exit_code, output
    assert peak < PEAK_LIMIT, f"dsctl unpack peaked at {peak >> 20} MiB"
    with pytest.raises(IntegrityError):
        read_manifest(str(manifest_bomb), "empty")


def _vm_hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


#: The million-entry manifest takes seconds to build: its two tests share one worker, so it is built once.
MILLION = pytest.mark.xdist_group("million-entries")


@MILLION
def test_the_agent_refuses_both_bombs_and_reads_a_million_entries_in_bounded_memory(
    agent_factory: Any, bundle_bomb: tuple[Path, str], manifest_bomb: Path, many_entries: Path, tmp_path: Path
) -> None:
    base, name = bundle_bomb
    (base / "www" / "mstore").mkdir(exist_ok=True)
    os.system(f"cp -r {manifest_bomb}/empty {many_entries}/many {base / 'www' / 'mstore'}/")  # noqa: S605 - test data
    server = LoopbackServer(base / "www")
    agent = agent_factory(tcp=True, fresh=True)  # its own peak memory: no forked start
    try:
        with httpx.Client(base_url=agent.url, timeout=120, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
            for task, dataset in (
                ("t-bundle", {"name": name, "source": f"{server.url}/nowhere", "bundles": f"{server.url}/store"}),
                ("t-manifest", {"name": "empty", "source": f"{server.url}/nowhere", "bundles": f"{server.url}/mstore"}),
            ):
                record = http.put(f"/v1/tasks/{task}?wait=60", json={"datasets": [dataset]}).json()
                assert record["state"] == "failed", record
                assert record["datasets"][0]["error"]["code"] == "integrity", record
            many = {"name": "many", "source": f"{server.url}/nowhere", "bundles": f"{server.url}/mstore"}
            record = http.put("/v1/tasks/t-many?wait=120", json={"datasets": [many]}).json()
            assert record["state"] == "failed", record  # its bundles do not exist, or do not fit
            assert record["datasets"][0]["error"]["code"] != "integrity", record  # the manifest itself is valid
            assert all(d["state"] != "ready" for d in http.get("/v1/datasets").json()["datasets"])
        assert agent.proc is not None
        peak = _vm_hwm(agent.proc.pid)
        assert peak < PEAK_LIMIT, f"the agent peaked at {peak >> 20} MiB"
    finally:
        server.close()


@MILLION
def test_the_agent_refuses_a_manifest_of_more_files_than_it_accepts(
    agent_factory: Any, many_entries: Path, tmp_path: Path
) -> None:
    """DSAGENT_MAX_DATASET_FILES bounds what one request can make the agent hold: a manifest
    declaring more files is a 400-class failure before its body is read, and nothing is kept."""
    server = LoopbackServer(many_entries.parent)
    agent = agent_factory(tcp=True, fresh=True, env={"DSAGENT_MAX_DATASET_FILES": str(MANY - 1)})
    try:
        with httpx.Client(base_url=agent.url, timeout=60, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
            many = {"name": "many", "source": f"{server.url}/nowhere", "bundles": f"{server.url}/{many_entries.name}"}
            record = http.put("/v1/tasks/t-many?wait=30", json={"datasets": [many]}).json()
            assert record["state"] == "failed", record
            error = record["datasets"][0]["error"]
            assert error["code"] == "invalid_input" and "DSAGENT_MAX_DATASET_FILES" in error["hint"], record
            assert http.get("/v1/datasets").json()["datasets"] == []
        assert agent.proc is not None
        assert _vm_hwm(agent.proc.pid) < 128 << 20  # the body was never parsed
    finally:
        server.close()
