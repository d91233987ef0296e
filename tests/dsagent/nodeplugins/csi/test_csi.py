"""The CSI node plugin through a real gRPC client on a unix socket (docs/design.md#csi).

Mount-dependent steps use real bind mounts and real mount propagation; they skip, with
the reason, where this process cannot mount (not root, or a sandbox without
CAP_SYS_ADMIN). Everything else (identity, validation of hostile fields) always runs.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dsagent.cache.settings import Settings
from dsagent.errors import NotFound
from dsagent.nodeplugins.csi import mounts
from dsagent.nodeplugins.proto.csi import csi_pb2
from tests.dsagent.cli.test_agent_process import packed, verify_tree
from tests.dsagent.nodeplugins.csi.harness import DRIVER, CsiAgent, CsiClient, Kubelet, context, mount_rights
from tools.support.harness import LoopbackServer


@pytest.fixture
def sockets() -> Iterator[Path]:
    """A short directory for unix sockets: pytest's tmp paths (longer still under xdist) can
    pass the 107-byte limit of a socket path, which the agent refuses."""
    path = Path(tempfile.mkdtemp(prefix="csi-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def env(tmp_path: Path, sockets: Path) -> Iterator[dict[str, Any]]:
    www = tmp_path / "www"
    www.mkdir()
    server = LoopbackServer(www)
    settings = Settings(
        root=tmp_path / "root",
        socket_path=sockets / "api.sock",
        node_name="gpu-node-7",
        csi_socket=sockets / DRIVER / "csi.sock",
        csi_kubelet_pods_dir=tmp_path / "kubelet" / "pods",
        sweep_interval=3600,
    )
    state: dict[str, Any] = {"tmp": tmp_path, "www": www, "server": server, "settings": settings}
    yield state
    for key in ("client",):
        if key in state:
            state[key].close()
    if "agent" in state:
        state["agent"].stop()
    if "kubelet" in state:
        state["kubelet"].close()
    server.close()


def start(env: dict[str, Any]) -> tuple[CsiAgent, CsiClient]:
    env["agent"] = CsiAgent(env["settings"])
    if "client" in env:  # a fresh channel, as the registrar-fed kubelet reconnects; no back-off to wait out
        env["client"].close()
    env["client"] = CsiClient(env["settings"].csi_socket)
    return env["agent"], env["client"]


@pytest.fixture
def kubelet(env: dict[str, Any]) -> Kubelet:
    reason = mount_rights(env["tmp"])
    if reason:
        pytest.skip(reason)
    env["kubelet"] = Kubelet(env["tmp"])
    return env["kubelet"]


def wait_for(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def mounts_under(path: Path) -> list[str]:
    return [p for p in mounts.mount_points() if p == str(path) or p.startswith(str(path) + "/")]


# -- no mounts needed ---------------------------------------------------------------------


def test_identity_and_node_info_answer_over_the_socket(env: dict[str, Any]) -> None:
    _, client = start(env)
    info = client.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest(), timeout=5)
    assert info.name == DRIVER and info.vendor_version
    assert (
        list(client.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest(), timeout=5).capabilities)
        == []
    )
    probe = client.identity.Probe(csi_pb2.ProbeRequest(), timeout=5)
    assert probe.HasField("ready") and probe.ready.value is True
    assert list(client.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest(), timeout=5).capabilities) == []
    assert client.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=5).node_id == "gpu-node-7"


def test_hostile_fields_are_refused_before_anything_touches_the_filesystem(env: dict[str, Any]) -> None:
    _, client = start(env)
    pods: Path = env["settings"].csi_kubelet_pods_dir
    uid = "0f6c2d35-0a1b-4c5d-8e9f-0123456789ab"
    good = pods / uid / "volumes" / "kubernetes.io~csi" / "datasets" / "mount"
    good.parent.mkdir(parents=True)
    (pods / "0f6c2d35-0a1b-4c5d-8e9f-0123456789ac" / "volumes" / "kubernetes.io~csi").mkdir(parents=True)
    (pods / "0f6c2d35-0a1b-4c5d-8e9f-0123456789ac" / "volumes" / "kubernetes.io~csi" / "datasets").symlink_to(
        env["tmp"]
    )
    datasets = [{"name": "imagenet", "source": "s3://bucket/imagenet"}]
    ctx = context(uid, datasets)
    cases: list[tuple[str, str, dict[str, str], dict[str, Any]]] = [
        ("bad volume id", str(good), ctx, {"volume_id": "../../etc"}),
        ("outside the pods dir", str(env["tmp"] / "elsewhere" / "mount"), ctx, {}),
        ("dot-dot", str(good.parent / ".." / ".." / ".." / ".." / "etc" / "mount"), ctx, {}),
        ("not a csi volume path", str(pods / uid / "volumes" / "kubernetes.io~empty-dir" / "x" / "mount"), ctx, {}),
        ("another pod's path", str(good).replace(uid, "0f6c2d35-0a1b-4c5d-8e9f-0123456789ad"), ctx, {}),
        (
            "symlinked volume dir",
            str(pods / "0f6c2d35-0a1b-4c5d-8e9f-0123456789ac" / "volumes" / "kubernetes.io~csi" / "datasets" / "mount"),
            context("0f6c2d35-0a1b-4c5d-8e9f-0123456789ac", datasets),
            {},
        ),
        ("not ephemeral", str(good), {**ctx, "csi.storage.k8s.io/ephemeral": "false"}, {}),
        ("bad pod uid", str(good), {**ctx, "csi.storage.k8s.io/pod.uid": "x; rm -rf /"}, {}),
        ("unknown attribute", str(good), {**ctx, "hostPath": "/"}, {}),
        ("datasets not json", str(good), {**ctx, "datasets": "[{"}, {}),
        ("dataset name escapes", str(good), context(uid, [{"name": "../x", "source": "s3://b/x"}]), {}),
        ("secret key missing", str(good), context(uid, [{**datasets[0], "secretKey": "creds"}]), {}),
        (
            "secret not json",
            str(good),
            context(uid, [{**datasets[0], "secretKey": "creds"}]),
            {"secrets": {"creds": "hunter2"}},
        ),
        ("block volume", str(good), ctx, {"block": True}),
    ]
    for why, target, volume_context, extra in cases:
        volume_id = extra.pop("volume_id", "csi-0123")
        with pytest.raises(grpc.RpcError) as caught:
            client.publish(volume_id, target, volume_context, **extra)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (why, caught.value.details())
        assert "hunter2" not in (caught.value.details() or "")
    # a missing capability is refused too
    with pytest.raises(grpc.RpcError) as caught:
        client.node.NodePublishVolume(
            csi_pb2.NodePublishVolumeRequest(volume_id="csi-1", target_path=str(good), volume_context=ctx), timeout=5
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not good.exists()
    assert list((env["settings"].root / "csi" / "volumes").iterdir()) == []
    with pytest.raises(grpc.RpcError) as caught:
        client.unpublish("csi-1", "/etc/mount")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(NotFound):
        env["agent"].call(env["agent"].service.get_task(uid))


def test_nested_or_oversized_attributes_and_secrets_are_invalid_argument_not_unknown(env: dict[str, Any]) -> None:
    """A datasets attribute or a Secret's options nested 100,000 deep raised
    RecursionError out of the servicer (UNKNOWN); over its byte limit it was parsed whole."""
    from dsagent.nodeplugins.csi.volumes import SECRET_OPTIONS_MAX_BYTES
    from dsplatform.wire.csivolume import ATTRIBUTE_MAX_BYTES

    _, client = start(env)
    pods: Path = env["settings"].csi_kubelet_pods_dir
    uid = "0f6c2d35-0a1b-4c5d-8e9f-0123456789ab"
    good = pods / uid / "volumes" / "kubernetes.io~csi" / "datasets" / "mount"
    good.parent.mkdir(parents=True)
    datasets = [{"name": "imagenet", "source": "s3://bucket/imagenet", "secretKey": "creds"}]
    ctx = context(uid, datasets)
    deep = "[" * 100_000 + "]" * 100_000
    cases: list[tuple[str, dict[str, str], dict[str, str], str]] = [
        ("deep attribute", {**ctx, "datasets": deep}, {}, "nested deeper"),
        ("big attribute", {**ctx, "datasets": "[" + " " * ATTRIBUTE_MAX_BYTES + "]"}, {}, "over"),
        ("deep secret", ctx, {"creds": '{"a":' * 5_000 + "1" + "}" * 5_000}, "nested deeper"),
        ("big secret", ctx, {"creds": '{"key":"' + "s" * SECRET_OPTIONS_MAX_BYTES + '"}'}, "over"),
    ]
    for why, volume_context, secrets, reason in cases:
        with pytest.raises(grpc.RpcError) as caught:
            client.publish("csi-0123", str(good), volume_context, secrets=secrets)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (why, caught.value.details())
        assert reason in (caught.value.details() or ""), (why, caught.value.details())
        assert "sss" not in (caught.value.details() or "")
    assert not good.exists()


# -- with real bind mounts ----------------------------------------------------------------


def test_publish_returns_at_once_then_the_pod_sees_its_datasets_and_nothing_else(
    env: dict[str, Any], kubelet: Kubelet
) -> None:
    agent, client = start(env)
    server: LoopbackServer = env["server"]
    _, mine, manifest = packed(env["www"], server.url, "imagenet", files=12, max_files=4)
    _, theirs, _ = packed(env["www"], server.url, "coco", files=6, seed=1, max_files=4)
    server.slow_down(lambda p: p.startswith("/store/bundles/"), 0.5)
    # another pod on the node caches coco: our pod must not see it
    other_uid, other_volume, other_target = kubelet.pod()
    client.publish(other_volume, other_target, context(other_uid, [theirs], name="other"))

    uid, volume, target = kubelet.pod()
    started = time.monotonic()
    client.publish(volume, target, context(uid, [mine]))
    returned = time.monotonic() - started
    container = kubelet.container_view(target)  # the container starts while caching runs
    assert returned < 0.5, returned
    assert not (container / "ready").exists()
    assert sorted(os.listdir(container / "datasets")) == ["imagenet"]
    assert os.listdir(container / "datasets" / "imagenet") == []
    assert json.loads((container / "status.json").read_text())["task"] == uid

    wait_for(lambda: (container / "ready").exists())
    cached = time.monotonic() - started
    assert cached > returned
    verify_tree(container / "datasets" / "imagenet", manifest)  # every file, digest-checked, through the pod's mount
    status = json.loads((container / "status.json").read_text())
    assert status["state"] == "ready" and [d["name"] for d in status["datasets"]] == ["imagenet"]
    assert status["datasets"][0]["digest"] == manifest.digest
    # the pod's view: its datasets, its status, its marks; no catalog, no other dataset, no other task
    assert sorted(os.listdir(container)) == ["datasets", "ready", "status.json"]
    assert "coco" not in json.dumps(status) and other_uid not in json.dumps(status)
    # read-only all the way down
    for path in (container / "x", container / "datasets" / "imagenet" / "x"):
        with pytest.raises(OSError) as refused:
            path.write_bytes(b"x")
        assert refused.value.errno == errno.EROFS

    # the kubelet repeats calls: publish again is a no-op (no second mount)
    before = len(mounts_under(target))
    client.publish(volume, target, context(uid, [mine]))
    assert len(mounts_under(target)) == before == 2
    # the same volume id at another target is refused
    _, _, elsewhere = kubelet.pod()
    with pytest.raises(grpc.RpcError) as caught:
        client.publish(volume, elsewhere, context(elsewhere.parts[-5], [mine]))
    assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS

    client.unpublish(volume, target)
    assert mounts_under(target) == [] and not target.exists()
    assert not (env["settings"].root / "csi" / "views" / volume).exists()
    with pytest.raises(NotFound):
        agent.call(agent.service.get_task(uid))  # released: its versions may be evicted now
    client.unpublish(volume, target)  # idempotent
    # the version itself is intact in the cache
    assert (env["settings"].root / "datasets" / "imagenet" / manifest.digest).is_dir()

    # repeat: a new pod for the same dataset is served from the cache, at once ready
    uid2, volume2, target2 = kubelet.pod()
    client.publish(volume2, target2, context(uid2, [mine], name="trainer-1"))
    container2 = kubelet.container_view(target2)
    wait_for(lambda: (container2 / "ready").exists(), timeout=5)
    assert len(os.listdir(container2 / "datasets" / "imagenet")) > 0
    client.unpublish(volume2, target2)
    client.unpublish(other_volume, other_target)
    assert mounts_under(kubelet.pods) == [str(kubelet.pods)]


def test_unpublish_touches_only_what_that_volume_id_published_at_that_target(
    env: dict[str, Any], kubelet: Kubelet
) -> None:
    """An unknown volume id at another pod's target unmounted that pod's
    volume, and a known id at a wrong target stopped its lease renewal."""
    agent, client = start(env)
    _, mine, _ = packed(env["www"], env["server"].url, "imagenet", files=6, max_files=3)
    uid, volume, target = kubelet.pod()
    client.publish(volume, target, context(uid, [mine]))
    container = kubelet.container_view(target)
    wait_for(lambda: (container / "ready").exists())
    mounted = mounts_under(target)
    assert len(mounted) == 2

    # an id this node never published, at that pod's target: OK, and nothing changes
    client.unpublish("csi-0123456789abcdef", target)
    # that pod's own id at another pod's target: refused, and nothing changes
    _, _, elsewhere = kubelet.pod()
    elsewhere.mkdir(parents=True, exist_ok=True)
    with pytest.raises(grpc.RpcError) as caught:
        client.unpublish(volume, elsewhere)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert mounts_under(target) == mounted
    assert (container / "ready").exists()
    watcher = agent.driver._published[volume].watcher
    assert watcher is not None and not watcher.done(), "the volume's lease renewal stopped"
    assert agent.call(agent.service.get_task(uid)).state == "ready"

    client.unpublish(volume, target)
    assert mounts_under(target) == []


def test_an_agent_restart_keeps_published_volumes_and_a_publish_while_down_succeeds_on_retry(
    env: dict[str, Any], kubelet: Kubelet
) -> None:
    agent, client = start(env)
    server: LoopbackServer = env["server"]
    _, dataset, manifest = packed(env["www"], server.url, "imagenet", files=12, max_files=2)
    server.slow_down(lambda p: p.startswith("/store/bundles/"), 0.4)
    uid, volume, target = kubelet.pod()
    client.publish(volume, target, context(uid, [dataset]))
    container = kubelet.container_view(target)
    agent.stop()  # mid-fetch, like a DaemonSet rollout
    del env["agent"]
    assert not (container / "ready").exists()

    # the kubelet publishes another pod's volume while the agent is down: UNAVAILABLE, retried
    uid2, volume2, target2 = kubelet.pod()
    with pytest.raises(grpc.RpcError) as caught:
        client.publish(volume2, target2, context(uid2, [dataset], name="trainer-1"), timeout=1)
    assert caught.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

    agent, client = start(env)  # recovers the record, re-submits the task, watches it
    wait_for(lambda: (container / "ready").exists())
    assert json.loads((container / "status.json").read_text())["datasets"][0]["digest"] == manifest.digest
    assert len(list((container / "datasets" / "imagenet").rglob("*"))) > 0
    client.publish(volume2, target2, context(uid2, [dataset], name="trainer-1"))  # the kubelet's retry
    container2 = kubelet.container_view(target2)
    wait_for(lambda: (container2 / "ready").exists())

    # a second restart after everything is ready: the binds are found, not stacked
    before = sorted(mounts_under(target))
    agent.stop()
    del env["agent"]
    agent, client = start(env)
    assert sorted(mounts_under(target)) == before
    for vol, tgt in ((volume, target), (volume2, target2)):
        client.unpublish(vol, tgt)
        assert mounts_under(tgt) == []


def test_a_volume_whose_pod_vanished_while_the_agent_was_down_is_cleaned_up_at_start(
    env: dict[str, Any], kubelet: Kubelet
) -> None:
    agent, client = start(env)
    server: LoopbackServer = env["server"]
    _, dataset, _ = packed(env["www"], server.url, "imagenet", files=4)
    uid, volume, target = kubelet.pod()
    client.publish(volume, target, context(uid, [dataset]))
    agent.stop()
    del env["agent"]
    # the kubelet tore the pod down by force (umount -R, rm -r of the pod dir)
    os.system(f"umount -R -l {target}")
    import shutil

    shutil.rmtree(kubelet.pods / uid)
    agent, client = start(env)
    assert not (env["settings"].root / "csi" / "volumes" / f"{volume}.json").exists()
    with pytest.raises(NotFound):
        agent.call(agent.service.get_task(uid))


@pytest.mark.slow
def test_dsagent_serve_serves_the_csi_plugin_when_its_socket_is_set(tmp_path: Path, sockets: Path) -> None:
    import signal
    import subprocess
    import sys

    socket = sockets / DRIVER / "csi.sock"
    env = {
        **os.environ,
        "DSAGENT_CSI_SOCKET": str(socket),
        "DSAGENT_CSI_KUBELET_PODS_DIR": str(tmp_path / "pods"),
        "DSAGENT_NODE_NAME": "gpu-node-9",
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dsagent",
            "serve",
            "--root",
            str(tmp_path / "root"),
            "--socket",
            str(sockets / "api.sock"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(socket.exists, timeout=60)
        client = CsiClient(socket)
        try:
            assert client.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest(), timeout=10).name == DRIVER
            assert client.identity.Probe(csi_pb2.ProbeRequest(), timeout=10).ready.value is True
            assert client.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=10).node_id == "gpu-node-9"
        finally:
            client.close()
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    # uvicorn re-raises the SIGTERM it handled once shutdown is complete
    assert process.returncode in (0, -signal.SIGTERM), err.decode()[-2000:]
    assert "Application shutdown complete" in err.decode() and "Traceback" not in err.decode()


def test_the_watcher_renews_and_retries_through_the_service_never_submitting_again(
    env: dict[str, Any], kubelet: Kubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The volume's watcher follows its task by waiting on the service: the lease is
    renewed by ``renew_task`` and a failed dataset is started again by ``retry_failed``;
    the whole task is never submitted a second time."""
    from dsagent.nodeplugins.csi import driver as csi_driver

    monkeypatch.setattr(csi_driver, "RETRY_SECONDS", 0.5)
    env["settings"] = env["settings"].model_copy(update={"lease_ttl": 3.0})
    agent, client = start(env)
    www: Path = env["www"]
    _, mine, manifest = packed(www, env["server"].url, "imagenet", files=6, max_files=3)
    bundles = sorted((www / "store" / "bundles").iterdir())
    hidden = bundles[0].with_name("hidden")
    bundles[0].rename(hidden)  # the store lacks a bundle: the dataset fails at first
    submitted: list[str] = []
    real_submit = agent.service.submit_task

    async def counting_submit(task_id: str, *args: Any, **kwargs: Any) -> Any:
        submitted.append(task_id)
        return await real_submit(task_id, *args, **kwargs)

    agent.service.submit_task = counting_submit  # type: ignore[method-assign]
    uid, volume, target = kubelet.pod()
    client.publish(volume, target, context(uid, [mine]))
    assert submitted == [uid]  # the publish itself
    wait_for(lambda: agent.call(agent.service.get_task(uid)).state == "failed")
    hidden.rename(bundles[0])  # the store is whole again: the watcher's retry caches it
    container = kubelet.container_view(target)
    wait_for(lambda: (container / "ready").exists())
    verify_tree(container / "datasets" / "imagenet", manifest)
    lease = agent.call(agent.service.get_task(uid)).lease_until
    wait_for(lambda: agent.call(agent.service.get_task(uid)).lease_until > lease, timeout=10)
    assert submitted == [uid], "the watcher submitted the task again"
    client.unpublish(volume, target)
