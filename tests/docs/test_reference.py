"""The reference pages written from the code (tools/docs/reference.py) list everything they
claim to: every command, setting, metric, error class and Helm value."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from dsagent.cli import COMMANDS
from tests.conftest import REPO_ROOT
from tools.docs import reference


@pytest.fixture(scope="module")
def cli_page() -> str:
    return reference.cli_page()


def test_every_dsctl_command_has_its_help_on_the_commands_page(cli_page: str) -> None:
    for name in COMMANDS:
        assert f"### `dsctl {name}`" in cli_page, f"dsctl {name} is missing"
    assert "Usage: dsctl cache [OPTIONS]" in cli_page
    assert "--bundles" in cli_page and "--allow-per-file" in cli_page


def test_dsagent_and_its_subcommands_are_on_the_commands_page(cli_page: str) -> None:
    assert "## `dsagent`" in cli_page
    assert "### `dsagent serve`" in cli_page
    assert "--local-source" in cli_page.split("### `dsagent serve`", 1)[1]


def test_the_settings_page_names_every_variable_every_process_reads() -> None:
    page = reference.settings_page()
    for _, target, _ in reference.SETTINGS:
        cls = reference._load(target)
        names = cls.env_names()
        assert names, target
        for name in names:
            assert f"| `{name}` |" in page, f"{name} ({target}) is not on the settings page"
    row = next(line for line in page.splitlines() if line.startswith("| `DSAGENT_LEASE_TTL` |"))
    assert "`21600`" in row, row  # the default, in seconds


def test_the_settings_page_takes_each_fields_comment_as_its_meaning() -> None:
    page = reference.settings_page()
    row = next(line for line in page.splitlines() if line.startswith("| `DSAGENT_PEER_MAX_UPLOADS` |"))
    assert "bundles served at once, all peers together" in row


def test_the_metrics_page_lists_every_metric_of_every_registry_with_its_labels() -> None:
    page = reference.metrics_page()
    for _, target, make in reference.REGISTRIES:
        rows = reference.metrics(target, make)
        assert len(rows) >= 3, target
        for name, kind, labels, _ in rows:
            line = next((ln for ln in page.splitlines() if ln.startswith(f"| `{name}` |")), None)
            assert line is not None, f"{name} is missing"
            assert f"| {kind} |" in line
            for label in labels:
                assert f"`{label}`" in line, f"{name}: label {label} is missing"
    assert "| `dsplatform_agent_dataset_requests_total` | counter | `code` |" in page
    assert "`method`, `route`, `status`" in page


def test_every_error_class_is_on_the_exit_codes_page_with_its_statuses() -> None:
    page = reference.exit_codes_page()
    classes = reference.error_classes()
    assert len(classes) > 30, "too few error classes found: the check would prove nothing"
    for cls in classes:
        row = f"| `{cls.code}` | {cls.http_status} | `{cls.grpc_status}` | `{cls.__module__}.{cls.__name__}` |"
        assert row in page, f"{cls.__name__} is missing: {row}"
    summary = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| [^|]* \| ([^|]*) \|", page, re.M)}
    for cls in classes:
        assert f"`{cls.code}`" in summary[cls.exit_code], f"exit {cls.exit_code} does not list {cls.code}"


def test_every_exit_code_has_a_meaning_and_no_meaning_is_stale() -> None:
    used = {cls.exit_code for cls in reference.error_classes()}
    assert set(reference.EXIT_MEANINGS) == used | {0, 130}


def test_an_exit_code_without_a_meaning_fails_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    meanings = dict(reference.EXIT_MEANINGS)
    del meanings[6]
    monkeypatch.setattr(reference, "EXIT_MEANINGS", meanings)
    with pytest.raises(ValueError, match=r"\[6\]"):
        reference.exit_codes_page()


def _leaves(values: Any, path: str = "") -> list[str]:
    if isinstance(values, dict) and values:
        return [leaf for key, value in values.items() for leaf in _leaves(value, f"{path}.{key}" if path else key)]
    return [path]


def test_the_helm_values_page_has_every_value_of_values_yaml_with_its_default() -> None:
    page = reference.helm_values_page()
    defaults = yaml.safe_load((REPO_ROOT / "charts/dsplatform/values.yaml").read_text())
    paths = {row[0] for row in reference.helm_values()}
    leaves = _leaves(defaults)
    assert len(leaves) > 100
    missing = [leaf for leaf in leaves if leaf not in paths and not any(leaf.startswith(p + ".") for p in paths)]
    assert missing == []
    row = next(line for line in page.splitlines() if line.startswith("| `agent.evictRatio` |"))
    assert "| number | `1.2` |" in row and "1.2" in row


def test_values_yaml_comments_become_descriptions() -> None:
    text = "a:\n  # what b is\n  # over two lines\n  b: 1\n\n  c: 2\n# -- top\nd: x\n"
    assert reference.values_comments(text) == {"a.b": "what b is over two lines", "d": "top"}


def test_table_cells_escape_pipes_and_html_outside_code_only() -> None:
    assert reference._cell("a | b <root> `<x>`") == "a \\| b &lt;root&gt; `<x>`"


def test_the_committed_reference_pages_are_what_the_code_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pages are committed, so that their links work where people read them (in the
    repository as in the site); a change to the code they describe needs them written again."""
    monkeypatch.undo()  # the defaults as shipped, not the suite's allowances (tests/conftest.py)
    stale = [path for path, write in reference.PAGES.items() if (REPO_ROOT / "docs" / path).read_text() != write()]
    assert stale == [], f"stale: {stale}; run python tools/docs/reference.py"
