"""The dashboard picture's PromQL (tools/grafana/promql.py): every panel of the chart's
dashboard is read, and each form gives what Prometheus gives on the same scrapes."""

from __future__ import annotations

import math

import pytest

from tools.grafana import promql
from tools.grafana.dashboard import PANELS


def _scrapes() -> list[tuple[float, promql.Samples]]:
    """Six scrapes 2 s apart: a counter by code rising 10/s (ok) and 1/s (500), a histogram
    whose 10 observations a second fall half under 0.1 s and half in (0.1, 0.5], a gauge."""
    out = []
    for i in range(6):
        t = 2.0 * i
        out.append(
            (
                t,
                {
                    ("req_total", (("code", "200"), ("job", "agent"))): 10 * t,
                    ("req_total", (("code", "500"), ("job", "agent"))): 1 * t,
                    ("hits_total", ()): 3 * t,
                    ("misses_total", ()): 1 * t,
                    ("dur_bucket", (("le", "0.1"),)): 5 * t,
                    ("dur_bucket", (("le", "0.5"),)): 10 * t,
                    ("dur_bucket", (("le", "+Inf"),)): 10 * t,
                    ("space_bytes", (("node", "a"),)): 100.0,
                    ("space_bytes", (("node", "b"),)): 50.0,
                },
            )
        )
    return out


def _last(expr: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {k: v[-1] for k, v in promql.evaluate(promql.parse(expr), _scrapes()).items()}


def test_each_form_gives_what_prometheus_gives() -> None:
    assert _last('sum by (code) (rate(req_total{job=~"$job"}[$__rate_interval]))') == {
        (("code", "200"),): pytest.approx(10.0),
        (("code", "500"),): pytest.approx(1.0),
    }
    assert _last('sum(rate(req_total{code!="200"}[1m]))') == {(): pytest.approx(1.0)}
    assert _last('sum(rate(req_total{code="200"}[10s]))') == {(): pytest.approx(10.0)}
    hits, misses = "sum(rate(hits_total[$__rate_interval]))", "sum(rate(misses_total[$__rate_interval]))"
    ratio = f"{hits} / ({hits} + {misses})"
    assert _last(ratio) == {(): pytest.approx(0.75)}
    # half the observations under 0.1 s: the median is the bucket's top; p95 interpolated in (0.1, 0.5]
    assert _last("histogram_quantile(0.5, sum by (le) (rate(dur_bucket[$__rate_interval])))") == {
        (): pytest.approx(0.1)
    }
    p95 = _last("histogram_quantile(0.95, sum by (le) (rate(dur_bucket[$__rate_interval])))")
    assert p95 == {(): pytest.approx(0.1 + 0.4 * 0.9)}
    assert _last("sum(space_bytes)") == {(): 150.0}
    assert _last("max(space_bytes)") == {(): 100.0}  # a gauge two replicas report: one of them
    assert _last("sum by (node) (space_bytes)") == {(("node", "a"),): 100.0, (("node", "b"),): 50.0}
    first = promql.evaluate(promql.parse("sum(rate(hits_total[10s]))"), _scrapes())[()][0]
    assert math.isnan(first)  # no earlier scrape inside the range: no rate yet, as in Prometheus
    assert promql.legend("{{code}} {{verb}}", (("code", "500"),)) == "500"


@pytest.mark.parametrize(("title", "targets"), [(p[0], p[2]) for p in PANELS], ids=[p[0] for p in PANELS])
def test_every_dashboard_panel_is_read(title: str, targets: list[tuple[str, str]]) -> None:
    for _, expr in targets:
        series = promql.evaluate(promql.parse(expr), _scrapes())
        assert isinstance(series, dict), title


@pytest.mark.parametrize(
    "expr", ["avg(x)", "min(x)", "x * 2", "sum without (a) (x)", 'x{a>"b"}', "rate(x)", "sum(x) )"]
)
def test_promql_outside_the_subset_is_refused(expr: str) -> None:
    with pytest.raises(ValueError, match="PromQL"):
        promql.parse(expr)
