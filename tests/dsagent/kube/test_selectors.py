"""Label selectors read as the API server reads them (dsagent/kube/selectors.py)."""

from __future__ import annotations

import pytest

from dsagent.kube.selectors import label_matcher

LABELS = {"app.kubernetes.io/component": "agent", "tier": "gpu", "empty": ""}


@pytest.mark.parametrize(
    ("selector", "selected"),
    [
        ("", True),
        ("app.kubernetes.io/component=agent", True),
        ("app.kubernetes.io/component==agent", True),
        (" app.kubernetes.io/component = agent , tier=gpu ", True),
        ("app.kubernetes.io/component=agent,tier=cpu", False),
        ("tier!=cpu", True),
        ("missing!=x", True),  # != selects an object without the label too
        ("tier!=gpu", False),
        ("tier", True),
        ("missing", False),
        ("!missing", True),
        ("! tier", False),
        ("tier in (cpu, gpu)", True),
        ("tier in (cpu)", False),
        ("tier notin (cpu,tpu)", True),
        ("missing notin (x)", True),  # notin selects an object without the label too
        ("missing in (x)", False),
        ("empty=", True),
        ("missing=", False),
        ("tier in (gpu),app.kubernetes.io/component notin (controller),!canary", True),
    ],
)
def test_a_selector_selects_as_the_api_server_does(selector: str, selected: bool) -> None:
    matches = label_matcher(selector)
    assert matches is not None
    assert matches(LABELS) is selected


@pytest.mark.parametrize(
    "selector",
    [
        "tier>1",  # numeric comparisons are left to the API server
        "tier<1",
        "tier in ()",
        "tier in (a b)",
        "a=b=c",
        "-bad=x",
        "x" * 64 + "=y",  # a name longer than 63 characters
        "UPPER.example/name=x",  # a prefix is a lower-case DNS subdomain
        "tier=" + "v" * 64,
        "tier,,app",
        "tier in (a),",
        "(tier)",
    ],
)
def test_a_selector_not_read_here_is_left_to_the_api_server(selector: str) -> None:
    assert label_matcher(selector) is None
