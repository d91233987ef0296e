"""What the commands import: a ``dsctl`` process pays for every module it loads.

``dsctl unpack``, ``digest`` and ``pack`` of local paths need neither fsspec nor pydantic, and ``dsctl cache``
(every init-container runs it) needs no FastAPI app; each check runs the command in a
fresh interpreter and lists the modules it loaded.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from dsagent.format import native
from dsagent.format.bundles.bundle import pack
from dsagent.format.storage import local_path
from tests.conftest import REPO_ROOT
from tests.dsagent.conftest import write_tree

pytestmark = pytest.mark.slow

_PROBE = """
import json, sys
from dsagent.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def _loaded(args: list[str], tmp_path: Path, *, bare: bool = False) -> tuple[int, set[str]]:
    """The command's exit code and the modules its process loaded; ``bare``: without the site's
    start-up files (``-S``: an editable install's import hook loads pathlib into every
    interpreter), the site-packages put on the path instead, and the native loops' switch
    left unset."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "DSAGENT_DIGEST_CACHE": str(tmp_path / "digests.sqlite")}
    flags: list[str] = []
    if bare:
        flags = ["-S"]
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *site.getsitepackages()])
        env.pop("DSAGENT_NATIVE", None)
    command = [sys.executable, *flags, "-c", _PROBE, *args]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    report = json.loads(done.stderr.strip().splitlines()[-1])
    return report["code"] or 0, set(report["modules"])


def test_dsctl_unpack_and_verify_of_a_local_store_import_neither_fsspec_nor_pydantic(tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", {"a/1.jpg": b"x" * 3000, "b/2.jpg": b"y" * 10})
    pack(src, tmp_path / "store", name="d")
    for args in (
        ["unpack", str(tmp_path / "store"), str(tmp_path / "out"), "--name", "d"],
        ["verify", str(tmp_path / "out"), "--manifest", str(tmp_path / "store"), "--name", "d"],
    ):
        code, modules = _loaded(args, tmp_path)
        assert code == 0, args
        assert not {m for m in modules if m.split(".")[0] in ("fsspec", "pydantic", "pydantic_settings")}, args
    assert (tmp_path / "out" / "a" / "1.jpg").read_bytes() == b"x" * 3000


def test_dsctl_digest_and_pack_of_local_paths_import_neither_fsspec_nor_pydantic(tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", {"a/1.jpg": b"x" * 3000, "b/2.jpg": b"y" * 10, "c/empty/.keep": b""})
    digests = []
    for args in (
        ["digest", str(src), "-o", "json"],
        ["pack", str(src), "--name", "d", "--to", str(tmp_path / "store"), "-o", "json"],
        ["pack", str(src), "--name", "d", "--to", str(tmp_path / "store"), "-o", "json"],  # every bundle reused
        ["digest", str(src / "a" / "1.jpg"), "-o", "json"],  # a lone file is a dataset of one
    ):
        code, modules = _loaded(args, tmp_path)
        assert code == 0, args
        assert not {m for m in modules if m.split(".")[0] in ("fsspec", "pydantic", "pydantic_settings")}, args
    # the same answers as through fsspec (the library call, with fsspec loaded by a URL form)
    for args in (["digest", str(src), "-o", "json"], ["digest", f"file://{src}", "-o", "json"]):
        done = subprocess.run(
            [sys.executable, "-m", "dsagent.cli", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "DSAGENT_DIGEST_CACHE": str(tmp_path / "d.sqlite")},
            timeout=120,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        digests.append(json.loads(done.stdout)["digest"])
    assert digests[0] == digests[1]
    assert pack(src, tmp_path / "store2", name="d").digest == digests[0]


def test_dsctl_digest_of_a_local_path_starts_without_click_zstd_or_multiprocessing(tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", {"a/1.jpg": b"x" * 3000, "b/2.jpg": b"y" * 10})
    outputs = {}
    for args in (
        ["digest", str(src), "--name", "d", "-o", "json", "--no-digest-cache"],
        ["digest", str(src), "--name=d", "--output=json"],
    ):
        code, modules = _loaded(args, tmp_path)
        assert code == 0, args
        assert not {m for m in modules if m.split(".")[0] in ("click", "zstandard", "multiprocessing", "fsspec")}, args
        assert ("sqlite3" in modules) == ("--no-digest-cache" not in args), args  # the cache's, only when used
    # the quick way and click's agree, line for line (click takes any form it does not parse)
    for way, args in (
        ("quick", ["digest", str(src), "--name", "d", "-o", "json"]),
        ("click", ["digest", str(src), "--name", "d", "-o", "json", "--source-options-file", str(tmp_path / "o.json")]),
    ):
        (tmp_path / "o.json").write_text("{}")
        done = subprocess.run(
            [sys.executable, "-m", "dsagent.cli", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "DSAGENT_DIGEST_CACHE": str(tmp_path / "d.sqlite")},
            timeout=120,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        outputs[way] = json.loads(done.stdout)
    assert outputs["quick"] == outputs["click"]
    code, modules = _loaded(["digest", str(tmp_path / "missing")], tmp_path)
    assert code == 3 and "click" not in modules  # a deliberate error: its exit code, on the quick way too


def test_dsctl_pack_and_unpack_of_local_paths_start_without_click_and_say_what_click_says(tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", {"a/1.jpg": b"x" * 3000, "b/2.jpg": b"y" * 10, "c/empty/.keep": b""})
    for args in (
        ["pack", str(src), "--name", "d", "--to", str(tmp_path / "store"), "--no-digest-cache", "--threads=2"],
        ["unpack", str(tmp_path / "store"), str(tmp_path / "out"), "--name=d", "--workers", "2"],
    ):
        code, modules = _loaded(args, tmp_path)
        assert code == 0, args
        assert not {m for m in modules if m.split(".")[0] in ("click", "fsspec", "pydantic")}, args
    assert (tmp_path / "out" / "a" / "1.jpg").read_bytes() == b"x" * 3000
    (tmp_path / "o.json").write_text("{}")
    outputs: dict[str, list[dict[str, object]]] = {}
    for way, more in (("quick", []), ("click", ["--store-options-file", str(tmp_path / "o.json")])):
        answers = []
        for args in (
            ["pack", str(src), "--name", "d", "--to", str(tmp_path / way), "-o", "json", *more],
            ["unpack", str(tmp_path / way), str(tmp_path / f"{way}-out"), "--name", "d", "-o", "json", *more],
        ):
            done = subprocess.run(
                [sys.executable, "-m", "dsagent.cli", *args], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "DSAGENT_DIGEST_CACHE": str(tmp_path / "d.sqlite")},
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            answer = json.loads(done.stdout)
            answer.pop("seconds")
            answer.pop("dest", None)
            answers.append(answer)
        outputs[way] = answers
    assert outputs["quick"] == outputs["click"]
    code, modules = _loaded(["unpack", str(tmp_path / "quick"), str(tmp_path / "x"), "--name", "nope"], tmp_path)
    assert code == 3 and "click" not in modules  # a deliberate error: its exit code, on the quick way too


def test_dsctl_digest_pack_and_unpack_of_local_paths_leave_rare_paths_modules_unloaded(tmp_path: Path) -> None:
    """Each of these cost dsctl's start-up a millisecond or more, and is imported by the path
    that needs it: tarfile by a pax header or the Python member loop, the thread pools (and
    logging with them) where a pool is started, shutil by a failed unpack's cleanup,
    pathlib (and urllib.parse) by the digest cache, signal by a forked hashing process,
    platform by python-zstandard (the pack's compressor, the unpack's decoder of a bundle's
    frames), so never by a digest; compression.zstd by a reader of frames (unpack); ctypes
    by none where the native extension is loaded (it makes mallopt and syncfs); uuid by
    none, dataclasses (and inspect, with ast and dis) by none: the format's records are
    named tuples."""
    src = write_tree(tmp_path / "src", {"a/1.jpg": b"x" * 3000, "b/2.jpg": b"y" * 10, "c/empty/.keep": b""})
    everywhere = {"uuid", "shutil", "signal", "bz2", "lzma", "dataclasses", "inspect", "pathlib", "urllib.parse"}
    native_only = {"tarfile"} if native.AVAILABLE else set()  # the Python member loop reads TarInfo headers
    frame_readers = {"backports.zstd", "compression.zstd"}  # a bundle's or manifest's reader: unpack only
    native_loaded = {"ctypes"} if native.LOADED else set()  # else glibc's mallopt and syncfs through ctypes
    pool_free = {"concurrent.futures", "logging"} if native.AVAILABLE else set()  # the Python hashing threads
    for args, unloaded in (
        (["digest", str(src), "--no-digest-cache"], {"tarfile", "platform", *frame_readers, *pool_free}),
        (["pack", str(src), "--name", "d", "--to", str(tmp_path / "store"), "--no-digest-cache"],
         {"tarfile", *frame_readers}),
        (["unpack", str(tmp_path / "store"), str(tmp_path / "out"), "--name", "d"],
         {"concurrent.futures", "logging", *native_only}),
    ):  # fmt: skip
        code, modules = _loaded(args, tmp_path, bare=True)
        assert code == 0, args
        assert not modules & (everywhere | native_loaded | unloaded), args
    assert (tmp_path / "out" / "a" / "1.jpg").read_bytes() == b"x" * 3000


def test_dsctl_cache_does_not_import_the_agent_app(tmp_path: Path) -> None:
    code, modules = _loaded(["cache", "--help"], tmp_path)
    assert code == 0
    assert not {m for m in modules if m.split(".")[0] in ("fastapi", "starlette", "pydantic_settings")}
    assert "dsagent.cache.service" not in modules and "dsagent.api.routes" not in modules


@pytest.mark.parametrize(
    ("location", "options", "expected"),
    [
        ("store", None, os.path.abspath("store")),
        ("/data/store/", None, "/data/store"),
        ("/data/./x/../store", None, "/data/store"),
        ("s3://bucket/store", None, None),  # a URL: fsspec
        ("s3:/bucket", None, None),  # a near-URL: resolve() refuses it
        ("file:///data/store", None, None),
        ("a::b", None, None),  # a chain
        ("~/store", None, None),  # fsspec expands ~
        ("/data/store", {"auto_mkdir": True}, None),  # options: fsspec
        ("", None, None),
        ("/data/\x00", None, None),
    ],
)
def test_only_plain_local_paths_bypass_fsspec(location: str, options: dict[str, object] | None, expected: str) -> None:
    assert local_path(location, options) == expected
