"""A CSI volume that shows this node's share of a striped version (docs/design-striping.md#csi).

The real node plugin over gRPC on a unix socket, real bind mounts (skipped, with the reason,
where this process cannot mount), a real share filled from a bundle store on loopback HTTP.
The pod's view holds the share's files and its layout file, never a whole tree; the
agent's socket is bound beside them for the reader; the ready mark waits for the share's
first bundles; a volume of shares only has no task.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dsagent.errors import NotFound
from dsplatform.stripe import LAYOUT_FILE, StripeLayout
from tests.dsagent.cli.test_agent_process import packed
from tests.dsagent.nodeplugins.csi.harness import Kubelet, context
from tests.dsagent.nodeplugins.csi.test_csi import env, kubelet, mounts_under, sockets, start, wait_for

__all__ = ["env", "kubelet", "sockets"]  # the fixtures, shared with test_csi.py

NODE, OTHER = "gpu-node-7", "gpu-node-8"


@pytest.fixture
def api_socket(env: dict[str, Any]) -> Iterator[Path]:
    """Something listening on the agent's socket path (the HTTP API is not what this test
    reads): it answers every connection with one line, so a connect through the pod's
    bind can be told from a stale file."""
    path: Path = env["settings"].socket
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"agent\n")

    threading.Thread(target=answer, daemon=True).start()
    yield path
    server.close()


def _stripe_context(uid: str, dataset: dict[str, Any], digest: str) -> dict[str, str]:
    ctx = context(uid, [{**dataset, "stripe": digest}])
    ctx["version"] = "2"
    return ctx


def test_the_volume_shows_this_nodes_share_and_the_agents_socket_and_no_whole_tree(
    env: dict[str, Any], kubelet: Kubelet, api_socket: Path
) -> None:
    agent, client = start(env)
    _, web, manifest = packed(env["www"], env["server"].url, "web", files=24, max_files=2)
    uid, volume, target = kubelet.pod()
    client.publish(volume, target, _stripe_context(uid, web, manifest.digest))
    container = kubelet.container_view(target)
    with pytest.raises(NotFound):
        agent.call(agent.service.get_task(uid))  # shares only: no task, no whole copy asked for
    # the node holds no share yet: the pod waits, and its status says why
    wait_for(lambda: "stripes" in json.loads((container / "status.json").read_text()))
    status = json.loads((container / "status.json").read_text())
    assert status["state"] == "pending" and status["stripes"][0]["state"] == "waiting", status
    assert not (container / "ready").exists()

    # the controller holds the share on the group's members, this node among them
    agent.call(agent.service.stripes.hold("web", web["bundles"], [NODE, OTHER], {}, ready_after=1))
    wait_for(lambda: (container / "ready").exists())
    wait_for(lambda: json.loads((container / "status.json").read_text())["stripes"][0]["state"] == "complete")
    share = json.loads((container / "status.json").read_text())["stripes"][0]
    shown = container / "datasets" / "web"
    with open(shown / LAYOUT_FILE, "rb") as stream:
        layout = StripeLayout.load(stream)
    assert layout.digest == manifest.digest and list(layout.members) == [NODE, OTHER]
    owned = {b.digest for b in layout.held_by(NODE)}
    assert share["bundles"] == share["bundlesDone"] == len(owned) > 0
    # the share's files, and no other member's: a share, never a whole tree
    for ref in manifest.bundles:
        for entry in manifest.entries[ref.first : ref.first + ref.count]:
            assert (shown / entry.path).exists() == (ref.digest in owned), entry.path
    assert len(owned) < len(manifest.bundles), "the other member owns none: the test would not tell a share"
    # the agent's socket, reachable from the pod's read-only view
    assert (container / "agent.sock").is_socket()
    short = api_socket.parent / "pod-view"  # a pod's path is short (/dsagent-run/agent.sock); pytest's is not
    short.symlink_to(container)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(short / "agent.sock"))
        assert conn.recv(16) == b"agent\n"
    for path in (container / "x", shown / "x"):
        with pytest.raises(OSError) as refused:
            path.write_bytes(b"x")
        assert refused.value.errno == errno.EROFS

    client.unpublish(volume, target)
    assert mounts_under(target) == [] and not target.exists()
    assert agent.service.stripes.status(("web", manifest.digest))[
        "complete"
    ]  # the group's share (its lease), not the pod's


def test_a_share_volume_needs_the_agents_socket_and_a_version_digest(env: dict[str, Any], kubelet: Kubelet) -> None:
    """Published before the agent's API listens, a share volume is UNAVAILABLE (the kubelet
    retries); a stripe entry that is no digest is INVALID_ARGUMENT; neither mounts anything."""
    _, client = start(env)
    _, web, manifest = packed(env["www"], env["server"].url, "web", files=4, max_files=2)
    uid, volume, target = kubelet.pod()
    with pytest.raises(grpc.RpcError) as caught:
        client.publish(volume, target, _stripe_context(uid, web, manifest.digest))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    bad = _stripe_context(uid, web, manifest.digest)
    bad["datasets"] = bad["datasets"].replace(manifest.digest, "../" + manifest.digest[3:])
    with pytest.raises(grpc.RpcError) as caught:
        client.publish(volume, target, bad)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert mounts_under(target) == [] and not os.path.exists(target)


@pytest.mark.slow
def test_the_reader_reads_every_sample_through_a_real_agent_process_in_the_volume(
    env: dict[str, Any], kubelet: Kubelet, sockets: Path
) -> None:
    """End to end: ``dsagent serve`` with its CSI plugin (a process of its own), the share
    volume published over gRPC, the share held as the controller holds it, then the reader
    in the pod's view: its node's bundles from the volume, the other member's through the
    agent's socket bound in it (that member is not there: its bundles come through this
    agent's window, from the store). Every sample once, each with its file's bytes."""
    import signal
    import subprocess
    import sys

    import httpx

    from dsplatform.data import StripedDataset
    from tests.dsagent.nodeplugins.csi.harness import DRIVER, CsiClient

    source, web, manifest = packed(env["www"], env["server"].url, "web", files=24, max_files=2)
    api = sockets / "api.sock"
    csi = sockets / DRIVER / "csi.sock"
    process = subprocess.Popen(
        [sys.executable, "-m", "dsagent", "serve", "--root", str(env["tmp"] / "root"), "--socket", str(api)],
        env={
            **os.environ,
            "DSAGENT_CSI_SOCKET": str(csi),
            "DSAGENT_CSI_KUBELET_PODS_DIR": str(kubelet.pods),
            "DSAGENT_NODE_NAME": NODE,
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    client = None
    try:
        wait_for(lambda: csi.exists() and api.exists(), timeout=60)
        client = CsiClient(csi)
        uid, volume, target = kubelet.pod()
        client.publish(volume, target, _stripe_context(uid, web, manifest.digest))
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(api)), base_url="http://agent", timeout=60) as http:
            held = http.put("/v1/stripes/web", json={"store": web["bundles"], "members": [NODE, OTHER], "peers": {}})
        assert held.status_code == 200, held.text
        container = kubelet.container_view(target)
        wait_for(lambda: (container / "ready").exists(), timeout=60)
        view = sockets / "pod"  # a pod's path is short (/dsagent-run/agent.sock); pytest's is not
        view.symlink_to(container)
        shown = view / "datasets" / "web"
        with open(shown / LAYOUT_FILE, "rb") as stream:
            layout = StripeLayout.load(stream)
        assert 0 < len(layout.held_by(NODE)) < len(manifest.bundles), "the test needs bundles on both sides"

        reader = StripedDataset(shown, rank=0, world_size=1, agent=f"unix://{view / 'agent.sock'}")
        got = {sample.path: sample.data for sample in reader}
        assert got == {p.relative_to(source).as_posix(): p.read_bytes() for p in source.rglob("*") if p.is_file()}
        assert reader.stats["local_bytes"] > 0 and reader.stats["agent_bytes"] > 0, reader.stats
        client.unpublish(volume, target)
        assert mounts_under(target) == []
    finally:
        if client is not None:
            client.close()
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert "Traceback" not in err.decode(), err.decode()[-3000:]
