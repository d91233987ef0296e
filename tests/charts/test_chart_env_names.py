"""Unknown ``DSAGENT_*`` / ``DSEXT_*`` variables are refused at start-up, so every
name the chart gives a process must be one some part of the platform reads, or that process
would refuse to start in the cluster. Nothing is rendered: every name written in the
templates is collected."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dsagent.controller import controllersettings
from dsagent.kube.envnames import known_names, known_prefixes
from dsagent.nodeagent import nodeparts
from dsagent.webhook import server
from scheduler_plugin.settings import Settings as ExtenderSettings

pytestmark = pytest.mark.slow

TEMPLATES = Path(__file__).resolve().parents[2] / "charts" / "dsplatform" / "templates"


#: the template of each DSAGENT_* process and the settings classes that process reads
PROCESSES = {
    "agent-daemonset.yaml": nodeparts.SETTINGS,
    "controller.yaml": controllersettings.SETTINGS,
    "webhook.yaml": server.SETTINGS,
}


def _names(prefix: str, paths: list[Path] | None = None) -> set[str]:
    found: set[str] = set()
    for path in paths if paths is not None else [*TEMPLATES.glob("*.yaml"), *TEMPLATES.glob("*.tpl")]:
        found |= set(re.findall(rf"\b{prefix}[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))
    return found


@pytest.mark.parametrize("template", sorted(PROCESSES))
def test_every_dsagent_variable_the_chart_gives_a_process_is_one_it_reads(template: str) -> None:
    names = _names("DSAGENT_", [TEMPLATES / template])
    assert len(names) > 10, "the template's variables were not found: the check would prove nothing"
    known = known_names(PROCESSES[template])
    assert sorted(n for n in names if n not in known and not n.startswith(known_prefixes())) == []


def test_only_the_processes_templates_name_dsagent_variables() -> None:
    named = {p.name for p in [*TEMPLATES.glob("*.yaml"), *TEMPLATES.glob("*.tpl")] if _names("DSAGENT_", [p])}
    assert named == set(PROCESSES)


def test_every_dsext_variable_the_chart_sets_is_known() -> None:
    names = _names("DSEXT_")
    assert len(names) > 5, "the chart's variables were not found: the check would prove nothing"
    assert sorted(names - ExtenderSettings.env_names()) == []
