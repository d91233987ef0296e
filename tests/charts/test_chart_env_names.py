"""Unknown ``DSAGENT_*`` / ``DSEXT_*`` variables are refused at start-up, so every
name the chart gives a process must be one some part of the platform reads, or that process
would refuse to start in the cluster. Nothing is rendered: every name written in the
templates is collected."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dsagent.cluster.envnames import known_names, known_prefixes
from scheduler_plugin.settings import Settings as ExtenderSettings

pytestmark = pytest.mark.slow

TEMPLATES = Path(__file__).resolve().parents[2] / "charts" / "dsplatform" / "templates"


def _names(prefix: str) -> set[str]:
    found: set[str] = set()
    for path in [*TEMPLATES.glob("*.yaml"), *TEMPLATES.glob("*.tpl")]:
        found |= set(re.findall(rf"\b{prefix}[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))
    return found


def test_every_dsagent_variable_the_chart_sets_is_known() -> None:
    names = _names("DSAGENT_")
    assert len(names) > 40, "the chart's variables were not found: the check would prove nothing"
    unknown = sorted(n for n in names if n not in known_names() and not n.startswith(known_prefixes()))
    assert unknown == []


def test_every_dsext_variable_the_chart_sets_is_known() -> None:
    names = _names("DSEXT_")
    assert len(names) > 5, "the chart's variables were not found: the check would prove nothing"
    assert sorted(names - ExtenderSettings.env_names()) == []
