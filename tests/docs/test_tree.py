"""docs/tree.md is written from the tree (tools/docs/tree.py): it names every folder and
module of the platform's packages, each with its docstring's first sentence, and cannot drift."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import REPO_ROOT
from tools.docs import tree


def test_the_committed_page_is_what_the_tree_writes() -> None:
    committed = (REPO_ROOT / "docs" / "tree.md").read_text(encoding="utf-8")
    assert committed == tree.render(), "docs/tree.md is stale: run python tools/docs/tree.py"


def test_every_module_and_folder_of_the_packages_has_its_line() -> None:
    page = tree.render()
    modules = [
        path
        for package in tree.PACKAGES
        for path in (REPO_ROOT / package).rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py") and "proto" not in path.parts
    ]
    assert len(modules) > 200, "the packages were not found: the check would prove nothing"
    listed = {line.split()[0] for line in page.splitlines() if line.strip() and not line.startswith(" " * tree.COLUMN)}
    assert sorted({p.name for p in modules} - listed) == []
    folders = {p.parent.name + "/" for p in modules}
    assert sorted(folders - listed) == []


def test_a_first_sentence_drops_the_markup_and_stops_at_its_period(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""What :mod:`dsagent.cache` holds, in ``bytes``. More text.\n\nDetail."""\n')
    assert tree.first_sentence(module) == "What dsagent.cache holds, in bytes"
    module.write_text("x = 1\n")
    assert tree.first_sentence(module) == ""
