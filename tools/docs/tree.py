"""docs/tree.md, written from the tree itself: a line per folder and module of the platform's
packages, each the first sentence of its docstring.

Run ``python tools/docs/tree.py`` after adding, moving or renaming a module, or after changing
the first sentence of its docstring; ``tests/docs/test_tree.py`` fails while the committed page
differs from what this writes, so the page cannot drift from the code. ``--check`` exits 1 with
the first differing line instead of writing.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "docs" / "tree.md"
#: the platform's packages, from the shared ones up to the processes
PACKAGES = ("dsplatform", "gpu_topology", "scheduling", "scheduler_plugin", "dsagent")
#: folders whose modules are generated (their folder gets its line, its files none)
GENERATED = ("dsagent/nodeplugins/proto",)
#: the column descriptions start at, and the width they wrap at
COLUMN = 34
WIDTH = 120

HEADER = """# The tree

The tree is the architecture: one folder per process, one per layer, and the shared packages
below them. The layers and the rules between them are drawn in
[design: the layers](design.md#layers); import-linter enforces them (`make lint-imports`, the
contracts in `pyproject.toml`).

This page is written from the code by `python tools/docs/tree.py`: each line is the first
sentence of that folder's or module's docstring (`tests/docs/test_tree.py` fails when the
page and the code differ).

```
"""

OTHERS = """charts/dsplatform/                the Helm chart
docs/                             this site: design.md (the design rules, with anchors, and the layers), threat-model.md
native/                           the optional C extension dsagent.format._native, built by setup.py (pip install,
                                  make native) with XXH3 from vendor/xxhash/; design-native.md
tests/                            mirrors the packages (tests/dsagent/webhook/test_webhook.py, ...), charts/ for
                                  the chart; fixtures/ with provenance; the fake kubelet
tools/                            bench/ (benchmarks, each with --smoke), sim/ (the cluster simulator), faults/,
                                  mistakes/, grafana/, docs/ (this page and the reference pages), proto/ (the
                                  gRPC stubs), support/ (what tests and tools share: the fake API server, a
                                  local S3 server, agent processes, fault injection)
```
"""

FOOTER = """
Why this shape:

- **One folder per process.** The node agent (`dsagent/nodeagent/`, composing `api`,
  `nodeplugins` and `cache`), the Dataset controller (`dsagent/controller/`), the admission
  webhook (`dsagent/webhook/`) and the extender (`scheduler_plugin/`) each import no other
  process's code; what two of them share is a package below them: the Kubernetes plumbing
  (`dsagent/kube/`), the cluster-wide rules (`dsagent/policy/`), `scheduling` or `dsplatform`.
- **Wire contracts are written once**: the writer and every reader import the same module in
  `dsplatform/wire/`, which carries the contract's version.
- **Names say what they are**: no two modules of `dsagent` share a file name and every
  `tests/<package>/` folder names a real package (`tests/test_repo.py` keeps both so).
- **`format/` has no service code**, so `dsctl pack` on a laptop imports no web stack.
"""


def first_sentence(path: Path) -> str:
    """The first sentence of the module's docstring, on one line ('' when it has none)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    match = re.search(r"(?<=[.!?])\s", text)
    sentence = text[: match.start()] if match else text
    sentence = re.sub(r":\w+:`~?([^`]+)`", r"\1", sentence)  # :mod:`x` -> x
    return sentence.replace("``", "").rstrip(".")


def _line(depth: int, name: str, text: str) -> str:
    label = "  " * depth + name
    if not text:
        return label
    wrapped = textwrap.wrap(text, WIDTH - COLUMN, break_on_hyphens=False, break_long_words=False) or [""]
    first = label.ljust(COLUMN) + wrapped[0] if len(label) < COLUMN - 1 else label + "  " + wrapped[0]
    return "\n".join([first, *(" " * COLUMN + rest for rest in wrapped[1:])])


def _folder(folder: Path, depth: int, lines: list[str]) -> None:
    relative = folder.relative_to(REPO).as_posix()
    init = folder / "__init__.py"
    lines.append(_line(depth, folder.name + "/", first_sentence(init) if init.is_file() else ""))
    if relative in GENERATED:
        return
    for path in sorted(folder.glob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            lines.append(_line(depth + 1, path.name, first_sentence(path)))
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").is_file()):
        _folder(sub, depth + 1, lines)


def render() -> str:
    lines: list[str] = []
    for package in PACKAGES:
        _folder(REPO / package, 0, lines)
    return HEADER + "\n".join(lines) + "\n" + OTHERS + FOOTER


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/tree.md differs; write nothing")
    args = parser.parse_args(argv)
    text = render()
    if not args.check:
        OUT.write_text(text, encoding="utf-8")
        return 0
    current = OUT.read_text(encoding="utf-8") if OUT.is_file() else ""
    if current == text:
        return 0
    for number, (have, want) in enumerate(zip(current.splitlines(), text.splitlines(), strict=False), 1):
        if have != want:
            print(f"docs/tree.md:{number}: {have!r} should be {want!r} (python tools/docs/tree.py)", file=sys.stderr)
            break
    else:
        print("docs/tree.md differs in length (python tools/docs/tree.py)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
