"""The agent as users run it: a real ``dsagent serve`` process over its socket and TCP,
caching from a real HTTP server on 127.0.0.1 (bundles) and from local directories."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dsagent.cache import inventory as inventory_schema
from dsagent.errors import Conflict, InsufficientSpace, NotFound
from dsagent.format.bundles.bundle import pack, verify_tree
from dsagent.format.manifest import Manifest, read_manifest
from dsplatform.units import format_size
from tools.support.harness import ADMIN_TOKEN, AgentProcess, LoopbackServer, allocated, wait_ready


def make_dataset(root: Path, files: int, size: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    for i in range(files):
        path = root / f"class{i % 4}" / f"img{i:04d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(size))
    return root


def packed(
    www: Path, url: str, name: str, *, files: int = 12, size: int = 2000, seed: int = 0, max_files: int = 4
) -> tuple[Path, dict[str, Any], Manifest]:
    source = make_dataset(www.parent / f"src-{name}-{seed}", files, size, seed)
    manifest = pack(source, www / "store", name=name, max_files=max_files)
    return source, {"name": name, "source": f"{url}/nowhere/{name}", "bundles": f"{url}/store"}, manifest


def bundle_gets(server: LoopbackServer) -> dict[str, int]:
    return server.gets(lambda p: p.startswith("/store/bundles/"))


@pytest.mark.parametrize("transport", ["socket", "tcp"])
def test_a_repeated_task_request_returns_the_same_record_and_starts_no_new_work(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], transport: str
) -> None:
    www, url, server = loopback
    source, dataset, manifest = packed(www, url, "imagenet")
    agent = agent_factory(tcp=transport == "tcp")
    with agent.client(tcp=transport == "tcp", token=ADMIN_TOKEN) as client:
        first = client.submit_task("pod-1", [dataset], wait=30)
        assert first["state"] == "ready", first
        reads = server.gets()
        again = client.submit_task("pod-1", [dataset], wait=30)
        assert server.gets() == reads  # no manifest read, no bundle read
    assert again["datasets"] == first["datasets"]
    assert again["createdAt"] == first["createdAt"]
    path = Path(first["datasets"][0]["path"])
    verify_tree(path, manifest)
    assert first["datasets"][0]["digest"] == manifest.digest
    assert len(bundle_gets(server)) == len(manifest.bundles)


def test_twenty_concurrent_tasks_for_one_dataset_cause_exactly_one_fetch(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer]
) -> None:
    www, url, server = loopback
    _, dataset, manifest = packed(www, url, "coco", files=16, max_files=4)
    server.slow_down(lambda p: p.startswith("/store/bundles/"), 0.3)  # the fetch outlives the burst
    agent = agent_factory()
    records: list[dict[str, Any]] = []

    def one(i: int) -> None:
        with agent.client() as client:
            records.append(client.submit_task(f"pod-{i}", [dataset], wait=60))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [r["state"] for r in records] == ["ready"] * 20
    assert {r["datasets"][0]["path"] for r in records} == {records[0]["datasets"][0]["path"]}
    gets = bundle_gets(server)
    assert sorted(gets) == sorted(f"/store/bundles/{b.digest}.tar.zst" for b in manifest.bundles)
    assert set(gets.values()) == {1}, gets  # every bundle read once, by one fetch
    with agent.client() as client:
        assert 'dsplatform_agent_fetches_total{result="ok"} 1.0' in client.metrics()


def test_a_changed_source_gets_a_new_version_while_the_old_stays_for_its_task(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer]
) -> None:
    www, url, server = loopback
    source, dataset, v1 = packed(www, url, "speech")
    agent = agent_factory()
    with agent.client() as client:
        old = client.submit_task("job-old", [dataset], wait=30)["datasets"][0]
        (source / "class0" / "img0000.jpg").write_bytes(b"relabelled")
        v2 = pack(source, www / "store", name="speech", max_files=4)
        assert v2.digest != v1.digest
        new = client.submit_task("job-new", [dataset], wait=30)["datasets"][0]
        assert (new["state"], new["digest"]) == ("ready", v2.digest)
        assert Path(old["path"]).is_dir() and Path(new["path"]).is_dir()
        assert client.get_task("job-old")["datasets"][0]["path"] == old["path"]  # the running task keeps its version
        inv = client.inventory()["datasets"]["speech"]
        assert inv["digest"] == v2.digest
        assert {(v["digest"], v["inUse"]) for v in inv["versions"]} == {(v1.digest, True), (v2.digest, True)}
        # only one bundle changed: the others were not fetched again for the new version
        assert sum(bundle_gets(server).values()) == len({b.digest for b in v1.bundles} | {b.digest for b in v2.bundles})
        client.release_task("job-old")
        assert not Path(old["path"]).exists()  # deleted as soon as no task uses it
        assert [v["digest"] for v in client.dataset("speech")["versions"]] == [v2.digest]


def test_kill_9_in_the_middle_of_a_fetch_leaves_nothing_ready_and_the_fetch_resumes(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer]
) -> None:
    www, url, server = loopback
    _, dataset, manifest = packed(www, url, "audio", files=24, max_files=2)
    assert len(manifest.bundles) >= 6
    server.slow_down(lambda p: p.startswith("/store/bundles/"), 0.4)
    agent = agent_factory(env={"DSAGENT_FETCH_WORKERS": "2"})
    with agent.client() as client:
        client.submit_task("pod-a", [dataset])
        deadline = time.monotonic() + 30
        while client.get_task("pod-a")["datasets"][0]["filesDone"] < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        progress = client.get_task("pod-a")["datasets"][0]
        assert progress["state"] == "fetching" and progress["digest"] == manifest.digest
        assert 0 < progress["bytesDone"] < progress["sizeBytes"] == manifest.total_bytes
        assert progress["rateBytesPerSecond"] > 0 and progress["etaSeconds"] > 0
    agent.kill9()
    before = bundle_gets(server)
    assert 0 < len(before) < len(manifest.bundles)
    assert not any((agent.root / "datasets").glob("audio/*"))  # nothing partial under datasets/

    restarted = AgentProcess(agent.root, env={"DSAGENT_FETCH_WORKERS": "2"}).start()
    try:
        with restarted.client() as client:
            assert [d["state"] for d in client.datasets()["datasets"]] == ["fetching"]
            assert client.get_task("pod-a")["state"] == "pending"
            record = wait_ready(client, "pod-a")  # resumed by the agent itself: no credentials needed
            assert record["state"] == "ready", record
            verify_tree(Path(record["datasets"][0]["path"]), manifest)
    finally:
        restarted.stop()
    after = bundle_gets(server)
    refetched = [path for path, n in after.items() if n > 1]
    assert len(refetched) <= 2, refetched  # at most the bundles in flight at the kill
    assert sum(after.values()) < 2 * len(manifest.bundles)


def test_datasets_in_use_are_never_evicted_and_unused_ones_go_least_recently_used_first(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer]
) -> None:
    www, url, _ = loopback
    sets = {
        name: packed(www, url, name, files=10, size=10_000, seed=i)[1] for i, name in enumerate(["a", "b", "c", "d"])
    }
    # each dataset is 100 kB in 10 files; room for three on disk plus 50 kB (and the
    # fourth's blocks): the fourth needs 120 kB free for its bytes
    each = allocated(100_000, 10, www)
    agent = agent_factory(env={"DSAGENT_CAPACITY": str(3 * each + 50_000 + (each - 100_000))})
    with agent.client() as client:
        client.submit_task("holds-a", [sets["a"]], wait=30)  # a stays in use throughout
        for name in ("c", "b"):
            assert client.submit_task(f"t-{name}", [sets[name]], wait=30)["state"] == "ready"
        client.release_task("t-b")  # b was cached last but released first: b is the LRU
        client.release_task("t-c")
        record = client.submit_task("t-d", [sets["d"]], wait=30)
        assert record["state"] == "ready", record
        held = {d["name"] for d in client.datasets()["datasets"]}
    assert held == {"a", "c", "d"}  # b went first and one eviction was enough (stops at 1.2x)


def test_out_of_space_fails_with_needed_free_and_evictable(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer]
) -> None:
    www, url, _ = loopback
    small = packed(www, url, "small", files=4, size=10_000, seed=1)[1]
    big = packed(www, url, "big", files=20, size=10_000, seed=2)[1]
    # 150 kB for their bytes, plus both datasets' blocks: "small" leaves 110 kB for the
    # 1.2 x 200 kB "big" needs
    blocks = allocated(40_000, 4, www) - 40_000 + allocated(200_000, 20, www) - 200_000
    agent = agent_factory(env={"DSAGENT_CAPACITY": str(150_000 + blocks)})
    with agent.client() as client:
        client.submit_task("t-small", [small], wait=30)
        record = client.submit_task("t-big", [big], wait=30)
        error = record["datasets"][0]["error"]
        assert record["state"] == "failed"
        assert error["code"] == "insufficient_space"
        # one unit, disk: "big"'s own blocks are on both sides of the comparison
        own = allocated(200_000, 20, www) - 200_000
        assert error["details"] == {"needed": 240_000 + own, "free": 110_000 + own, "evictable": 0}
        assert (
            f"needs {format_size(240_000 + own)} of cache disk, {format_size(110_000 + own)} is free"
            " and 0 B could be evicted"
        ) in error["message"]
        assert [d["name"] for d in client.datasets()["datasets"]] == ["small"]  # nothing lost
        with pytest.raises(InsufficientSpace):
            raise_failure(client.get_task("t-big"))


def raise_failure(record: dict[str, Any]) -> None:
    from dsagent.cli.cache import _failure

    raise _failure(record)


def test_per_file_copies_from_a_local_source_are_verified_and_a_hit_reads_nothing(
    agent_factory: Any, tmp_path: Path
) -> None:
    source = make_dataset(tmp_path / "nfs" / "cifar", 9, 3000)
    agent = agent_factory(local_sources=(tmp_path / "nfs",))
    dataset = {"name": "cifar", "source": str(source)}
    with agent.client() as client:
        first = client.submit_task("t1", [dataset], wait=30)["datasets"][0]
        second = client.submit_task("t2", [dataset], wait=30)["datasets"][0]
        metrics = client.metrics()
    assert first["state"] == second["state"] == "ready"
    assert first["path"] == second["path"]
    assert sorted(p.relative_to(first["path"]).as_posix() for p in Path(first["path"]).rglob("*.jpg")) == sorted(
        p.relative_to(source).as_posix() for p in source.rglob("*.jpg")
    )
    assert "dsplatform_agent_cache_hits_total 1.0" in metrics and "dsplatform_agent_cache_misses_total 1.0" in metrics


def test_a_symlink_planted_in_a_local_source_cannot_pull_host_files_into_the_cache(
    agent_factory: Any, tmp_path: Path
) -> None:
    secret = tmp_path / "host" / "secret.key"
    secret.parent.mkdir()
    secret.write_bytes(b"host-only secret")
    source = make_dataset(tmp_path / "nfs" / "cifar", 3, 1000)
    (source / "stolen.key").symlink_to(secret)  # planted by whoever can write to the share
    agent = agent_factory(local_sources=(tmp_path / "nfs",))
    with agent.client() as client:
        record = client.submit_task("t1", [{"name": "cifar", "source": str(source)}], wait=30)
    status = record["datasets"][0]
    assert status["state"] == "failed"
    assert "points outside the allowed directories" in status["error"]["message"]
    copies = [
        p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink() and p.read_bytes() == b"host-only secret"
    ]
    assert copies == [secret]


def test_a_source_over_http_without_bundles_is_copied_file_by_file(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer]
) -> None:
    www, url, server = loopback
    make_dataset(www / "raw", 6, 1500)
    agent = agent_factory()
    with agent.client() as client:
        record = client.submit_task("t", [{"name": "raw", "source": f"{url}/raw/"}], wait=30)
    assert record["state"] == "ready", record["datasets"][0]["error"]
    assert record["datasets"][0]["files"] == 6
    # each file is read once: its size comes from a HEAD (an HTTP index lists no sizes), not
    # from a digest pass that read every file before the copy read it again
    reads = server.gets(lambda p: p.endswith(".jpg"))
    assert len(reads) == 6 and set(reads.values()) == {1}, reads


def test_the_inventory_matches_its_schema_and_reports_state_and_use(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer]
) -> None:
    www, url, _ = loopback
    _, dataset, manifest = packed(www, url, "imagenet")
    agent = agent_factory(env={"DSAGENT_NODE_NAME": "gpu-node-7"})
    with agent.client() as client:
        client.submit_task("pod", [dataset], wait=30)
        inv = client.inventory()
        inventory_schema.validate(inv)
        assert inv["node"] == "gpu-node-7"
        entry = inv["datasets"]["imagenet"]
        assert (entry["digest"], entry["state"], entry["inUse"], entry["files"]) == (manifest.digest, "ready", True, 12)
        client.release_task("pod")
        assert client.inventory()["datasets"]["imagenet"]["inUse"] is False


def test_operator_evictions_refuse_datasets_in_use_unless_forced(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer]
) -> None:
    www, url, _ = loopback
    _, dataset, _ = packed(www, url, "imagenet")  # 12 files of 2000 bytes
    agent = agent_factory()
    with agent.client() as client:
        client.submit_task("pod", [dataset], wait=30)
        with pytest.raises(Conflict):
            client.evict_dataset("imagenet")
        assert client.evict(mode="unused", dry_run=True)["evicted"] == []
        assert [v["name"] for v in client.evict_dataset("imagenet", force=True, dry_run=True)["evicted"]] == [
            "imagenet"
        ]
        client.release_task("pod")
        assert client.evict(mode="unused", dry_run=True)["evicted"][0]["name"] == "imagenet"
        result = client.evict_dataset("imagenet")
        assert result["freedBytes"] == allocated(24_000, 12, www)  # the disk it took
        with pytest.raises(NotFound):
            client.dataset("imagenet")


def test_the_manifest_is_read_once_per_resolution_from_the_store(loopback: tuple[Path, str, LoopbackServer]) -> None:
    www, url, server = loopback
    _, dataset, manifest = packed(www, url, "probe")
    assert read_manifest(dataset["bundles"], "probe").digest == manifest.digest


@pytest.mark.parametrize(
    ("max_fetches", "workers", "peak"), [(1, 2, 2), (2, 2, 4)], ids=["one-dataset-at-a-time", "two-at-a-time"]
)
def test_parallelism_is_bounded_per_dataset_and_across_datasets(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], max_fetches: int, workers: int, peak: int
) -> None:
    www, url, server = loopback
    sets = [packed(www, url, name, files=16, max_files=2, seed=i)[1] for i, name in enumerate(["one", "two"])]
    server.slow_down(lambda p: p.startswith("/store/bundles/"), 0.25)
    agent = agent_factory(env={"DSAGENT_MAX_FETCHES": str(max_fetches), "DSAGENT_FETCH_WORKERS": str(workers)})
    with agent.client() as client:
        for i, dataset in enumerate(sets):
            client.submit_task(f"t{i}", [dataset])
        assert [wait_ready(client, f"t{i}")["state"] for i in range(2)] == ["ready", "ready"]
    assert server.peak_concurrency == peak
