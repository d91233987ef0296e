"""A share's life on one real agent: leased like a task, released on request, counted in the
cache's space and evicted in the design's order, and read only by the pods that ask for it.

A real ``dsagent serve`` on its unix socket and a bundle store served over loopback HTTP; the
test process is also a pod of the node (its cgroup names a kubepods pod UID, as in
``tests/dsagent/api/test_pod_rights.py``), so the agent identifies it with ``SO_PEERCRED``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from dsagent.cache.striped.sharerecords import HOLD_FILE
from dsagent.format.bundles.bundle import pack
from dsagent.format.manifest import Manifest
from tests.dsagent.api.test_pod_rights import POD, fake_proc, pod_cgroup, unix_client
from tests.dsagent.cli.test_agent_process import packed
from tests.dsagent.conftest import write_tree
from tools.support.fake_apiserver import FakeApiServer, make_dataset, make_node, make_pod
from tools.support.harness import ADMIN_TOKEN, LoopbackServer, allocated, eventually, wait_ready

NODE = "node-a"


def _store(www: Path, name: str = "imgs", count: int = 24) -> Manifest:
    files = {f"d{i % 3}/f{i:03d}.bin": os.urandom(3000 + 97 * i) for i in range(count)}
    write_tree(www / f"src-{name}", files)
    return pack(www / f"src-{name}", www / "store", name=name, max_files=4)


def _hold(client: httpx.Client, url: str, **extra: Any) -> httpx.Response:
    return client.put("/v1/stripes/imgs", json={"store": f"{url}/store", "members": [NODE], **extra})


def _wait_complete(client: httpx.Client, digest: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        status = client.get(f"/v1/stripes/imgs/{digest}").json()
        if status.get("complete") or time.monotonic() > deadline:
            return dict(status)
        time.sleep(0.05)


def _bundle_names(client: httpx.Client, manifest: Manifest, bundle: Any) -> list[str]:
    """The files of ``bundle`` as the stripe route answers them (a plain tar), in order."""
    answer = client.get(f"/v1/stripes/imgs/{manifest.digest}/bundles/{bundle.digest}")
    assert answer.status_code == 200, answer.text
    with tarfile.open(fileobj=BytesIO(answer.content)) as tar:
        return tar.getnames()


def _pod_agent(agent_factory: Any, tmp_path: Path, **env: str) -> Any:
    cgroup = f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/cri-containerd-abc.scope\n"
    proc = fake_proc(tmp_path / "proc", os.getpid(), cgroup)
    return agent_factory(env={"DSAGENT_PROC_ROOT": str(proc), "DSAGENT_NODE_NAME": NODE, **env})


class _Imgs(NamedTuple):
    """The version ``imgs`` in a loopback store, and a pod agent of the node to hold it."""

    manifest: Manifest
    url: str
    server: LoopbackServer
    agent: Any


@pytest.fixture
def imgs(agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], tmp_path: Path) -> _Imgs:
    www, url, server = loopback
    return _Imgs(_store(www), url, server, _pod_agent(agent_factory, tmp_path))


def test_a_pod_reads_only_the_stripes_its_own_task_names(imgs: _Imgs) -> None:
    manifest, url, _, agent = imgs
    bundle = manifest.bundles[0]
    route = f"/v1/stripes/imgs/{manifest.digest}/bundles/{bundle.digest}"
    with unix_client(agent) as pod, unix_client(agent, ADMIN_TOKEN) as operator:
        assert _hold(operator, url).status_code == 200
        _wait_complete(operator, manifest.digest)
        # a pod without a task, then with a task naming another dataset: refused
        refused = pod.get(route)
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden", refused.text
        other = {"name": "other", "source": "memory://stripe-lease/none"}
        assert pod.put(f"/v1/tasks/{POD}", json={"datasets": [other]}).status_code == 200
        assert pod.get(route).status_code == 403
        assert pod.delete(f"/v1/tasks/{POD}").status_code == 200
        # the name alone, with a source that never answers (any pod may name any dataset): refused
        named = {"name": "imgs", "source": "memory://stripe-lease/none"}
        assert pod.put(f"/v1/tasks/{POD}", json={"datasets": [named]}).status_code == 200
        refused = pod.get(route)
        assert refused.status_code == 403 and "another bundle store" in refused.json()["message"], refused.text
        assert pod.delete(f"/v1/tasks/{POD}").status_code == 200
        # its own task names the version's bundle store: the bundle's files, as a plain tar
        mine = {"name": "imgs", "source": "memory://stripe-lease/none", "bundles": f"{url}/store/"}
        assert pod.put(f"/v1/tasks/{POD}", json={"datasets": [mine]}).status_code == 200
        assert _bundle_names(pod, manifest, bundle) == [e.path for e in manifest.bundle_entries(bundle)]
        # a pod neither holds nor releases a share: operators do
        assert _hold(pod, url).status_code == 403
        assert pod.delete("/v1/stripes/imgs").status_code == 403
        assert operator.get(route).status_code == 200  # operators read any


def test_a_share_held_for_a_dataset_is_read_by_no_pod_whose_namespace_is_unknown(imgs: _Imgs) -> None:
    """The controller holds a share for its Dataset (``X-Dsagent-For``): only pods of that
    namespace read it. Outside cluster mode the agent cannot tell a pod's namespace, so even
    a pod naming the version's own bundle store reads nothing of it; operators still do."""
    manifest, url, _, agent = imgs
    route = f"/v1/stripes/imgs/{manifest.digest}/bundles/{manifest.bundles[0].digest}"
    with unix_client(agent) as pod, unix_client(agent, ADMIN_TOKEN) as operator:
        held = operator.put(
            "/v1/stripes/imgs",
            json={"store": f"{url}/store", "members": [NODE]},
            headers={"X-Dsagent-For": "team-a/imgs"},
        )
        assert held.status_code == 200, held.text
        _wait_complete(operator, manifest.digest)
        mine = {"name": "imgs", "source": "memory://stripe-lease/none", "bundles": f"{url}/store"}
        assert pod.put(f"/v1/tasks/{POD}", json={"datasets": [mine]}).status_code == 200
        refused = pod.get(route)
        assert refused.status_code == 403, refused.text
        assert "belongs to a namespace" in refused.json()["message"], refused.text
        assert operator.get(route).status_code == 200


def test_a_pod_reads_the_striped_versions_of_its_own_namespace_only(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], apiserver: FakeApiServer, tmp_path: Path
) -> None:
    """Two namespaces, one dataset name: team-a's Dataset ``imgs`` is striped on the node. A
    pod of team-b whose annotation (so its task) names ``imgs``, even with team-a's bundle
    store, reads none of its bundles (403 with the reason); team-a's pod, wired for the
    Dataset by its name alone, reads them."""
    www, url, _ = loopback
    manifest = _store(www)
    store = f"{url}/store"
    apiserver.create(make_node(NODE))
    status = {"digest": manifest.digest, "bundles": len(manifest.bundles), "files": 24, "bytes": manifest.total_bytes}
    dataset = make_dataset("imgs", namespace="team-a", source="memory://stripe-lease/src", bundles=store, status=status)
    dataset["spec"].update({"stripe": "auto", "startBeforeWhole": True})
    apiserver.create(dataset)
    reader = apiserver.create(
        make_pod("reader", namespace="team-a", node_name=NODE, annotations={"dsagent.io/datasets": "imgs"})
    )["metadata"]["uid"]
    theirs = json.dumps([{"name": "imgs", "source": "memory://stripe-lease/none", "bundles": store}])
    thief = apiserver.create(
        make_pod("thief", namespace="team-b", node_name=NODE, annotations={"dsagent.io/datasets": theirs})
    )["metadata"]["uid"]
    proc = fake_proc(tmp_path / "proc", os.getpid(), pod_cgroup(reader))
    agent = agent_factory(
        env={
            "DSAGENT_PROC_ROOT": str(proc),
            "DSAGENT_NODE_NAME": NODE,
            "DSAGENT_KUBERNETES": "1",
            "KUBECONFIG": str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")),
            "DSAGENT_RESERVE": "0",
            "DSAGENT_NODEFS_AVAILABLE": "0",
        }
    )
    route = f"/v1/stripes/imgs/{manifest.digest}/bundles/{manifest.bundles[0].digest}"
    with unix_client(agent, ADMIN_TOKEN) as operator:
        held = operator.put(
            "/v1/stripes/imgs", json={"store": store, "members": [NODE]}, headers={"X-Dsagent-For": "team-a/imgs"}
        )
        assert held.status_code == 200, held.text
        _wait_complete(operator, manifest.digest)
    with unix_client(agent) as pod:  # team-a's pod, once the agent's pod watch has it
        deadline = time.monotonic() + 30
        while (answer := pod.get(route)).status_code != 200:
            assert answer.status_code == 403 and time.monotonic() < deadline, answer.text
            time.sleep(0.1)
    fake_proc(proc, os.getpid(), pod_cgroup(thief))  # the next connection is team-b's pod
    with unix_client(agent) as pod:
        deadline = time.monotonic() + 30
        while pod.get(f"/v1/tasks/{thief}").status_code != 200:  # the agent made its task from its annotation
            assert time.monotonic() < deadline, "the team-b pod got no task"
            time.sleep(0.1)
        refused = pod.get(route)
        assert refused.status_code == 403, refused.text
        assert refused.json()["message"] == (
            f"the share of imgs@{manifest.digest[:12]} belongs to another namespace than this pod's (team-b)"
        )


def test_a_share_not_held_again_within_its_lease_is_dropped(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], tmp_path: Path
) -> None:
    www, url, _ = loopback
    manifest = _store(www)
    agent = _pod_agent(agent_factory, tmp_path, DSAGENT_SWEEP_INTERVAL="0.2")
    share = agent.root / "stripes" / "imgs" / manifest.digest
    with unix_client(agent, ADMIN_TOKEN) as operator:
        assert _hold(operator, url, leaseSeconds=1.5).status_code == 200
        assert _wait_complete(operator, manifest.digest)["complete"]
        # renewed (asked again) every 0.3 s for 3 s: twice its lease, still held
        until = time.monotonic() + 3
        while time.monotonic() < until:
            assert _hold(operator, url, leaseSeconds=1.5).status_code == 200
            time.sleep(0.3)
        assert operator.get(f"/v1/stripes/imgs/{manifest.digest}").status_code == 200
        # no longer renewed: gone within the lease and a sweep, files and all
        deadline = time.monotonic() + 10
        while operator.get(f"/v1/stripes/imgs/{manifest.digest}").status_code == 200:
            assert time.monotonic() < deadline, "the share outlived its lease"
            time.sleep(0.1)
        assert operator.get(f"/v1/stripes/imgs/{manifest.digest}").status_code == 404
        assert not share.exists()
        assert "imgs" not in operator.get("/v1/inventory").json().get("stripes", {})
        bad = _hold(operator, url, leaseSeconds=0)
        assert bad.status_code == 400, bad.text


def _dsctl(agent: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DSAGENT_ADMIN_TOKEN": ADMIN_TOKEN}
    return subprocess.run(
        [sys.executable, "-m", "dsagent.cli", *args, "--socket", str(agent.socket)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_dsctl_stripe_release_drops_the_share_now(imgs: _Imgs) -> None:
    manifest, url, _, agent = imgs
    share = agent.root / "stripes" / "imgs" / manifest.digest
    with unix_client(agent, ADMIN_TOKEN) as operator:
        assert _hold(operator, url).status_code == 200
        assert _wait_complete(operator, manifest.digest)["complete"]
        assert share.is_dir()
        done = _dsctl(agent, "stripe", "release", "imgs", "-o", "json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"name": "imgs", "released": [manifest.digest]}
        assert operator.get(f"/v1/stripes/imgs/{manifest.digest}").status_code == 404
        assert not share.exists()
        again = _dsctl(agent, "stripe", "release", "imgs")
        assert again.returncode == 3 and "no share" in again.stderr, (again.returncode, again.stderr)
        assert operator.delete("/v1/stripes/imgs", params={"digest": "nothex"}).status_code == 400
    # released means released: a restarted agent does not hold it again
    agent.stop()
    agent.start()
    with unix_client(agent, ADMIN_TOKEN) as operator:
        time.sleep(0.5)
        assert operator.get(f"/v1/stripes/imgs/{manifest.digest}").status_code == 404


def test_shares_count_in_the_space_and_go_after_replicated_copies_before_last_copies(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], tmp_path: Path
) -> None:
    """Capacity for the share and one small whole version (a last copy: no other node holds
    it); a larger fetch needs room: the share goes, the last copy stays."""
    www, url, _ = loopback
    manifest = _store(www, count=30)
    _, small, small_manifest = packed(www, url, "small", files=8, size=4000)
    _, large, large_manifest = packed(www, url, "large", files=12, size=9000)
    on_disk = {m.name: allocated(m.total_bytes, m.file_count, tmp_path) for m in (small_manifest, large_manifest)}
    share = allocated(manifest.total_bytes, manifest.file_count, tmp_path)
    # room: the share (and its fill's 1.2x), plus the small copy, plus a bit; the large one needs 1.2x its disk
    capacity = int(share * 1.2) + on_disk["small"] + on_disk["large"] // 2
    agent = agent_factory(env={"DSAGENT_NODE_NAME": NODE, "DSAGENT_CAPACITY": str(capacity)})  # no pod here
    with unix_client(agent, ADMIN_TOKEN) as operator, agent.client() as client:
        assert _hold(operator, url).status_code == 200
        assert _wait_complete(operator, manifest.digest)["complete"]
        space = operator.get("/v1/datasets").json()
        assert space["usedBytes"] >= manifest.total_bytes  # the share counts as used
        assert space["freeBytes"] <= capacity - manifest.total_bytes
        assert operator.get("/v1/inventory").json()["stripes"]["imgs"]["heldBytes"] == manifest.total_bytes
        client.submit_task("t-small", [small])
        assert wait_ready(client, "t-small")["state"] == "ready"
        client.release_task("t-small")  # unused now: a last copy, evictable
        client.submit_task("t-large", [large])
        record = wait_ready(client, "t-large")
        assert record["state"] == "ready", record
        assert operator.get(f"/v1/stripes/imgs/{manifest.digest}").status_code == 404  # the share went
        held = {d["name"] for d in operator.get("/v1/datasets").json()["datasets"]}
        assert {"small", "large"} <= held, held  # the last copy stayed


def test_filling_a_share_evicts_an_unused_version_and_never_one_in_use(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], tmp_path: Path
) -> None:
    """Room for a share is made as for a fetch (1.2x, LRU): an unused version goes; a
    version a task holds stays, and the share is refused with 507 rather than filled past
    the capacity."""
    www, url, _ = loopback
    manifest = _store(www, count=30)
    _, small, small_manifest = packed(www, url, "small", files=8, size=4000)
    on_disk = allocated(small_manifest.total_bytes, small_manifest.file_count, tmp_path)
    share = allocated(manifest.total_bytes, manifest.file_count, tmp_path)  # blocks and inodes count
    # the share with its 1.2x headroom, but not beside the small copy
    capacity = int(share * 1.2) + on_disk // 2
    agent = agent_factory(env={"DSAGENT_NODE_NAME": NODE, "DSAGENT_CAPACITY": str(capacity)})  # no pod here
    with unix_client(agent, ADMIN_TOKEN) as operator, agent.client() as client:
        client.submit_task("t-small", [small])
        assert wait_ready(client, "t-small")["state"] == "ready"
        refused = _hold(operator, url)  # the small copy is in use: nothing to evict
        assert refused.status_code == 507 and refused.json()["code"] == "insufficient_space", refused.text
        assert {d["name"] for d in operator.get("/v1/datasets").json()["datasets"]} == {"small"}
        client.release_task("t-small")  # unused now: evictable
        assert _hold(operator, url).status_code == 200
        assert _wait_complete(operator, manifest.digest)["complete"]
        assert "small" not in {d["name"] for d in operator.get("/v1/datasets").json()["datasets"]}
        space = operator.get("/v1/datasets").json()
        assert space["usedBytes"] <= capacity


def test_a_filling_shares_room_stays_taken_while_it_fills(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], tmp_path: Path
) -> None:
    """The room made for a share is reserved until the share is whole: a fetch that starts
    while the share still downloads cannot take it (507, nothing evictable), and the share
    fills within the capacity, where without the reservation the fetch would take the room
    and the share would fill past it."""
    www, url, server = loopback
    manifest = _store(www, count=30)
    _, small, small_manifest = packed(www, url, "small", files=20, size=8000)
    on_disk = allocated(small_manifest.total_bytes, small_manifest.file_count, tmp_path)
    share = allocated(manifest.total_bytes, manifest.file_count, tmp_path)
    assert share < 3 * on_disk  # so that the share's 1.2x headroom cannot take the small copy
    capacity = int(share * 1.2) + on_disk // 2  # room for the share, and for the small copy only beside part of it
    share_bundles = {b.digest for b in manifest.bundles}
    server.slow_down(lambda path: any(digest in path for digest in share_bundles), 2.0)
    agent = agent_factory(env={"DSAGENT_NODE_NAME": NODE, "DSAGENT_CAPACITY": str(capacity)})
    with unix_client(agent, ADMIN_TOKEN) as operator, agent.client() as client:
        assert _hold(operator, url).status_code == 200
        status = operator.get(f"/v1/stripes/imgs/{manifest.digest}").json()
        assert status["bundlesHeld"] == 0, status  # still downloading: its room is all that is taken
        client.submit_task("t-small", [small])
        record = wait_ready(client, "t-small")
        assert record["state"] == "failed" and "space" in str(record).lower(), record
        assert _wait_complete(operator, manifest.digest)["complete"]
        space = operator.get("/v1/datasets").json()
        assert {d["name"] for d in space["datasets"]} == set(), space
        assert space["usedBytes"] <= capacity, space


def test_a_restart_leaves_no_window_bundle_it_does_not_count(imgs: _Imgs) -> None:
    """The window is the running agent's: a bundle its readers took before a restart is known
    to no window after it (nothing would count its disk or evict it), so it goes."""
    manifest, url, _, agent = imgs
    bundle = manifest.bundles[0]
    window = agent.root / "stripes" / "imgs" / manifest.digest / "window"
    with unix_client(agent) as pod, unix_client(agent, ADMIN_TOKEN) as operator:
        assert _hold(operator, url, members=[NODE, "node-b"], noShare=[NODE]).status_code == 200
        mine = {"name": "imgs", "source": "memory://stripe-lease/none", "bundles": f"{url}/store"}
        assert pod.put(f"/v1/tasks/{POD}", json={"datasets": [mine]}).status_code == 200
        assert _bundle_names(pod, manifest, bundle) == [e.path for e in manifest.bundle_entries(bundle)]
    assert [p.name for p in window.iterdir()] == [bundle.digest]
    agent.stop()
    agent.start()
    with unix_client(agent) as pod, unix_client(agent, ADMIN_TOKEN) as operator:
        eventually(
            lambda: operator.get(f"/v1/stripes/imgs/{manifest.digest}").status_code == 200, 30, "the share held again"
        )
        assert list(window.iterdir()) == []
        # read again, it is fetched again into this run's window
        assert pod.put(f"/v1/tasks/{POD}", json={"datasets": [mine]}).status_code == 200
        assert _bundle_names(pod, manifest, bundle) == [e.path for e in manifest.bundle_entries(bundle)]
    assert [p.name for p in window.iterdir()] == [bundle.digest]


def test_a_member_without_a_share_holds_nothing_and_reads_through_its_window(imgs: _Imgs) -> None:
    manifest, url, server, agent = imgs
    pair = {"members": [NODE, "node-b"]}

    def bundle_reads() -> int:
        return sum(server.gets(lambda p: "/store/bundles/" in p).values())

    with unix_client(agent) as pod, unix_client(agent, ADMIN_TOKEN) as operator:
        # node-b owns every bundle; this node, without a share, holds nothing and is complete
        answer = _hold(operator, url, **pair, noShare=[NODE])
        assert answer.status_code == 200, answer.text
        status = answer.json()
        assert (status["bundlesOwned"], status["bytesHeld"], status["complete"]) == (0, 0, True)
        time.sleep(0.5)
        assert bundle_reads() == 0  # nothing fetched for a share it does not have
        stripes = operator.get("/v1/inventory").json()["stripes"]
        assert stripes["imgs"]["group"] == ["node-b"] and stripes["imgs"]["members"] == 2
        # its pod still reads the version: through the window (node-b unreachable: the store)
        mine = {"name": "imgs", "source": "memory://stripe-lease/none", "bundles": f"{url}/store"}
        assert pod.put(f"/v1/tasks/{POD}", json={"datasets": [mine]}).status_code == 200
        bundle = manifest.bundles[0]
        assert _bundle_names(pod, manifest, bundle) == [e.path for e in manifest.bundle_entries(bundle)]
        # the other way round: this node owns every bundle (a changed group re-plans the share)
        assert _hold(operator, url, **pair, noShare=["node-b"]).status_code == 200
        whole = _wait_complete(operator, manifest.digest)
        assert whole["complete"] and whole["bundlesOwned"] == len(manifest.bundles)
        assert operator.get("/v1/inventory").json()["stripes"]["imgs"]["group"] == [NODE]
        # a member list that noShare does not fit is refused, and changes nothing
        for wrong in (["node-c"], [NODE, "node-b"]):
            refused = _hold(operator, url, **pair, noShare=wrong)
            assert refused.status_code == 400 and "noShare" in refused.json()["message"], refused.text
        assert operator.get(f"/v1/stripes/imgs/{manifest.digest}").json()["complete"]
    # from dsctl, and kept across a restart (the share's record names the members without one)
    held = _dsctl(agent, "stripe", "hold", "imgs", "--store", f"{url}/store", "--member", NODE, "--member", "node-b",
                  "--no-share", NODE, "-o", "json")  # fmt: skip
    assert held.returncode == 0, held.stderr
    assert json.loads(held.stdout)["bundlesOwned"] == 0
    with unix_client(agent, ADMIN_TOKEN) as operator:  # the bundle its pod read through the window, counted
        window = operator.get("/v1/inventory").json()["stripes"]["imgs"]["windowBytes"]
    assert window == bundle.size
    agent.stop()
    agent.start()
    with unix_client(agent, ADMIN_TOKEN) as operator:
        deadline = time.monotonic() + 30
        while (again := operator.get(f"/v1/stripes/imgs/{manifest.digest}")).status_code != 200:
            assert time.monotonic() < deadline, again.text
            time.sleep(0.1)
        assert (again.json()["bundlesOwned"], again.json()["complete"]) == (0, True)
        # ... and still counted after the restart: the placement's measure does not start over,
        # from the moment the share is held again, and in its record (a second restart keeps it)
        assert operator.get("/v1/inventory").json()["stripes"]["imgs"]["windowBytes"] == window
    record = json.loads((agent.root / "stripes" / "imgs" / manifest.digest / HOLD_FILE).read_text())
    assert record["windowBytes"] == window
