"""The quick way into ``dsctl pack`` and ``unpack`` (:mod:`dsagent.cli.bundlework`) reads a command
line as click reads it, or leaves it to click: each plain form is parsed both ways and the
parameters compared; every other form is left alone."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from dsagent.cli.bundles import pack, unpack
from dsagent.cli.bundlework import parse_plain

_PLAIN = [
    ["pack", "src", "--name", "d", "--to", "store"],
    ["pack", "--to=store", "src", "--name=d", "-o", "json", "--no-digest-cache"],
    ["pack", "src", "--name", "d", "--to", "store", "--max-files", "7", "--max-bytes", "1GiB", "--level", "-3"],
    ["pack", "src", "--name", "", "--to", "store", "--threads", "0", "--processes", " 4", "--digest-cache"],
    ["pack", "src", "--name", "d", "--to", "store", "--level=22", "--output", "text"],
    ["unpack", "store", "dest", "--name", "d"],
    ["unpack", "--name", "d", "store", "dest", "--workers", "3", "--output=json"],
]

_CLICKS = [
    [],
    ["digest", "src"],
    ["pack", "src", "--name", "d"],  # --to missing: click says so
    ["pack", "src", "--to", "store"],  # --name missing
    ["pack", "s3://bucket/src", "--name", "d", "--to", "store"],  # a URL: fsspec, through click
    ["pack", "src", "--name", "d", "--to", "s3://bucket/store"],
    ["pack", "src", "--name", "d", "--to", "store", "--publish", "ns"],
    ["pack", "src", "--name", "d", "--to", "store", "--source-option", "anon=true"],
    ["pack", "src", "--name", "d", "--to", "store", "--level", "23"],  # click's range error
    ["pack", "src", "--name", "d", "--to", "store", "--max-files", "0"],
    ["pack", "src", "--name", "d", "--to", "store", "--threads", "x"],
    ["pack", "src", "--name", "d", "--to", "store", "-o", "yaml"],
    ["pack", "src", "--name", "d", "--to", "store", "-ojson"],
    ["pack", "src", "--name", "d", "--name", "e", "--to", "store"],  # twice: click's rule
    ["pack", "src", "--name", "d", "--to", "store", "--no-digest-cache=1"],
    ["pack", "src", "other", "--name", "d", "--to", "store"],
    ["pack", "src", "--name", "d", "--to", "store", "--help"],
    ["pack", "src", "--name", "d", "--to", "store", "--"],
    ["pack", "-", "--name", "d", "--to", "store"],
    ["pack", "src", "--name", "d", "--to"],
    ["unpack", "store", "--name", "d"],
    ["unpack", "store", "dest"],
    ["unpack", "store", "dest", "--name", "d", "--workers", "0"],
    ["unpack", "store", "dest", "--name", "d", "--store-option", "anon=true"],
    ["unpack", "store", "dest", "--name", "d", "--max-files", "3"],  # pack's option
]


@pytest.mark.parametrize("args", _PLAIN, ids=" ".join)
def test_a_plain_form_is_read_as_click_reads_it(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    parsed = parse_plain(args)
    assert parsed is not None
    command, parameters = parsed
    assert command == args[0]
    with click.Context(click.Command("dsctl")) as parent:
        context = {"pack": pack, "unpack": unpack}[command].make_context(command, args[1:], parent=parent)
    assert parameters == {k: v for k, v in context.params.items() if k in parameters}
    assert all(v in ((), None) for k, v in context.params.items() if k not in parameters)  # no options, no --publish


@pytest.mark.parametrize("args", _CLICKS, ids=lambda a: " ".join(a) or "nothing")
def test_every_other_form_is_left_to_click(args: list[str]) -> None:
    assert parse_plain(args) is None


def test_an_unpack_into_a_file_is_left_to_click_which_refuses_it(tmp_path: Path) -> None:
    (tmp_path / "dest").write_text("a file")
    args = ["unpack", "store", str(tmp_path / "dest"), "--name", "d"]
    assert parse_plain(args) is None
    with click.Context(click.Command("dsctl")) as parent, pytest.raises(click.BadParameter, match="is a file"):
        unpack.make_context("unpack", args[1:], parent=parent)
