"""The webhook's patch on real pod JSON, applied and validated as the API server would."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes_validate import utils as kv

from dsagent.errors import InvalidInput, NotFound
from dsagent.kube.datasets import Dataset, SecretRef
from dsagent.webhook.mutation import (
    INIT_CONTAINER,
    READY_MARK,
    Injection,
    ResolvedDataset,
    mutate,
    options_env_name,
    resolve,
    wait_mode,
)
from dsplatform.wire.podannotations import DatasetRef
from tools.support.fake_apiserver import json_patch, make_pod

REVIEW = json.loads(
    (Path(__file__).resolve().parents[2] / "fixtures" / "admission" / "admission-review-pytorchjob.json").read_text()
)
INJECTION = Injection(
    image="ghcr.io/dsplatform/dsplatform:0.1.0",
    scheduler_name="dsplatform-scheduler",
    resources={"requests": {"cpu": "50m"}},
)
IMAGENET = ResolvedDataset("imagenet", "s3://ml/imagenet", "s3://ml/bundles", secret=SecretRef("s3-creds"))
COCO = ResolvedDataset("coco", "/mnt/nfs/coco")


def real_pod() -> dict[str, Any]:
    return copy.deepcopy(REVIEW["request"]["object"])


def mutated(
    pod: dict[str, Any], datasets: tuple[ResolvedDataset, ...] = (IMAGENET, COCO), injection: Injection = INJECTION
) -> dict[str, Any]:
    result: dict[str, Any] = json_patch(pod, mutate(pod, datasets, injection))
    return result


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def test_the_cache_container_comes_first_and_runs_dsctl_cache_from_env() -> None:
    pod = mutated(real_pod())
    init = pod["spec"]["initContainers"][0]
    assert init["name"] == INIT_CONTAINER
    assert init["command"][:2] == ["/bin/sh", "-c"] and init["command"][2].startswith("dsctl cache --from-env && ")
    env = env_of(init)
    assert json.loads(env["DSAGENT_DATASETS"]["value"]) == [
        {"name": "imagenet", "source": "s3://ml/imagenet", "bundles": "s3://ml/bundles"},
        {"name": "coco", "source": "/mnt/nfs/coco"},
    ]
    assert env["DSAGENT_TASK_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["DSAGENT_SOCKET"]["value"] == "/run/dsagent/dsagent.sock"
    assert init["resources"] == {"requests": {"cpu": "50m"}}
    assert init["securityContext"]["runAsNonRoot"] is True


def test_storage_options_come_from_the_datasets_secret_never_from_the_spec() -> None:
    pod = mutated(real_pod())
    env = env_of(pod["spec"]["initContainers"][0])
    assert env["DSAGENT_STORAGE_OPTIONS_IMAGENET"]["valueFrom"] == {
        "secretKeyRef": {"name": "s3-creds", "key": "storage_options"}
    }
    assert "DSAGENT_STORAGE_OPTIONS_COCO" not in env


def test_inline_storage_options_reach_only_the_init_container() -> None:
    inline = ResolvedDataset("a", "s3://x/a", storage_options={"key": "k", "secret": "s"})
    pod = mutated(real_pod(), (inline,))
    assert json.loads(env_of(pod["spec"]["initContainers"][0])["DSAGENT_DATASETS"]["value"])[0]["storage_options"]
    app_env = env_of(pod["spec"]["containers"][0])
    assert "storage_options" not in app_env["DSAGENT_DATASETS"]["value"]


def test_by_default_caching_overlaps_the_app_image_pull() -> None:
    pod = mutated(real_pod())
    assert wait_mode(real_pod()) == "overlap"
    sidecar = pod["spec"]["initContainers"][0]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: app containers start meanwhile
    assert {"name": "dsagent-run", "mountPath": "/dsagent-run"} in sidecar["volumeMounts"]
    [app] = pod["spec"]["containers"]
    assert app["command"][:3] == ["/bin/sh", "-c", app["command"][2]]
    assert app["command"][3:] == ["torchrun", "--nproc-per-node=8", "train.py", "--data=/datasets/imagenet"]
    assert 'exec "$0" "$@"' in app["command"][2] and READY_MARK in app["command"][2]
    assert {"name": "dsagent-run", "mountPath": "/dsagent-run", "readOnly": True} in app["volumeMounts"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["dsagent-run"]["emptyDir"]["medium"] == "Memory"


@pytest.mark.parametrize("reason", ["annotation", "no-command"])
def test_a_blocking_init_container_when_asked_or_when_a_command_is_unknown(reason: str) -> None:
    pod = real_pod()
    if reason == "annotation":
        pod["metadata"]["annotations"]["dsagent.io/wait"] = "init"
    else:
        del pod["spec"]["containers"][0]["command"]
    result = mutated(pod)
    init = result["spec"]["initContainers"][0]
    assert init["command"] == [
        "/bin/sh",
        "-c",
        "dsctl cache --from-env && python -m dsagent.cli.links /dsagent-run/datasets /datasets",
    ]
    assert "restartPolicy" not in init
    assert result["spec"]["containers"][0].get("command") == pod["spec"]["containers"][0].get("command")


@pytest.mark.slow
def test_the_wrapped_command_waits_for_the_mark_then_becomes_the_original(tmp_path: Path) -> None:
    import subprocess

    [app] = mutated(real_pod())["spec"]["containers"]
    script = app["command"][2].replace(READY_MARK, str(tmp_path / "ready"))
    argv = ["/bin/sh", "-c", script, "/bin/echo", "train", "--epochs=1"]
    waiting = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with pytest.raises(subprocess.TimeoutExpired):
        waiting.wait(timeout=0.5)  # no mark yet: still waiting
    (tmp_path / "ready").touch()
    out, err = waiting.communicate(timeout=10)
    assert waiting.returncode == 0 and out == "train --epochs=1\n"
    assert "waiting for datasets" in err


def test_app_containers_get_the_datasets_read_only_and_the_socket() -> None:
    pod = mutated(real_pod())
    [container] = pod["spec"]["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["dsagent-datasets"] == {
        "name": "dsagent-datasets",
        "mountPath": "/datasets",
        "subPath": "datasets",
        "readOnly": True,
    }
    assert mounts["dsagent-socket"]["mountPath"] == "/run/dsagent"
    assert mounts["dshm"]["mountPath"] == "/dev/shm"  # what was there stays
    env = env_of(container)
    assert env["MASTER_PORT"]["value"] == "23456"
    assert env["DSAGENT_DATASETS_DIR"]["value"] == "/dsagent-run/datasets"
    assert mounts["dsagent-run"] == {"name": "dsagent-run", "mountPath": "/dsagent-run", "readOnly": True}
    assert env["DSAGENT_TASK_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["dsagent-datasets"]["hostPath"] == {"path": "/var/lib/dsagent", "type": "DirectoryOrCreate"}
    assert volumes["dsagent-socket"]["hostPath"]["path"] == "/run/dsagent"
    assert "kube-api-access-7xq2k" in volumes


def test_the_pod_goes_to_the_dsplatform_scheduler_and_joins_the_agents_group() -> None:
    pod = mutated(real_pod())
    assert pod["spec"]["schedulerName"] == "dsplatform-scheduler"
    assert pod["spec"]["securityContext"]["supplementalGroups"] == [65532]
    assert pod["metadata"]["annotations"]["dsagent.io/injected"] == "true"
    assert pod["metadata"]["annotations"]["dsagent.io/datasets"] == "imagenet,coco"


def test_a_pod_of_another_scheduler_keeps_it() -> None:
    pod = real_pod()
    pod["spec"]["schedulerName"] = "volcano"
    assert mutated(pod)["spec"]["schedulerName"] == "volcano"


def test_without_a_scheduler_name_configured_the_pod_keeps_the_default() -> None:
    injection = Injection(image="img:1")
    assert mutated(real_pod(), injection=injection)["spec"]["schedulerName"] == "default-scheduler"


@pytest.mark.parametrize("kube_version", ["1.29.0", "1.37.0"])
def test_the_mutated_pod_is_a_valid_pod(kube_version: str) -> None:
    pod = mutated(real_pod())
    pod.pop("status")
    kv.validate(pod, kube_version, strict=True)


def test_a_minimal_pod_without_lists_or_security_context_gets_them_created() -> None:
    pod = make_pod("p", annotations={"dsagent.io/datasets": "coco"})
    del pod["spec"]["securityContext"]
    del pod["spec"]["schedulerName"]
    pod["metadata"].pop("annotations")
    result = mutated(pod, (COCO,))
    assert [c["name"] for c in result["spec"]["initContainers"]] == [INIT_CONTAINER]
    assert result["spec"]["securityContext"] == {"supplementalGroups": [65532]}
    assert result["spec"]["schedulerName"] == "dsplatform-scheduler"
    assert result["metadata"]["annotations"] == {"dsagent.io/injected": "true"}


def test_existing_init_containers_run_after_caching() -> None:
    pod = make_pod("p", init_containers=[{"name": "setup", "image": "busybox"}])
    result = mutated(pod, (COCO,))
    assert [c["name"] for c in result["spec"]["initContainers"]] == [INIT_CONTAINER, "setup"]


def test_a_user_set_variable_or_mount_path_wins() -> None:
    pod = real_pod()
    pod["spec"]["containers"][0]["env"].append({"name": "DSAGENT_SOCKET", "value": "/mine.sock"})
    pod["spec"]["containers"][0]["volumeMounts"].append({"name": "dshm", "mountPath": "/datasets"})
    container = mutated(pod)["spec"]["containers"][0]
    assert [e["value"] for e in container["env"] if e["name"] == "DSAGENT_SOCKET"] == ["/mine.sock"]
    assert [m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/datasets"] == ["dshm"]


def test_mutating_twice_changes_nothing_the_second_time() -> None:
    once = mutated(real_pod())
    assert mutate(once, (IMAGENET, COCO), INJECTION) == []


def test_a_pod_asking_for_nothing_is_not_touched() -> None:
    assert mutate(real_pod(), (), INJECTION) == []


def test_the_patch_applies_supplemental_group_once() -> None:
    pod = real_pod()
    pod["spec"]["securityContext"] = {"supplementalGroups": [65532, 100]}
    assert mutated(pod)["spec"]["securityContext"]["supplementalGroups"] == [65532, 100]
    pod["spec"]["securityContext"] = {"supplementalGroups": [100]}
    assert mutated(pod)["spec"]["securityContext"]["supplementalGroups"] == [100, 65532]


def test_names_mapping_to_one_variable_are_refused() -> None:
    with pytest.raises(InvalidInput):
        mutate(real_pod(), (ResolvedDataset("a-b", "s3://x"), ResolvedDataset("a.b", "s3://y")), INJECTION)


@pytest.mark.parametrize(
    ("name", "var"),
    [("imagenet", "DSAGENT_STORAGE_OPTIONS_IMAGENET"), ("coco-2017.v2", "DSAGENT_STORAGE_OPTIONS_COCO_2017_V2")],
)
def test_option_variable_names_match_what_dsctl_reads(name: str, var: str) -> None:
    cache_cli = pytest.importorskip("dsagent.cli.cache")
    assert options_env_name(name) == var
    env = {"DSAGENT_DATASETS": json.dumps([{"name": name, "source": "s3://x"}]), var: '{"anon": true}'}
    assert cache_cli.datasets_from_env(env)[0]["storage_options"] == {"anon": True}


def test_names_are_resolved_through_datasets_and_inline_sources_are_kept() -> None:
    found = {"imagenet": Dataset("ml-team", "imagenet", "s3://ml/imagenet", "s3://ml/bundles", SecretRef("c", "k"))}

    def lookup(name: str) -> Dataset:
        if name not in found:
            raise NotFound(f"Dataset ml-team/{name}: not found")
        return found[name]

    resolved = resolve((DatasetRef("imagenet"), DatasetRef("coco", "/nfs/coco")), lookup)
    assert resolved == (
        ResolvedDataset("imagenet", "s3://ml/imagenet", "s3://ml/bundles", secret=SecretRef("c", "k")),
        ResolvedDataset("coco", "/nfs/coco"),
    )
    with pytest.raises(NotFound):
        resolve((DatasetRef("missing"),), lookup)


@pytest.mark.parametrize(
    ("raw", "complaint"),
    [
        ({}, "'image' is required"),
        ({"image": ""}, "image must not be empty"),
        ({"image": "i", "cacheDir": "relative"}, "absolute path"),
        ({"image": "i", "runAsUser": 0}, "non-root"),
        ({"image": "i", "imagePullPolicyy": "Always"}, "unknown keys"),
    ],
)
def test_bad_injection_settings_are_refused(raw: dict[str, Any], complaint: str) -> None:
    with pytest.raises(InvalidInput) as info:
        Injection.from_json(raw)
    assert complaint in str(info.value)
