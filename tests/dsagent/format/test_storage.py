from __future__ import annotations

import pytest

from dsagent.errors import InvalidInput, NotFound, SourceUnavailable
from dsagent.format.storage import resolve, translate_errors


def test_local_paths_and_urls_resolve_to_filesystems(tmp_path) -> None:
    fs, path = resolve(tmp_path)
    assert fs.isdir(path)
    mem, mpath = resolve("memory://datasets/x")
    assert "memory" in mem.protocol and mpath.endswith("datasets/x")


@pytest.mark.parametrize("url", ["", "nosuchproto://bucket/x", "bad\x00path"])
def test_malformed_locations_are_invalid_input(url: str) -> None:
    with pytest.raises(InvalidInput):
        resolve(url)


def test_foreign_errors_are_translated_where_they_enter(tmp_path) -> None:
    fs, _ = resolve(tmp_path)
    with pytest.raises(NotFound) as nf, translate_errors("source 'x'"):
        fs.open(str(tmp_path / "missing"))
    assert isinstance(nf.value.__cause__, FileNotFoundError)
    with pytest.raises(SourceUnavailable), translate_errors("store"):
        raise ConnectionResetError("peer reset")


def test_paths_resolve_within_roots_through_symlinks_but_not_by_prefix(tmp_path) -> None:
    from dsagent.format.storage import resolves_within

    (tmp_path / "nfs" / "ds").mkdir(parents=True)
    (tmp_path / "nfs-evil").mkdir()
    (tmp_path / "nfs" / "ds" / "escape").symlink_to(tmp_path / "nfs-evil")
    assert resolves_within(tmp_path / "nfs" / "ds", [tmp_path / "nfs"])
    assert resolves_within(tmp_path / "nfs", [tmp_path / "nfs"])
    assert not resolves_within(tmp_path / "nfs-evil", [tmp_path / "nfs"])  # a sibling sharing the prefix
    assert not resolves_within(tmp_path / "nfs" / "ds" / "escape", [tmp_path / "nfs"])
    assert not resolves_within(tmp_path / "nfs", [])


def test_a_filesystem_failing_while_it_is_built_is_translated(tmp_path) -> None:
    with pytest.raises(NotFound) as excinfo:
        resolve(f"zip://x::file://{tmp_path}/missing.zip")  # the zip filesystem opens its archive at once
    assert isinstance(excinfo.value.__cause__, FileNotFoundError)
