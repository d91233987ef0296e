"""Streams of striped bundles to a node's readers: one caller cannot keep the others from reading.

A real ``dsagent serve`` on its unix socket, a member of a two-node group that owns no
bundle, so that every bundle its readers ask for goes through its window (fetched from the
store over loopback HTTP). The test process is each pod in turn: the agent reads who a
connection is from its fake ``/proc`` when the connection is accepted (as in
``tests/dsagent/api/test_pod_rights.py``). The attacker opens bundle streams on raw sockets
and never reads them; the reader beside it must get every bundle it asks for.
"""

from __future__ import annotations

import asyncio
import os
import socket
import tarfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest

from dsagent.cache.settings import Settings
from dsagent.cache.striped.readerstreams import ReaderBusy, ReaderStreams
from dsagent.format.bundles.bundle import pack
from dsagent.format.manifest import Manifest
from tests.dsagent.api.test_pod_rights import fake_proc, pod_cgroup, unix_client
from tests.dsagent.conftest import write_tree
from tools.support.harness import ADMIN_TOKEN, LoopbackServer, allocated

NODE = "node-a"
ATTACKER = "aaaaaaaa-0000-4000-8000-000000000001"
READER = "bbbbbbbb-0000-4000-8000-000000000002"
FILE_BYTES = 512 << 10  # the largest bundles hold four: far more than the socket buffers hold unread


def _store(www: Path) -> Manifest:
    """24 files in bundles of one to four (the plan is fixed by the paths): three of 2 MiB."""
    files = {f"f{i:02d}.bin": os.urandom(FILE_BYTES) for i in range(24)}
    write_tree(www / "src", files)
    return pack(www / "src", www / "store", name="imgs", max_files=4)


def _unread_stream(agent: Any, route: str) -> tuple[socket.socket, int]:
    """A GET of ``route`` on its own connection whose answer is never read past its status
    line and headers (a reader that went quiet): the socket and the status."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(60)
    sock.connect(str(agent.socket))
    sock.sendall(f"GET {route} HTTP/1.1\r\nHost: agent\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        assert byte, head
        head += byte
    return sock, int(head.split()[1])


def _closed_by_the_agent(sock: socket.socket, timeout: float) -> bool:
    """Whether the agent ends the connection within ``timeout`` (what it had sent is drained)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(1 << 20):
            pass
    except (ConnectionResetError, TimeoutError):
        return False
    return True


class _Node:
    def __init__(self, agent: Any, manifest: Manifest, proc: Path, store: str) -> None:
        self.agent, self.manifest, self.proc, self.store = agent, manifest, proc, store
        largest = max(b.size for b in manifest.bundles)
        self.big = [i for i, b in enumerate(manifest.bundles) if b.size == largest]
        self.middle = next(i for i, b in enumerate(manifest.bundles) if largest // 2 < b.size < largest)
        assert len(self.big) == 3, [b.size for b in manifest.bundles]

    def route(self, index: int) -> str:
        return f"/v1/stripes/imgs/{self.manifest.digest}/bundles/{self.manifest.bundles[index].digest}"

    def be(self, pod: str) -> None:
        """The next connection to the agent is ``pod``'s."""
        fake_proc(self.proc, os.getpid(), pod_cgroup(pod))

    def names(self, index: int) -> list[str]:
        return [e.path for e in self.manifest.bundle_entries(self.manifest.bundles[index])]


def _node(agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], tmp_path: Path, **env: str) -> _Node:
    """An agent whose window holds three and a half of the largest bundles, and both pods'
    tasks naming the version's bundle store (what lets a pod read it)."""
    www, url, _ = loopback
    manifest = _store(www)
    bundle_disk = max(allocated(b.size, b.count, tmp_path) for b in manifest.bundles)
    proc = tmp_path / "proc"
    fake_proc(proc, os.getpid(), pod_cgroup(ATTACKER))
    agent = agent_factory(
        env={
            "DSAGENT_PROC_ROOT": str(proc),
            "DSAGENT_NODE_NAME": NODE,
            "DSAGENT_STRIPE_WINDOW": str(bundle_disk * 7 // 2),
            **env,
        }
    )
    node = _Node(agent, manifest, proc, f"{url}/store")
    with unix_client(agent, ADMIN_TOKEN) as operator:
        held = operator.put(
            "/v1/stripes/imgs", json={"store": node.store, "members": [NODE, "node-b"], "noShare": [NODE]}
        )
        assert held.status_code == 200, held.text
    dataset = {"name": "imgs", "source": "memory://stripe-readers/none", "bundles": node.store}
    for pod in (ATTACKER, READER):
        node.be(pod)
        with unix_client(agent) as client:
            assert client.put(f"/v1/tasks/{pod}", json={"datasets": [dataset]}).status_code == 200
    return node


def _read_whole(node: _Node, index: int) -> list[str]:
    with unix_client(node.agent) as client:
        answer = client.get(node.route(index))
    assert answer.status_code == 200, (answer.status_code, answer.text)
    with tarfile.open(fileobj=BytesIO(answer.content)) as tar:
        return tar.getnames()


def test_a_pod_holding_streams_it_never_reads_leaves_room_for_another_pod(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], tmp_path: Path
) -> None:
    """The attacker asks for the three largest bundles and reads none: the window (three and
    a half of them) would be all its own. It holds at most half of it (one of them); its next
    streams wait for its own and are refused (429), and the other pod reads every bundle it
    asks for."""
    node = _node(agent_factory, loopback, tmp_path, DSAGENT_PEER_WAIT="2s")
    node.be(ATTACKER)
    held = [_unread_stream(node.agent, node.route(i)) for i in node.big]
    try:
        assert [status for _, status in held] == [200, 429, 429]
        node.be(READER)
        for index in (node.middle, *node.big):  # fetched beside the attacker's bundle, and the one it pins
            assert _read_whole(node, index) == node.names(index)
    finally:
        for sock, _ in held:
            sock.close()


def test_a_stream_left_unread_is_closed_and_its_bundle_let_go(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], tmp_path: Path
) -> None:
    """Without a share bound (one caller may pin the whole window), the idle deadline alone
    frees the window: the attacker's unread streams are cut after a second, and the reader
    waiting for room gets its bundle."""
    node = _node(
        agent_factory,
        loopback,
        tmp_path,
        DSAGENT_PEER_WAIT="15s",
        DSAGENT_STRIPE_CALLER_WINDOW="1",
        DSAGENT_STRIPE_STREAM_IDLE="1s",
    )
    node.be(ATTACKER)
    held = [_unread_stream(node.agent, node.route(i)) for i in node.big]
    try:
        assert [status for _, status in held] == [200] * 3  # the window is all the attacker's
        node.be(READER)
        started = time.monotonic()
        assert _read_whole(node, node.middle) == node.names(node.middle)
        assert time.monotonic() - started < 10
        for sock, _ in held:
            assert _closed_by_the_agent(sock, timeout=10)
    finally:
        for sock, _ in held:
            sock.close()


# -- the bounds themselves, on one event loop ---------------------------------------------------


def _streams(tmp_path: Path, **settings: Any) -> ReaderStreams:
    values: dict[str, Any] = {"stripe_window_bytes": 1000, "peer_wait": 0.2, **settings}
    return ReaderStreams(Settings(root=tmp_path, **values))


def test_a_callers_streams_and_window_bytes_are_bounded_and_its_waits_too(tmp_path: Path) -> None:
    async def scenario() -> None:
        streams = _streams(tmp_path, stripe_caller_streams=3, stripe_caller_window=0.5)
        first = await streams.admit("pod-a", 900)  # a caller pinning nothing may pin one bundle, whatever its size
        with pytest.raises(ReaderBusy) as refused:
            await streams.admit("pod-a", 100)  # past its half of the window
        assert refused.value.http_status == 429 and "DSAGENT_STRIPE_CALLER_WINDOW" in refused.value.message
        other = await streams.admit("pod-b", 400)  # another caller is not held back by pod-a
        local = [await streams.admit("pod-b", 0) for _ in range(2)]  # share bundles pin no window
        with pytest.raises(ReaderBusy, match="DSAGENT_STRIPE_CALLER_STREAMS"):
            await streams.admit("pod-b", 0)
        # a wait ends when one of the caller's own streams ends
        waiting = asyncio.ensure_future(streams.admit("pod-a", 100))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        first.close()
        assert (await waiting).caller == "pod-a"
        for stream in (other, *local):
            stream.close()
        assert streams.held("pod-b") == (0, 0)

    asyncio.run(scenario())


def test_a_stream_its_reader_stopped_reading_is_cut_and_let_go(tmp_path: Path) -> None:
    async def scenario() -> None:
        streams = _streams(tmp_path, stripe_stream_idle=0.2)
        released: list[str] = []
        cut: list[str] = []
        read = await streams.admit("pod-a", 100)
        read.holding(lambda: released.append("read"))
        read.start(cut=lambda: cut.append("read"))
        quiet = await streams.admit("pod-a", 100)
        quiet.holding(lambda: released.append("quiet"))
        quiet.start(cut=lambda: cut.append("quiet"))
        for _ in range(6):  # 0.3 s: one reader takes a chunk every 0.05 s, the other none
            await asyncio.sleep(0.05)
            read.read()
        assert (cut, released) == (["quiet"], ["quiet"]) and quiet.closed and quiet.cut_idle
        assert streams.held("pod-a") == (1, 100)
        read.close()
        read.close()  # once only
        assert released == ["quiet", "read"] and streams.held("pod-a") == (0, 0)

    asyncio.run(scenario())
