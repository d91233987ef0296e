"""The distribution builds the native loops: an sdist that carries their sources, and from it
a binary wheel that auditwheel repairs to a manylinux tag (``make wheel``: tools/ci/wheel.sh).

The wheel's extension is loaded from the wheel itself and hashes as the ``xxhash`` package
does: XXH3 compiled in from the vendored header, nothing looked up at run time.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from array import array
from pathlib import Path

import pytest
import xxhash

from dsagent.format import native

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow  # builds an sdist and a wheel: about 10 s


def test_the_sdist_carries_the_native_sources_and_its_wheel_the_extension(tmp_path: Path) -> None:
    if not native.LOADED:
        pytest.skip(f"no native extension here ({native.OFF_REASON}): no compiler to build a wheel's")
    subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "sdist")],
        cwd=REPO, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    (sdist,) = (tmp_path / "sdist").glob("dsplatform-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    sources = {str(p.relative_to(REPO)) for p in (REPO / "native").rglob("*") if p.is_file()}
    sources = {s for s in sources if "__pycache__" not in s}
    assert sources <= names, sources - names
    assert {"setup.py", "native/vendor/xxhash/LICENSE", "native/vendor/xxhash/xxhash.h"} <= names

    built = subprocess.run(
        ["bash", str(REPO / "tools" / "ci" / "wheel.sh"), str(tmp_path / "dist"), str(sdist)],
        env={**os.environ, "PY": sys.executable}, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert re.fullmatch(r"dsplatform-0\.1\.0-cp\d+-cp\d+-manylinux_\d+_\d+_(x86_64|aarch64)\.whl", wheel.name)
    assert built.stdout.strip() == f"wheel: {tmp_path / 'dist' / wheel.name}"
    with zipfile.ZipFile(wheel) as archive:
        (member,) = [n for n in archive.namelist() if re.fullmatch(r"dsagent/format/_native\..*\.so", n)]
        archive.extract(member, tmp_path / "unzipped")
    spec = importlib.util.spec_from_file_location("dsagent.format._native", tmp_path / "unzipped" / member)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.INTERFACE == native.INTERFACE
    data = os.urandom(100_000)
    (tmp_path / "f").write_bytes(data)
    sizes, _, digests, failure = module.hash_tree([("", str(tmp_path), ["f"])], 4096, 2, True)
    assert failure is None and list(array("q", sizes)) == [len(data)]
    assert digests.hex() == xxhash.xxh3_128_hexdigest(data)
