"""The chart's switch for the controller's store gc Jobs (issue 23, item 5)."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

from dsagent.controller.controllersettings import ControllerSettings
from tests.charts.test_chart import CHART, find, render


def controller_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    [container] = find(docs, "Deployment", "-controller")["spec"]["template"]["spec"]["containers"]
    # the admin token file is a Secret mounted in the cluster: not readable here
    return {e["name"]: e["value"] for e in container["env"] if "value" in e and e["name"] != "DSAGENT_ADMIN_TOKEN_FILE"}


def test_store_gc_is_off_by_default_and_on_runs_at_the_values_interval_and_grace() -> None:
    default = controller_env(render({}))
    assert "DSAGENT_CONTROLLER_STORE_GC" not in default
    assert ControllerSettings.from_env(default).store_gc_s is None
    docs = render(
        {
            "controller": {
                "storeGC": {"enabled": True, "interval": "12h", "grace": "3d"},
                "packServiceAccount": "bucket-writer",
            }
        }
    )
    settings = ControllerSettings.from_env(controller_env(docs))
    assert (settings.store_gc_s, settings.store_gc_grace_s) == (12 * 3600, 3 * 86400)
    assert settings.pack_service_account == "bucket-writer"  # the gc Jobs' credentials too
    role = find(docs, "Role", "-controller")
    jobs = [r for r in role["rules"] if r["apiGroups"] == ["batch"]]
    assert jobs == [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "create"]}]


@pytest.mark.parametrize("values", [{"interval": "daily"}, {"grace": "7"}, {"enabeld": True}])
def test_the_schema_refuses_bad_store_gc_values(values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        helm.Chart.load(str(CHART)).validate_schema({"controller": {"storeGC": values}})
