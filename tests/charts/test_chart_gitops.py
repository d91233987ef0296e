"""Renders that stay the same without a cluster: Argo CD, Flux and
``helm template`` render with no ``lookup``, so every Secret or certificate the chart would
generate changes on each render (and a GitOps tool would roll it, breaking the agents'
tokens and the webhook's trust). Each one can be brought by the user (``existingSecret``)
or by cert-manager; with those values two renders are byte-identical.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

from tests.charts.test_chart import CHART, NAMESPACE, RELEASE, find, render

pytestmark = pytest.mark.slow

CA = "TFMwdExTMUNSVWRKVGlCRFJWSlVTVVpKUTBGVVJTMHRMUzB0Q2c9PQ=="  # base64 of a PEM's text (shape only)
GITOPS: dict[str, Any] = {
    "agent": {
        "adminToken": {"existingSecret": "ops-dsplatform-admin", "existingSecretKey": "admin"},
        "peers": {"enabled": True, "existingSecret": "ops-dsplatform-peer"},
    },
    "webhook": {"tls": {"existingSecret": "ops-webhook-tls", "caBundle": CA}},
}
GITOPS_CERT_MANAGER: dict[str, Any] = {
    "agent": GITOPS["agent"],
    "webhook": {"certManager": {"enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}},
}


def raw(values: dict[str, Any]) -> dict[str, str]:
    out = helm.Chart.load(str(CHART)).render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return {path: text for path, text in out.items() if path.endswith(".yaml")}


def test_without_a_cluster_the_generated_secrets_change_on_every_render() -> None:
    """Why the values below exist: the default render is not stable without lookup."""
    first, second = raw({}), raw({})
    changed = sorted(path.rpartition("/")[2] for path in first if first[path] != second[path])
    assert changed == ["agent-daemonset.yaml", "webhook-admission.yaml"]


@pytest.mark.parametrize("values", [GITOPS, GITOPS_CERT_MANAGER], ids=["existing-secrets", "cert-manager"])
def test_with_existing_secrets_or_cert_manager_two_renders_are_identical(values: dict[str, Any]) -> None:
    assert raw(values) == raw(values)
    docs = render(values)
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Secret"] == []


def test_every_consumer_mounts_the_named_secrets_under_their_keys() -> None:
    docs = render(GITOPS)
    agent = find(docs, "DaemonSet", "-agent")["spec"]["template"]["spec"]
    controller = find(docs, "Deployment", "-controller")["spec"]["template"]["spec"]
    for pod in (agent, controller):
        [volume] = [v for v in pod["volumes"] if v["name"] == "admin-token"]
        assert volume["secret"]["secretName"] == "ops-dsplatform-admin"
        assert volume["secret"]["items"] == [{"key": "admin", "path": "admin-token"}]
    [peer] = [v for v in agent["volumes"] if v["name"] == "peer-token"]
    assert peer["secret"]["secretName"] == "ops-dsplatform-peer"
    webhook = find(docs, "Deployment", "-webhook")["spec"]["template"]["spec"]
    [tls] = [v for v in webhook["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == "ops-webhook-tls"
    [hook] = find(docs, "MutatingWebhookConfiguration")["webhooks"]
    assert hook["clientConfig"]["caBundle"] == CA
    assert "Certificate" not in {d["kind"] for d in docs}


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"webhook": {"tls": {"existingSecret": "own"}}}, "webhook.tls.caBundle"),
        (
            {"webhook": {"tls": {"existingSecret": "own", "caBundle": CA}, "certManager": {"enabled": True}}},
            "choose one",
        ),
    ],
)
def test_an_incomplete_or_double_certificate_choice_fails_the_render(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(Exception, match=complaint):
        render(values)


@pytest.mark.parametrize(
    "values",
    [
        {"webhook": {"tls": {"existingSecret": "own", "caBundle": "not base64!"}}},
        {"agent": {"adminToken": {"existingSecret": "Not_A_Name"}}},
        {"agent": {"adminToken": {"existingSecretKey": "a/b"}}},
    ],
)
def test_the_schema_refuses_malformed_secret_values(values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        helm.Chart.load(str(CHART)).validate_schema(values)
