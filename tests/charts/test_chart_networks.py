"""The chart's Multus NetworkAttachmentDefinitions per GPU-RoCE class (README "VF networks")."""

from __future__ import annotations

import json
from typing import Any

import helm_python as helm
import pytest

from dsagent.webhook.gpurequest import GpuClassSettings
from tests.charts.test_chart import CHART, NAMESPACE, RELEASE, render

NETWORKS: dict[str, Any] = {
    "gpuClasses": {"enabled": True},
    "networkAttachments": {
        "enabled": True,
        "classes": [
            {
                "class": "gpu-roce1",
                "resourceName": "openshift.io/gpurail1",
                "ipam": {"type": "whereabouts", "range": "10.1.0.0/16"},
            },
            {
                "class": "gpu-roce2",
                "resourceName": "openshift.io/gpurail2",
                "ipam": {"type": "whereabouts", "range": "10.2.0.0/16"},
            },
        ],
    },
}


def test_off_by_default() -> None:
    assert not [d for d in render() if d["kind"] == "NetworkAttachmentDefinition"]
    webhook = next(
        d
        for d in render({"gpuClasses": {"enabled": True}})
        if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("webhook")
    )
    names = {e["name"] for e in webhook["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "DSAGENT_WEBHOOK_NETWORKS" not in names


def test_one_attachment_per_class_and_the_webhook_names_them() -> None:
    docs = render(NETWORKS)
    nads = [d for d in docs if d["kind"] == "NetworkAttachmentDefinition"]
    assert [d["metadata"]["name"] for d in nads] == [
        f"{RELEASE}-dsplatform-gpu-roce1",
        f"{RELEASE}-dsplatform-gpu-roce2",
    ]
    first = nads[0]
    assert first["apiVersion"] == "k8s.cni.cncf.io/v1" and first["metadata"]["namespace"] == NAMESPACE
    assert first["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"] == "openshift.io/gpurail1"
    config = json.loads(first["spec"]["config"])
    assert config == {
        "cniVersion": "0.3.1",
        "name": f"{RELEASE}-dsplatform-gpu-roce1",
        "type": "sriov",
        "ipam": {"type": "whereabouts", "range": "10.1.0.0/16"},
    }
    webhook = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("webhook"))
    env = {e["name"]: e.get("value") for e in webhook["spec"]["template"]["spec"]["containers"][0]["env"]}
    template = env["DSAGENT_WEBHOOK_NETWORKS"]
    # the webhook accepts what the chart renders, and names exactly the rendered attachments
    settings = GpuClassSettings.from_env(env)
    assert template == f"{NAMESPACE}/{RELEASE}-dsplatform-{{class}}"
    assert [settings.network(d["metadata"]["labels"]["dsagent.io/gpu-class"]) for d in nads] == [
        f"{NAMESPACE}/{d['metadata']['name']}" for d in nads
    ]
    report = helm.lint(str(CHART), NETWORKS, strict=True, namespace=NAMESPACE)
    assert report["errors"] == [] and not [m for m in report["messages"] if m["severity"] >= 2]


@pytest.mark.parametrize(
    "entry",
    [
        {"class": "GPU_roce1", "resourceName": "openshift.io/r1", "ipam": {"type": "whereabouts"}},
        {"class": "gpu-roce1", "ipam": {"type": "whereabouts"}},
        {"class": "gpu-roce1", "resourceName": "openshift.io/r1", "ipam": {}},
    ],
    ids=["bad-class-name", "no-resource", "ipam-without-type"],
)
def test_the_schema_refuses_a_bad_class_entry(entry: dict[str, Any]) -> None:
    values = {"networkAttachments": {"enabled": True, "classes": [entry]}}
    with pytest.raises(Exception, match="networkAttachments"):
        render(values)
