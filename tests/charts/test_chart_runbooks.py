"""Every alert of the chart's PrometheusRule links its runbook, a page of the documentation
site, through ``docs.baseURL``; every runbook page belongs to an alert."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.charts.test_chart import PRODUCTION, find, render
from tests.conftest import REPO_ROOT

RUNBOOKS = REPO_ROOT / "docs" / "operator-guide" / "runbooks"


def alerts(values: dict[str, Any]) -> list[dict[str, Any]]:
    rule = find(render(values), "PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r]


def page_of(url: str, base: str) -> str:
    assert url.startswith(base + "operator-guide/runbooks/") and url.endswith("/"), url
    return url.removeprefix(base + "operator-guide/runbooks/").rstrip("/")


def test_every_alert_links_the_runbook_page_that_explains_it() -> None:
    base = yaml.safe_load((REPO_ROOT / "charts/dsplatform/values.yaml").read_text())["docs"]["baseURL"]
    found = alerts(PRODUCTION)
    assert len(found) >= 9
    for alert in found:
        slug = page_of(alert["annotations"]["runbook_url"], base)
        page = RUNBOOKS / f"{slug}.md"
        assert page.is_file(), f"{alert['alert']}: no runbook page {page.relative_to(REPO_ROOT)}"
        assert page.read_text().startswith(f"# {alert['alert']}\n"), (
            f"{page.name} is not the runbook of {alert['alert']}"
        )


def test_the_runbook_index_lists_every_alert_and_no_page_is_orphaned() -> None:
    names = {alert["alert"] for alert in alerts(PRODUCTION)}
    index = (RUNBOOKS / "index.md").read_text()
    for name in names:
        assert f"[{name}](" in index, f"the runbook index does not list {name}"
    titles = {p.read_text().split("\n", 1)[0].removeprefix("# ") for p in RUNBOOKS.glob("*.md") if p.name != "index.md"}
    assert titles == names


def test_the_default_base_url_is_the_documentation_sites_own() -> None:
    site_url = re.search(r"^site_url:\s*(\S+)", (REPO_ROOT / "mkdocs.yml").read_text(), re.M)
    assert site_url is not None
    base = yaml.safe_load((REPO_ROOT / "charts/dsplatform/values.yaml").read_text())["docs"]["baseURL"]
    assert base == site_url.group(1)


def test_a_docs_base_url_of_ones_own_moves_every_runbook_link() -> None:
    values = {**PRODUCTION, "docs": {"baseURL": "https://docs.internal.example/dsplatform/"}}
    for alert in alerts(values):
        assert alert["annotations"]["runbook_url"].startswith(
            "https://docs.internal.example/dsplatform/operator-guide/runbooks/"
        )


@pytest.mark.parametrize("base", ["https://docs.example/dsplatform", "not a url/"])
def test_a_base_url_without_its_trailing_slash_or_scheme_is_refused(base: str) -> None:
    with pytest.raises(Exception, match="baseURL"):
        render({**PRODUCTION, "docs": {"baseURL": base}})
