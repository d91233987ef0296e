"""The README is a front door and the documentation site builds with every page in it.

``make docs`` (part of ``make test``) builds the whole site with ``--strict``: every internal
link and anchor is checked there. These tests check what that build does not: the README's
size, commands and links, that a new page under docs/ joins the navigation without an edit of
mkdocs.yml, and, where Chromium is installed, that a built page renders to something visible.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

README = REPO_ROOT / "README.md"
CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "") if p and Path(p).is_file()), None)


def test_the_readme_is_a_front_door_of_at_most_300_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, len(lines)


def test_the_readme_shows_the_two_set_up_commands_as_the_makefile_has_them() -> None:
    text = README.read_text(encoding="utf-8")
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, re.M)
        assert re.search(rf"^make {target} +# ", text, re.M), f"make {target} is not in the README"
    assert re.search(r"^s3-local:", makefile, re.M) and "make s3-local" in text


def test_every_relative_link_of_the_readme_reaches_a_file() -> None:
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert len(local) >= 10
    assert [link for link in local if not (REPO_ROOT / link).exists()] == []


def test_no_page_carries_work_markers() -> None:
    pages = [README, *sorted((REPO_ROOT / "docs").rglob("*.md"))]
    marked = [str(p.relative_to(REPO_ROOT)) for p in pages if re.search(r"<!--\s*/?issue", p.read_text())]
    assert marked == []


def _build(config: Path, site: Path, *, strict: bool) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mkdocs", "build", "-q", "-f", str(config), "-d", str(site)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [*command, *(["--strict"] if strict else [])], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.slow  # builds the site with mkdocs in a subprocess
def test_a_new_page_under_docs_joins_the_navigation_without_editing_mkdocs_yml(tmp_path: Path) -> None:
    """The site's own navigation files, on a copy of docs/ with pages the nav does not name."""
    docs = tmp_path / "docs"
    shutil.copytree(REPO_ROOT / "docs", docs)
    (docs / "results-newbench.md").write_text("# New bench results\n")
    (docs / "design-newtopic.md").write_text("# New topic design\n")
    (docs / "tenancy-like.md").write_text("# A topic page\n")
    (docs / "user-guide" / "new-guide.md").write_text("# A new guide\n")
    config = (REPO_ROOT / "mkdocs.yml").read_text()
    config = re.sub(r"(?ms)^hooks:.*?\n\n", "", config)  # no reference pages: only the nav matters here
    (tmp_path / "mkdocs.yml").write_text(config)
    result = _build(tmp_path / "mkdocs.yml", tmp_path / "site", strict=False)
    assert result.returncode == 0, result.stderr
    home = (tmp_path / "site" / "index.html").read_text()
    nav = re.findall(r'href="([^"#]+)"', home)
    for page in ("results-newbench/", "design-newtopic/", "tenancy-like/", "user-guide/new-guide/"):
        assert page in nav, f"{page} is not in the navigation"
    assert nav.index("design/") < nav.index("design-newtopic/") < nav.index("threat-model/")
    assert nav.index("performance/") < nav.index("results-newbench/")


@pytest.mark.slow  # builds the site and runs Chromium
# skipped on a developer's machine without Chromium; never in CI, which installs it (.ci/run)
@pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="Chromium is not installed (/usr/bin/chromium): apt-get install chromium",
)
def test_a_built_page_renders_in_headless_chromium_to_a_visible_page(tmp_path: Path) -> None:
    from PIL import Image, ImageStat

    site = tmp_path / "site"
    result = _build(REPO_ROOT / "mkdocs.yml", site, strict=True)
    assert result.returncode == 0, result.stderr
    shot = tmp_path / "page.png"
    page = site / "operator-guide" / "runbooks" / "agent-down" / "index.html"
    assert CHROMIUM is not None
    subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1280,900",
            page.as_uri(),
        ],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    image = Image.open(shot).convert("L")
    assert image.size == (1280, 900)
    stat = ImageStat.Stat(image)
    assert stat.stddev[0] > 20, f"the page looks blank: pixel stddev {stat.stddev[0]:.1f}"
    dark = sum(image.histogram()[:128]) / (1280 * 900)
    assert 0.005 < dark < 0.6, f"text and header should cover part of the page, not none or all: {dark:.3f}"


def test_every_relative_link_of_every_page_reaches_a_file_in_the_repository() -> None:
    """Most people first read the docs in the repository: no link there may point at a file
    that exists only in the built site."""
    pages = [README, *sorted((REPO_ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            target = link.split("#")[0]
            if target and not re.match(r"^[a-z]+:", target) and not target.startswith("/"):
                if not (page.parent / target).exists():
                    broken.append(f"{page.relative_to(REPO_ROOT)} -> {link}")
    assert len(pages) > 20
    assert broken == []
