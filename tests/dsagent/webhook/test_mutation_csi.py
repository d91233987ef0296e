"""The webhook's CSI mode: one inline csi volume, no hostPath, and a restricted pod stays restricted."""

from __future__ import annotations

import copy
import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes_validate import utils as kv

from dsagent.errors import InvalidInput
from dsagent.kube.datasets import SecretRef
from dsagent.nodeplugins.csi.volumes import datasets_from_context, storage_options
from dsagent.webhook.mutation import INIT_CONTAINER, Injection, ResolvedDataset, mutate
from tests.dsagent.webhook.test_mutation import COCO, IMAGENET, real_pod
from tests.podsecurity import violations
from tools.support.fake_apiserver import json_patch

CSI = Injection(image="ghcr.io/dsplatform/dsplatform:0.1.0", scheduler_name="dsplatform-scheduler", volume_mode="csi")
RESTRICTED_CONTEXT = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def restricted_pod(*, command: bool = True) -> dict[str, Any]:
    """A training pod that passes Pod Security restricted as the user wrote it."""
    pod = real_pod()
    spec = pod["spec"]
    spec["volumes"] = [
        v for v in spec.get("volumes") or [] if set(v) & {"emptyDir", "configMap", "secret", "projected"}
    ]
    kept = {v["name"] for v in spec["volumes"]}
    for container in spec["containers"]:
        container["securityContext"] = copy.deepcopy(RESTRICTED_CONTEXT)
        container["volumeMounts"] = [m for m in container.get("volumeMounts") or [] if m["name"] in kept]
        if not command:
            container.pop("command", None)
    assert violations(pod) == [], violations(pod)
    return pod


def mutated(pod: dict[str, Any], injection: Injection = CSI) -> dict[str, Any]:
    result: dict[str, Any] = json_patch(pod, mutate(pod, (IMAGENET, COCO), injection))
    return result


@pytest.mark.parametrize("command", [True, False], ids=["overlap", "init"])
def test_a_restricted_pod_stays_restricted_after_csi_mutation(command: bool) -> None:
    pod = mutated(restricted_pod(command=command))
    assert violations(pod) == []
    assert not any("hostPath" in v for v in pod["spec"]["volumes"])
    kv.validate(pod, "1.31", strict=True)


def test_the_hostpath_mode_breaks_restricted_which_is_why_csi_is_the_default() -> None:
    pod = mutated(restricted_pod(), replace(CSI, volume_mode="hostPath"))
    assert any("hostPath" in v for v in violations(pod)), violations(pod)
    assert any("hostPath" in v for v in violations(pod, "baseline"))


def test_the_policy_helper_catches_each_restricted_rule() -> None:
    base = restricted_pod()
    breaks = [
        ({"privileged": True}, "privileged"),
        ({"allowPrivilegeEscalation": True}, "allowPrivilegeEscalation"),
        ({"runAsNonRoot": False}, "runAsNonRoot"),
        ({"runAsUser": 0}, "runAsUser 0"),
        ({"capabilities": {"drop": ["NET_RAW"]}}, "drop ALL"),
        ({"seccompProfile": {"type": "Unconfined"}}, "seccomp"),
        ({"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}, "capabilities"),
    ]
    for change, words in breaks:
        pod = copy.deepcopy(base)
        pod["spec"]["containers"][0]["securityContext"].update(change)
        assert any(words in v for v in violations(pod)), (change, violations(pod))
    pod = copy.deepcopy(base)
    pod["spec"]["hostNetwork"] = True
    assert violations(pod, "baseline") == ["host namespaces: hostNetwork"]


def test_the_volume_lists_the_datasets_the_driver_accepts_and_the_secret_by_reference() -> None:
    pod = mutated(restricted_pod())
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "dsagent-datasets")
    assert volume["csi"]["driver"] == "datasets.dsagent.io" and volume["csi"]["readOnly"] is True
    assert volume["csi"]["nodePublishSecretRef"] == {"name": "s3-creds"}
    attributes = volume["csi"]["volumeAttributes"]
    assert set(attributes) == {"datasets", "version"}
    # what the webhook writes is what the node plugin parses
    parsed = datasets_from_context(attributes)
    assert parsed == (
        {
            "name": "imagenet",
            "source": "s3://ml/imagenet",
            "bundles": "s3://ml/bundles",
            "secretKey": "storage_options",
        },
        {"name": "coco", "source": "/mnt/nfs/coco"},
    )
    assert storage_options(parsed[0], {"storage_options": '{"key": "k"}'}) == {"key": "k"}
    assert "storage_options" not in json.dumps(pod["spec"]["containers"])  # no credentials in the spec


def test_app_containers_mount_it_read_only_with_host_to_container_propagation() -> None:
    pod = mutated(restricted_pod())
    for container in pod["spec"]["containers"]:
        mount = next(m for m in container["volumeMounts"] if m["name"] == "dsagent-datasets")
        assert mount == {
            "name": "dsagent-datasets",
            "mountPath": "/dsagent-run",
            "readOnly": True,
            "mountPropagation": "HostToContainer",
        }
        env = {e["name"]: e for e in container["env"]}
        assert env["DSAGENT_DATASETS_DIR"]["value"] == "/dsagent-run/datasets"
        assert env["DSAGENT_STATUS_FILE"]["value"] == "/dsagent-run/status.json"
        assert "DSAGENT_SOCKET" not in env
        assert "/dsagent-run/ready" in container["command"][2]
    assert not any(
        c["name"] in (INIT_CONTAINER, "dsagent-wait") for c in pod["spec"].get("initContainers") or []
    )  # the agent caches from publish
    assert "supplementalGroups" not in (pod["spec"].get("securityContext") or {})
    assert mutate(pod, (IMAGENET, COCO), CSI) == []  # re-invocation adds nothing


def test_init_mode_waits_in_an_init_container_and_fails_when_caching_failed(tmp_path: Path) -> None:
    pod = mutated(restricted_pod(command=False))
    init = pod["spec"]["initContainers"][0]
    assert init["name"] == "dsagent-wait" and "restartPolicy" not in init
    script = init["command"][2].replace("/dsagent-run", str(tmp_path))
    (tmp_path / "status.json").write_text('{"state": "failed"}')
    (tmp_path / "failed").touch()
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=10)
    assert done.returncode == 1 and "failed" in done.stderr
    (tmp_path / "failed").unlink()
    (tmp_path / "ready").touch()
    assert subprocess.run(["/bin/sh", "-c", script], timeout=10).returncode == 0


def test_what_csi_mode_cannot_carry_is_refused_with_a_reason() -> None:
    two_secrets = (IMAGENET, replace(COCO, secret=SecretRef("other")))
    with pytest.raises(InvalidInput, match="one"):
        mutate(restricted_pod(), two_secrets, CSI)
    inline = (ResolvedDataset("mnist", "s3://x/mnist", storage_options={"anon": True}),)
    with pytest.raises(InvalidInput, match="inline storage options"):
        mutate(restricted_pod(), inline, CSI)
    with pytest.raises(InvalidInput, match="volumeMode"):
        Injection.from_json({"image": "x", "volumeMode": "nfs"})
