"""Build the optional native extension ``dsagent.format._native`` (``make native``).

Compiles ``native/dsnative.c`` with the C compiler Python was built with (``$CC``
overrides it) against this interpreter's headers, into ``dsagent/format/`` beside the
modules that import it. Nothing else builds it: ``pip install`` never needs a compiler,
and without the extension the pure-Python loops run (:mod:`dsagent.format.native`).

    python native/build.py               # into dsagent/format/
    python native/build.py --out DIR     # elsewhere (the tests build a private copy)
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "dsnative.c"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / "dsagent" / "format"


def compiler() -> list[str] | None:
    """The C compiler command: ``$CC`` when set (RuntimeError naming it when it is not
    installed: a compiler asked for is never silently replaced), else Python's own, else
    ``cc``; None if there is none."""
    asked = os.environ.get("CC")
    if asked:
        command = shlex.split(asked)
        if not command or shutil.which(command[0]) is None:
            raise RuntimeError(f"CC={asked} is not installed (or not on PATH): install it, or unset CC")
        return command
    command = shlex.split(sysconfig.get_config_var("CC") or "cc")
    if not command or shutil.which(command[0]) is None:
        command = ["cc"]
    return command if shutil.which(command[0]) else None


def headers() -> Path | None:
    include = Path(sysconfig.get_paths()["include"])
    return include if (include / "Python.h").is_file() else None


def build(out: Path) -> Path:
    """Compile the extension into ``out``; returns its path. Raises RuntimeError when it cannot."""
    cc = compiler()
    include = headers()
    if cc is None or include is None:
        raise RuntimeError("no C compiler or no Python headers (python3-dev): the pure-Python paths stay in use")
    target = out / f"_native{sysconfig.get_config_var('EXT_SUFFIX')}"
    out.mkdir(parents=True, exist_ok=True)
    staged = target.with_suffix(".tmp")
    command = [*cc, "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", f"-I{include}", str(SOURCE), "-o", str(staged)]
    command.append("-ldl")
    subprocess.run(command, check=True)
    os.replace(staged, target)  # an importer never sees half a library
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=PACKAGE_DIR, help="where the extension goes")
    args = parser.parse_args(argv)
    try:
        target = build(args.out)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"native: {exc}", file=sys.stderr)
        return 1
    print(f"native: built {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
