"""The README's "Exit codes" table matches the error classes of every package."""

from __future__ import annotations

import importlib
import pkgutil
import re

from tests.conftest import REPO_ROOT

PACKAGES = ("dsagent", "gpu_topology", "scheduler_plugin", "scheduling", "dsplatform")


def all_modules() -> list[str]:
    """Every module of the packages (error classes live beside their code), no ``__main__``."""
    names = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if not info.name.endswith("__main__"):
                names.append(info.name)
    return names


ROOTS = ("dsplatform.errors:PlatformError",)  # every package's tree derives from it (tests/test_errors.py)


def error_classes() -> set[type]:
    for module in all_modules():
        try:
            importlib.import_module(module)
        except ImportError:  # an optional dependency (e.g. NVML) is missing: its errors are elsewhere
            continue
    found: set[type] = set()
    todo = [getattr(importlib.import_module(m), c) for m, c in (r.split(":") for r in ROOTS)]
    while todo:
        cls = todo.pop()
        if cls not in found and cls.__module__.split(".")[0] in {
            "dsagent",
            "gpu_topology",
            "scheduler_plugin",
            "scheduling",
            "dsplatform",
        }:
            found.add(cls)
            todo.extend(cls.__subclasses__())
    return found


def readme_table() -> dict[int, tuple[str, set[str]]]:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows: dict[int, tuple[str, set[str]]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].isdigit():
            rows[int(cells[0])] = (cells[1], set(re.findall(r"`([a-z_]+)`", cells[2])))
    return rows


def test_every_error_class_is_in_the_exit_code_table_with_its_status() -> None:
    table = readme_table()
    for cls in error_classes():
        assert cls.exit_code in table, f"{cls.__module__}.{cls.__name__}: exit {cls.exit_code} is not documented"
        statuses, codes = table[cls.exit_code]
        assert cls.code in codes, f"{cls.__name__}: code {cls.code!r} is not listed under exit {cls.exit_code}"
        assert str(cls.http_status) in statuses or f"`{cls.code}` ({cls.http_status})" in readme_row(cls.exit_code), (
            f"{cls.__name__}: HTTP {cls.http_status} is not given for code {cls.code!r}"
        )


def readme_row(exit_code: int) -> str:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8").split("## Exit codes", 1)[1]
    return next(line for line in text.splitlines() if line.startswith(f"| {exit_code} |"))


def test_the_table_lists_no_code_that_nothing_raises() -> None:
    used = {(cls.exit_code, cls.code) for cls in error_classes()}
    for exit_code, (_, codes) in readme_table().items():
        for code in codes:
            assert (exit_code, code) in used, f"exit {exit_code} lists {code!r}, which no error class has"
    assert set(readme_table()) == {cls.exit_code for cls in error_classes()} | {0, 130}
