"""A pod that reads a striped Dataset before its share is whole (docs/design-striping.md#start):
the webhook leaves the dataset out of the caching task and adds ``dsagent-stripe-wait``,
which runs ``dsctl stripe wait``; the patch applied to real pod JSON is a valid pod."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest
from kubernetes_validate import utils as kv

from dsagent.kube.datasets import Dataset
from dsagent.webhook.mutation import INIT_CONTAINER, STRIPE_WAIT_CONTAINER, mutate, resolve
from dsplatform.wire import readerenv
from dsplatform.wire.podannotations import DatasetRef
from tests.dsagent.webhook.test_mutation import INJECTION, env_of, real_pod
from tools.support.fake_apiserver import json_patch

DIGEST = "c" * 32


def _dataset(name: str, **spec: Any) -> Dataset:
    status = {"digest": DIGEST, "files": 10, "bytes": 10 << 40, "bundles": 4}
    return Dataset.from_object(
        {
            "metadata": {"namespace": "ml", "name": name},
            "spec": {"source": f"s3://ml/{name}", "bundles": "s3://ml/packs", **spec},
            "status": status,
        }
    )


FOUND = {
    "web": _dataset("web", stripe="auto", startBeforeWhole=True),
    "web-waits": _dataset("web-waits", stripe={"members": 8}),  # striped, not opted in
    "coco": _dataset("coco"),
}


def _mutated(names: list[str]) -> dict[str, Any]:
    datasets = resolve([DatasetRef(n) for n in names], FOUND.__getitem__)
    pod = real_pod()
    return dict(json_patch(pod, mutate(pod, datasets, INJECTION)))


def test_a_striped_dataset_that_starts_before_whole_gets_dsctl_stripe_wait_not_a_whole_copy() -> None:
    pod = _mutated(["web", "coco"])
    inits = pod["spec"]["initContainers"]
    names = [c["name"] for c in inits]
    assert names[0] == INIT_CONTAINER and names[-1] == STRIPE_WAIT_CONTAINER
    cache = json.loads(env_of(inits[0])["DSAGENT_DATASETS"]["value"])
    assert [d["name"] for d in cache] == ["coco"]  # the striped one is never cached whole
    wait = inits[-1]
    assert shlex.split(wait["command"][2]) == ["dsctl", "stripe", "wait", "web", DIGEST]
    assert "restartPolicy" not in wait  # blocking: the app starts once enough of the share is local
    assert wait["securityContext"]["runAsNonRoot"] is True
    assert {m["name"] for m in wait["volumeMounts"]} == {"dsagent-socket"}
    app = pod["spec"]["containers"][0]
    stripes = json.loads(env_of(app)["DSAGENT_STRIPES"]["value"])
    assert stripes == [{"name": "web", "digest": DIGEST, "shareDir": f"/dsagent-stripes/web/{DIGEST}/share"}]
    assert readerenv.decode(env_of(app)["DSAGENT_STRIPES"]["value"]) == [
        readerenv.Share("web", DIGEST, f"/dsagent-stripes/web/{DIGEST}/share")
    ]
    # the reader's ranks exchange their nodes: the downward API gives each its own
    assert env_of(app)["DSAGENT_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    mount = next(m for m in app["volumeMounts"] if m["mountPath"] == "/dsagent-stripes/web")
    assert mount["readOnly"] is True and mount["subPath"] == "web"
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["path"] == "/var/lib/dsagent/stripes"


def test_the_readers_variables_the_app_sets_itself_are_left_as_they_are() -> None:
    datasets = resolve([DatasetRef("web")], FOUND.__getitem__)
    pod = real_pod()
    own = [{"name": "DSAGENT_NODE_NAME", "value": "gpu-7"}, {"name": "DSAGENT_STRIPES", "value": "[]"}]
    pod["spec"]["containers"][0]["env"] = own
    app = dict(json_patch(pod, mutate(pod, datasets, INJECTION)))["spec"]["containers"][0]
    names = [e["name"] for e in app["env"]]
    assert names.count("DSAGENT_NODE_NAME") == 1 and names.count("DSAGENT_STRIPES") == 1
    assert app["env"][:2] == own


def test_without_the_opt_in_or_a_packed_version_the_dataset_is_cached_as_before() -> None:
    pod = _mutated(["web-waits", "coco"])
    assert STRIPE_WAIT_CONTAINER not in [c["name"] for c in pod["spec"]["initContainers"]]
    cache = json.loads(env_of(pod["spec"]["initContainers"][0])["DSAGENT_DATASETS"]["value"])
    assert [d["name"] for d in cache] == ["web-waits", "coco"]
    unpacked = Dataset.from_object(
        {"metadata": {"namespace": "ml", "name": "web"}, "spec": {"source": "s3://x", "stripe": "auto",
                                                                   "startBeforeWhole": True}}
    )  # fmt: skip
    assert resolve([DatasetRef("web")], lambda _: unpacked)[0].stripe_digest is None
    pinned_other = resolve([DatasetRef("web", digest="d" * 32)], FOUND.__getitem__)[0]
    assert pinned_other.stripe_digest is None  # the pod pins another version: as before


def test_only_striped_datasets_wait_without_a_caching_container_or_wrapped_commands() -> None:
    pod = _mutated(["web"])
    assert [c["name"] for c in pod["spec"]["initContainers"]] == [
        c["name"] for c in real_pod()["spec"].get("initContainers", [])
    ] + [STRIPE_WAIT_CONTAINER]
    # no sidecar marks /dsagent-run/ready, so no app command waits for it
    assert pod["spec"]["containers"][0]["command"] == real_pod()["spec"]["containers"][0]["command"]


@pytest.mark.parametrize("kube_version", ["1.29.0", "1.37.0"])
def test_the_mutated_pod_is_a_valid_pod(kube_version: str) -> None:
    pod = _mutated(["web", "coco"])
    pod.pop("status", None)
    kv.validate(pod, kube_version, strict=True)


def test_in_csi_mode_the_volume_carries_the_share_and_the_app_gets_the_readers_env() -> None:
    """CSI mode: no hostPath and no wait container; the volume names the striped version
    (``stripe``: its share is shown, never a whole copy), the app gets ``DSAGENT_STRIPES``
    pointing into the volume and ``DSAGENT_SOCKET`` at the socket the volume shows, and its
    command waits for the volume's ready mark (which waits for the share's first bundles)."""
    from dsplatform.wire import csivolume
    from tests.dsagent.webhook.test_mutation_csi import CSI

    datasets = resolve([DatasetRef("web"), DatasetRef("coco")], FOUND.__getitem__)
    pod = real_pod()
    mutated = dict(json_patch(pod, mutate(pod, datasets, CSI)))
    assert STRIPE_WAIT_CONTAINER not in [c["name"] for c in mutated["spec"].get("initContainers", [])]
    assert not [v for v in mutated["spec"]["volumes"] if "hostPath" in v]
    volume = next(v for v in mutated["spec"]["volumes"] if "csi" in v)
    carried = csivolume.decode(volume["csi"]["volumeAttributes"])
    assert [(d.name, d.stripe) for d in carried] == [("web", DIGEST), ("coco", None)]
    app = mutated["spec"]["containers"][0]
    env = env_of(app)
    assert json.loads(env["DSAGENT_STRIPES"]["value"]) == [
        {"name": "web", "digest": DIGEST, "shareDir": "/dsagent-run/datasets/web"}
    ]
    assert env["DSAGENT_SOCKET"]["value"] == "/dsagent-run/agent.sock"
    assert env["DSAGENT_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "/dsagent-run/ready" in " ".join(app["command"])  # overlap: it waits for the mark
    mutated.pop("status", None)
    kv.validate(mutated, "1.37.0", strict=True)
