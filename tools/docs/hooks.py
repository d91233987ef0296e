"""The mkdocs hook (``mkdocs.yml``, ``hooks:``) that adds the generated reference pages.

Each page of :data:`tools.docs.reference.PAGES` is written from the code while mkdocs collects
the files, so ``mkdocs build`` and ``mkdocs serve`` always show the code as it is.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the hook is loaded by path; the reference module imports the packages
    sys.path.insert(0, str(REPO))

from mkdocs.structure.files import File, Files  # noqa: E402

from tools.docs.reference import PAGES  # noqa: E402

# the simulator's plots, written by tools/sim into tools/sim/out, shown by docs/simulation.md
SIM_OUT = REPO / "tools" / "sim" / "out"


def on_files(files: Files, config: Any) -> Files:
    for path, write in PAGES.items():
        files.append(File.generated(config, path, content=write()))
    for image in sorted(SIM_OUT.rglob("*.png")):
        rel = image.relative_to(SIM_OUT).as_posix()
        files.append(File.generated(config, f"assets/sim/{rel}", abs_src_path=str(image)))
    return files
