"""Writes the chart's Grafana dashboard (``charts/dsplatform/dashboards/dsplatform.json``).

Who calls it: a maintainer after changing a panel (``python tools/grafana/dashboard.py``);
``tools/grafana/render.py`` reads the same PANELS to draw the picture in docs/operator-guide/monitoring.md. The chart
ships the JSON through an optional ConfigMap labelled for Grafana's dashboard sidecar.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "charts" / "dsplatform" / "dashboards" / "dsplatform.json"

#: (title, unit, [(legend, PromQL)]); one row of two panels per pair
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    (
        "Cache requests by outcome (/s)",
        "reqps",
        [("{{code}}", 'sum by (code) (rate(dsplatform_agent_dataset_requests_total{job=~"$job"}[$__rate_interval]))')],
    ),
    (
        "Cache hit ratio",
        "percentunit",
        [
            (
                "hit ratio",
                "sum(rate(dsplatform_agent_cache_hits_total[$__rate_interval])) / "
                "(sum(rate(dsplatform_agent_cache_hits_total[$__rate_interval])) + "
                "sum(rate(dsplatform_agent_cache_misses_total[$__rate_interval])))",
            )
        ],
    ),
    (
        "Fetch duration (p50, p95)",
        "s",
        [
            (
                "p50",
                "histogram_quantile(0.5, sum by (le) "
                "(rate(dsplatform_agent_fetch_duration_seconds_bucket[$__rate_interval])))",
            ),
            (
                "p95",
                "histogram_quantile(0.95, sum by (le) "
                "(rate(dsplatform_agent_fetch_duration_seconds_bucket[$__rate_interval])))",
            ),
        ],
    ),
    ("Bytes fetched (/s)", "Bps", [("fetched", "sum(rate(dsplatform_agent_fetched_bytes_total[$__rate_interval]))")]),
    (
        "Cache space",
        "bytes",
        [
            ("used", "sum(dsplatform_agent_used_bytes)"),
            ("free", "sum(dsplatform_agent_free_bytes)"),
            ("capacity", "sum(dsplatform_agent_capacity_bytes)"),
        ],
    ),
    (
        "Evictions by reason (/s)",
        "ops",
        [("{{reason}}", "sum by (reason) (rate(dsplatform_agent_evictions_total[$__rate_interval]))")],
    ),
    ("Tasks by state", "short", [("{{state}}", "sum by (state) (dsplatform_agent_tasks)")]),
    (
        "Extender latency p95 by verb",
        "s",
        [
            (
                "{{verb}}",
                "histogram_quantile(0.95, sum by (le, verb) "
                "(rate(dsplatform_extender_request_duration_seconds_bucket[$__rate_interval])))",
            )
        ],
    ),
    (
        "Extender parse failures and errors (/s)",
        "reqps",
        [
            ("parse {{verb}}", "sum by (verb) (rate(dsplatform_extender_parse_failures_total[$__rate_interval]))"),
            (
                "{{outcome}} {{verb}}",
                'sum by (verb, outcome) (rate(dsplatform_extender_requests_total{outcome!="ok"}[$__rate_interval]))',
            ),
        ],
    ),
    (
        "Nodes scored (/s)",
        "short",
        [("{{verb}}", "sum by (verb) (rate(dsplatform_extender_nodes_scored_total[$__rate_interval]))")],
    ),
    (
        "Multi-worker jobs whole nodes are kept for",
        "short",
        [("waiting jobs", "max(dsplatform_extender_waiting_jobs)")],
    ),
    (
        "Agent API latency p95 by route",
        "s",
        [
            (
                "{{method}} {{route}}",
                "histogram_quantile(0.95, sum by (le, method, route) "
                '(rate(dsplatform_agent_http_request_duration_seconds_bucket{route!="unmatched"}[$__rate_interval])))',
            )
        ],
    ),
    (
        "Store open latency p95 by protocol",
        "s",
        [
            (
                "{{protocol}}",
                "histogram_quantile(0.95, sum by (le, protocol) "
                "(rate(dsplatform_agent_store_request_duration_seconds_bucket[$__rate_interval])))",
            )
        ],
    ),
    (
        "Store errors by protocol and code (/s)",
        "ops",
        [
            (
                "{{protocol}} {{code}}",
                "sum by (protocol, code) (rate(dsplatform_agent_store_errors_total[$__rate_interval]))",
            )
        ],
    ),
    (
        "Webhook admissions by outcome (/s)",
        "ops",
        [("{{outcome}}", "sum by (outcome) (rate(dsplatform_webhook_admissions_total[$__rate_interval]))")],
    ),
    (
        "Striped bundles opened by readers, by source (bytes/s)",
        "Bps",
        [
            (
                "{{source}}",
                'sum by (source) (rate(dsplatform_agent_stripe_reader_bytes_total{job=~"$job"}[$__rate_interval]))',
            )
        ],
    ),
    (
        "Striped bytes read from the node's own share, by node",
        "percentunit",
        [
            (
                "{{instance}}",
                "sum by (instance) (rate(dsplatform_agent_stripe_reader_bytes_total"
                '{job=~"$job",source="share"}[$__rate_interval])) / '
                'sum by (instance) (rate(dsplatform_agent_stripe_reader_bytes_total{job=~"$job"}[$__rate_interval]))',
            )
        ],
    ),
]


def dashboard() -> dict[str, object]:
    panels = []
    for i, (title, unit, targets) in enumerate(PANELS):
        panels.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": title,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"x": 12 * (i % 2), "y": 8 * (i // 2), "w": 12, "h": 8},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [
                    {"refId": chr(65 + j), "expr": expr, "legendFormat": legend}
                    for j, (legend, expr) in enumerate(targets)
                ],
            }
        )
    return {
        "title": "dsplatform",
        "uid": "dsplatform",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "tags": ["dsplatform", "gpu", "datasets"],
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"},
                {
                    "name": "job",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": "label_values(dsplatform_agent_build_info, job)",
                    "includeAll": True,
                    "multi": True,
                    "label": "Job",
                },
            ]
        },
        "panels": panels,
    }


if __name__ == "__main__":
    OUT.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {OUT}")
