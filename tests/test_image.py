"""The Dockerfile builds what the tests test: every package of the distribution is copied in,
the install is constrained by the lock, and uv is the Makefile's version. (No Docker engine runs
here, so the file is read, not built.)"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = (REPO / "Dockerfile").read_text(encoding="utf-8")


def packages() -> set[str]:
    """The top-level packages setuptools puts into the distribution (pyproject's find.include)."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    include = re.search(r"\[tool\.setuptools\.packages\.find\]\ninclude = \[([^\]]*)\]", text)
    assert include, "pyproject.toml lists no packages to find"
    return {name.strip().strip('"').rstrip("*") for name in include.group(1).split(",")}


def test_the_image_copies_every_package_of_the_distribution() -> None:
    copied = set(re.findall(r"^COPY (\w+) \./\1$", DOCKERFILE, re.M))
    assert packages() == {"dsplatform", "dsagent", "scheduler_plugin", "scheduling", "gpu_topology"}
    assert packages() <= copied


def test_the_image_installs_the_locked_versions_with_the_makefiles_uv() -> None:
    assert "--constraint requirements-test.txt" in DOCKERFILE
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    pinned = re.search(r"^UV_VERSION\s*:=\s*(\S+)", makefile, re.M)
    image = re.search(r"^ARG UV_VERSION=(\S+)", DOCKERFILE, re.M)
    assert pinned and image and pinned.group(1) == image.group(1)


def test_the_dockerignore_lets_the_lock_in() -> None:
    ignored = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert "requirements-test.txt" not in ignored and "*.txt" not in ignored


def test_the_image_builds_the_native_loops_into_the_installed_package_and_checks_they_load() -> None:
    build_stage = DOCKERFILE.split("\nFROM ", 2)[1]  # the first FROM opens the build stage
    assert "COPY native ./native" in build_stage and "ARG NATIVE=1" in build_stage
    assert "COPY pyproject.toml setup.py MANIFEST.in" in build_stage
    # the package's own build compiles them, required (a failed compile fails the image)
    assert build_stage.index("COPY native ./native") < build_stage.index("uv pip install --python")
    assert 'DSPLATFORM_BUILD_NATIVE="${build_native}" uv pip install' in build_stage
    assert "build_native=require" in build_stage
    # -I: not the source tree in the working directory, the installed package
    assert build_stage.count("/opt/dsplatform/bin/python -I -c") == 1
    assert "assert native.AVAILABLE" in build_stage
    assert re.search(r"apt-get install[^\n]* gcc", build_stage)
    runtime = DOCKERFILE.rsplit("\nFROM ", 1)[1]
    assert "gcc" not in runtime and "COPY --from=build /opt/dsplatform /opt/dsplatform" in runtime
    ignored = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert "native" not in ignored and "dsagent/format/_native*.so" in ignored
