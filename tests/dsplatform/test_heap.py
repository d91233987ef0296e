"""The collector paused around a large parse (dsplatform.heap): off inside, as it was after."""

from __future__ import annotations

import gc
import platform
import sys

import pytest

from dsplatform.heap import collector_paused


def test_the_collector_is_off_inside_and_back_on_after_even_on_an_error() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("a corrupt document")
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_embedding_stays_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_manifest_is_parsed_with_the_collector_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from dsagent.format import manifest as manifest_module
    from dsagent.format import native
    from dsagent.format.entries import FileEntry
    from dsagent.format.manifest import Manifest, decode_manifest

    seen: list[bool] = []

    def watch(module: object, name: str) -> None:  # the json parse, and the C one where it is built
        parse = getattr(module, name)

        def watched(lines: list[bytes]) -> object:
            seen.append(gc.isenabled())
            return parse(lines)

        monkeypatch.setattr(module, name, watched)

    watch(manifest_module, "_parse_batch")
    watch(native, "entry_columns")
    entries = [FileEntry(f"f{i:03d}", i, 0, f"{i:032x}") for i in range(10)]
    made = Manifest.create("ds", entries)
    assert decode_manifest(made.to_bytes()).digest == made.digest
    assert seen and not any(seen)
    assert gc.isenabled()


CHURN = """
import os, random, resource, sys, threading
from dsplatform.heap import keep_stream_chunks
kept = keep_stream_chunks(os.environ) if sys.argv[1] == "kept" else False
def churn(out):
    rng, held = random.Random(1), []
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(300):  # stream chunks of 0.5-1 MiB, two held at a time, on a thread of their own
        held.append(b"x" * rng.randrange(512 << 10, 1 << 20))
        if len(held) > 2:
            held.pop(0)
    out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
out = []
thread = threading.Thread(target=churn, args=(out,))
thread.start()
thread.join()
print(kept, out[0])
"""


def _churn(mode: str, **env: str) -> tuple[bool, int]:
    import os
    import subprocess
    import sys

    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    done = subprocess.run(
        [sys.executable, "-c", CHURN, mode], env={**clean, **env}, capture_output=True, text=True, check=True
    )
    kept, faults = done.stdout.split()
    return kept == "True", int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_stream_chunks_stop_faulting_pages_in_once_the_thresholds_are_fixed() -> None:
    plain_kept, plain = _churn("plain")
    kept, faults = _churn("kept")
    assert (plain_kept, kept) == (False, True)
    if plain < 3000:
        pytest.skip(f"this kernel faulted {plain} pages for 300 chunks: pages are not faulted in one by one here")
    assert faults * 3 < plain, (faults, plain)


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
@pytest.mark.parametrize(
    "env",
    [
        {"MALLOC_TRIM_THRESHOLD_": "131072"},
        {"MALLOC_MMAP_THRESHOLD_": "131072"},
        {"MALLOC_ARENA_MAX": "2"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
    ],
)
def test_thresholds_the_operator_set_are_left_alone(env: dict[str, str]) -> None:
    kept, _ = _churn("kept", **env)
    assert not kept
