"""The collector paused around a large parse (dsplatform.heap): off inside, as it was after."""

from __future__ import annotations

import gc

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
    from dsagent.format.entries import FileEntry
    from dsagent.format.manifest import Manifest, decode_manifest

    seen: list[bool] = []
    parse = manifest_module._parse_batch

    def watched(lines: list[bytes]) -> object:
        seen.append(gc.isenabled())
        return parse(lines)

    monkeypatch.setattr(manifest_module, "_parse_batch", watched)
    entries = [FileEntry(f"f{i:03d}", i, 0, f"{i:032x}") for i in range(10)]
    made = Manifest.create("ds", entries)
    assert decode_manifest(made.to_bytes()).digest == made.digest
    assert seen and not any(seen)
    assert gc.isenabled()
