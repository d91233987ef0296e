"""The optional C extension ``dsagent.format._native`` (docs/design-native.md#building).

Everything else about the distribution is in pyproject.toml; setuptools cannot declare a C
extension there, so it is declared here, and built by the package's own build: ``pip
install .`` or ``-e .``, a wheel, an sdist's build, ``make native`` (``build_ext --inplace``).

It is optional: where it cannot be built (no C compiler, no Python headers) the install says
so in one warning and goes on, and the pure-Python loops run. ``DSPLATFORM_BUILD_NATIVE``
picks: ``auto`` (the default: build it if possible), ``require`` (a build that cannot make it
fails, with one line saying why: ``make native``, the container image), ``0`` (do not build
it). A compiler asked for by ``CC`` that is not installed is never replaced by another;
``CFLAGS`` and ``LDFLAGS`` are added to the compiler's (CI builds it with the sanitizers).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
MODES = ("auto", "require", "0")


def _mode() -> str:
    mode = os.environ.get("DSPLATFORM_BUILD_NATIVE", "auto").strip().lower() or "auto"
    if mode not in MODES:
        sys.exit(f"native: DSPLATFORM_BUILD_NATIVE={mode!r} is not one of {', '.join(MODES)}")
    return mode


class BuildNative(build_ext):
    """``build_ext`` that checks for the compiler first: missing, the build fails with one
    line when the extension is required, else warns once and leaves the pure loops."""

    def build_extensions(self) -> None:
        problem = self._missing_toolchain()
        if problem is not None:
            if _mode() == "require":
                sys.exit(f"native: {problem}")
            print(f"native: {problem}: the pure-Python loops will run", file=sys.stderr)
            return
        super().build_extensions()

    def _missing_toolchain(self) -> str | None:
        command = list(getattr(self.compiler, "compiler_so", None) or [])
        if command and shutil.which(command[0]) is None:
            asked = os.environ.get("CC")
            if asked:
                return f"CC={asked} is not installed (or not on PATH): install it, or unset CC"
            return f"no C compiler ({command[0]} is not installed)"
        include = sysconfig.get_paths().get("include")
        if self.compiler.compiler_type == "unix" and not (include and (Path(include) / "Python.h").is_file()):
            return f"no Python headers ({include}/Python.h; install python3-dev)"
        return None

    def build_extension(self, ext: Extension) -> None:
        if _mode() == "require":
            ext.optional = False  # a failed compile fails the build
        super().build_extension(ext)


def _extensions() -> list[Extension]:
    if _mode() == "0":
        return []
    return [
        Extension(
            "dsagent.format._native",
            sources=["native/dsnative.c"],  # it includes the other native/*.c: one translation unit
            depends=sorted(str(p.relative_to(HERE)) for p in (HERE / "native").rglob("*.[ch]")),
            include_dirs=["native/vendor/xxhash"],
            extra_compile_args=["-O2", "-fvisibility=hidden", "-Wall", "-Wextra"],
            optional=True,
        )
    ]


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildNative})
