"""The repository stands on its own: what it cites exists inside it, and nothing reads outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DESIGN = REPO / "docs" / "design.md"


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / line for line in out.splitlines() if (REPO / line).is_file()]


def _anchors() -> set[str]:
    text = DESIGN.read_text(encoding="utf-8")
    explicit = set(re.findall(r'<a id="([^"]+)"', text))
    headings = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, re.M)
    }
    return explicit | headings


def test_every_design_anchor_the_code_cites_exists() -> None:
    anchors = _anchors()
    cited: dict[str, list[str]] = {}
    for path in _tracked("*.py", "*.yaml", "*.md", "*.tpl", "*.json"):
        for anchor in re.findall(r"design\.md#([a-z0-9-]+)", path.read_text(encoding="utf-8", errors="replace")):
            cited.setdefault(anchor, []).append(str(path.relative_to(REPO)))
    assert cited, "nothing cites docs/design.md: the check would prove nothing"
    missing = {anchor: where for anchor, where in cited.items() if anchor not in anchors}
    assert not missing, f"cited anchors missing from docs/design.md: {missing}"


def test_nothing_in_the_repo_reads_outside_it() -> None:
    offenders = []
    for path in _tracked("*.py", "Makefile", "*.toml", ".ci/*", "*.sh"):
        text = path.read_text(encoding="utf-8", errors="replace")
        if re.search(r"\.\./shared|parent\s*/\s*\"shared\"|parent / 'shared'", text) and path.name != "test_repo.py":
            offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


def test_every_fixture_has_its_provenance() -> None:
    data = [p for p in (REPO / "tests" / "fixtures").rglob("*") if p.is_file() and p.suffix not in (".src", ".md")]
    assert data, "no fixtures found"
    assert [str(p) for p in data if not p.with_suffix(".src").exists()] == []


def _modules(package: str) -> list[Path]:
    return [p for p in _tracked(f"{package}/*.py") if "proto" not in p.relative_to(REPO).parts]


def test_no_two_dsagent_modules_share_a_file_name() -> None:
    """A name says one thing: ``kube/peers.py`` beside ``cache/peers.py`` cost readers wrong turns."""
    seen: dict[str, list[str]] = {}
    for path in _modules("dsagent"):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert len(seen) > 50, "too few modules found: the check would prove nothing"
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}


def test_tests_mirror_the_package_tree() -> None:
    """Every test folder under tests/<package>/ names a package folder that exists."""
    packages = ("dsagent", "dsplatform", "gpu_topology", "scheduler_plugin", "scheduling")
    folders = {p.parent for p in _tracked("tests/*.py")}
    mirrored = [f.relative_to(REPO / "tests") for f in folders if f != REPO / "tests"]
    checked = [m for m in mirrored if m.parts[0] in packages]
    assert len(checked) >= 8, checked
    assert [str(m) for m in checked if not (REPO / m / "__init__.py").is_file()] == []


def test_no_text_cites_the_history_of_its_own_making() -> None:
    """A reader cannot open the project's tracker: code, docs and tests say the reason itself."""
    cited = []
    for path in _tracked("*.py", "*.md", "*.yaml", "*.tpl", "*.toml", "Makefile"):
        if path.name == "CHANGELOG.md":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if re.search(r"\bissues? #?[0-9]+\b|\bthe issue's\b", line, re.I):
                cited.append(f"{path.relative_to(REPO)}:{number}")
    assert cited == []
