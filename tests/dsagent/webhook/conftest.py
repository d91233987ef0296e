"""Fixtures of the webhook's tests."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tests.charts.test_chart import NAMESPACE, find, render


@pytest.fixture(scope="module")
def chart_tls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The serving certificate, CA bundle and injection config as `helm install` renders them."""
    docs = render()
    secret = find(docs, "Secret", "-webhook-tls")
    service = find(docs, "Service", "-webhook")
    webhook = find(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    folder = tmp_path_factory.mktemp("webhook")
    files = {}
    for key in ("tls.crt", "tls.key"):
        files[key] = folder / key
        files[key].write_bytes(base64.b64decode(secret["data"][key]))
    files["injection"] = folder / "injection.json"
    files["injection"].write_text(find(docs, "ConfigMap", "-webhook")["data"]["injection.json"])
    return {
        "files": files,
        "ca": base64.b64decode(webhook["clientConfig"]["caBundle"]).decode(),
        "host": f"{service['metadata']['name']}.{NAMESPACE}.svc",
    }
