"""When a stripe share was last used, and how the eviction ranks it (in process, a real
bundle store over loopback HTTP, the clock injected; docs/design-striping.md#eviction).

- The controller's renewals are not use: a whole copy kept after its job ended ages.
- Pods on the node that name a Dataset the share is held for keep it in use: not chosen
  by an eviction, and its age counts from when they end.
- A share holding every bundle ranks as a whole copy: with another copy in the cluster it
  goes before another group's share, as the last copy it ranks with it by last use. A
  share of a version two other nodes hold whole goes with the replicated copies.
- A whole copy kept after its group let it go has no lease: the idle sweep removes it once
  it is unused past the idle bound, as any copy; a share a group holds is its lease's.
- A whole copy let go before it was complete keeps the bundles it holds, across a restart,
  and stops filling; held again by a group, it fills on. One that holds nothing goes.
- In cluster mode (the node's pods reported), an agent down for longer than a share's lease
  holds it again, and drops it once the pods are known only when none of them reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from dsagent.cache.service import CacheService
from dsagent.cache.servicehooks import ServiceHooks
from dsagent.cache.settings import Settings
from dsagent.format.bundles.bundle import pack
from dsagent.policy import eviction
from tests.clock import Clock
from tests.dsagent.conftest import write_tree
from tools.support.harness import LOOPBACK

NODE = "node-a"
HELD_FOR = ("ml", "imgs")


def _stores(www: Path) -> None:
    for name in ("imgs", "other"):
        files = {f"{name}/f{i:03d}.bin": os.urandom(3000 + 97 * i) for i in range(12)}
        write_tree(www / f"src-{name}", files)
        pack(www / f"src-{name}", www / name, name=name, max_files=4)


async def _held(service: CacheService, url: str, name: str, *, whole: bool) -> str:
    status = await service.stripes.hold(
        name, f"{url}/{name}", [NODE, "node-b"], {}, whole=whole, holders=[("ml", name)], ready_after=1
    )
    return await _complete(service, name, str(status["digest"]))


async def _complete(service: CacheService, name: str, digest: str) -> str:
    """Wait (30 s at most) until the node holds every bundle its share of ``name@digest`` owns."""
    for _ in range(600):
        status = service.stripes.status((name, digest))
        if status["complete"]:
            return digest
        await asyncio.sleep(0.05)
    raise AssertionError(status)


async def _held_while_fetching(service: CacheService, url: str) -> tuple[Any, list[asyncio.Task[None]]]:
    """``imgs`` held on this node alone, and the bundle fetches under way into its share (the
    store slowed down by the caller, so that there are some)."""
    status = await service.stripes.hold("imgs", f"{url}/imgs", [NODE], {}, holders=[HELD_FOR])
    share = service.stripes._shares[("imgs", str(status["digest"]))]
    for _ in range(200):
        if share.inflight:
            break
        await asyncio.sleep(0.01)
    fetching = list(share.inflight.values())
    assert fetching, "a bundle fetch under way"
    return share, fetching


def _node(tmp_path: Path, loopback: tuple[Path, str, Any]) -> tuple[str, Clock, Settings]:
    """The two versions' store over loopback, a clock, and the node's settings."""
    www, url, _ = loopback
    _stores(www)
    settings = Settings(root=tmp_path / "cache", node_name=NODE, egress_allow=LOOPBACK, sweep_interval=3600)
    return url, Clock(1_000_000.0), settings


@contextlib.asynccontextmanager
async def _service(settings: Settings, clock: Clock, hooks: ServiceHooks | None = None) -> AsyncIterator[CacheService]:
    service = CacheService(settings, clock=clock, hooks=hooks or ServiceHooks())
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


def _usage(service: CacheService) -> dict[str, Any]:
    return {u.key[0]: u for u in service.stripes.usage()}


def test_renewals_are_not_use_and_pods_naming_its_dataset_keep_it_in_use(
    tmp_path: Path, loopback: tuple[Path, str, Any]
) -> None:
    url, clock, settings = _node(tmp_path, loopback)

    async def run() -> None:
        async with _service(settings, clock) as service:
            await _held(service, url, "imgs", whole=True)
            held_at = clock.now
            assert _usage(service)["imgs"].last_used == held_at
            clock.now += 600
            await _held(service, url, "imgs", whole=True)  # the controller's renewal
            assert _usage(service)["imgs"].last_used == held_at and not _usage(service)["imgs"].busy

            service.stripes.read_by({HELD_FOR})  # a pod on the node names ml/imgs
            clock.now += 60
            now = _usage(service)["imgs"]
            assert now.busy and now.last_used == clock.now
            service.stripes.read_by({("other-ns", "imgs")})  # another namespace's Dataset: not its holder
            clock.now += 60
            gone = _usage(service)["imgs"]
            assert not gone.busy and gone.last_used == clock.now - 60

    asyncio.run(run())


def test_a_whole_share_ranks_as_a_whole_copy_by_the_clusters_other_copies(
    tmp_path: Path, loopback: tuple[Path, str, Any]
) -> None:
    url, clock, settings = _node(tmp_path, loopback)

    async def run() -> None:
        async with _service(settings, clock) as service:
            digest = await _held(service, url, "imgs", whole=True)
            clock.now += 10
            other = await _held(service, url, "other", whole=False)  # another group's share, used later
            space = service._space

            async def order(copies: dict[tuple[str, str], int]) -> list[str]:
                service.node.copies.update(copies, made_at=clock.now)
                return [c.name for c in eviction.eviction_order(await space.candidates())]

            # another node holds imgs whole too: its copy goes first, before the share of "other"
            assert await order({("imgs", digest): 2}) == ["imgs", "other"]
            # this node's is the cluster's only copy: it ranks with the share, as a last copy,
            # and was used earlier
            assert await order({("imgs", digest): 1}) == ["imgs", "other"]
            # other nodes hold the share's version whole: it ranks as a whole copy here would
            # (the count less one), so one other copy keeps it with the last copies, two put
            # it with the replicated copies, before them
            assert await order({("imgs", digest): 1, ("other", other): 1}) == ["imgs", "other"]
            assert await order({("imgs", digest): 1, ("other", other): 2}) == ["other", "imgs"]
            service.stripes.read_by({HELD_FOR})  # read from local disk by a pod: never chosen
            assert await order({("imgs", digest): 2}) == ["other"]

    asyncio.run(run())


def test_a_whole_copy_released_with_keep_stays_with_no_lease_across_a_restart(
    tmp_path: Path, loopback: tuple[Path, str, Any]
) -> None:
    url, clock, settings = _node(tmp_path, loopback)

    async def run() -> None:
        async with _service(settings, clock) as service:
            digest = await _held(service, url, "imgs", whole=True)
            await _held(service, url, "other", whole=False)
            # the group lets the node go: the whole copy stays, the share of "other" goes
            await service.stripes.release("imgs", keep_whole=True)
            await service.stripes.release("other", keep_whole=True)
            assert set(_usage(service)) == {"imgs"}
        clock.now += 10 * settings.stripe_lease  # far past any lease
        async with _service(settings, clock) as service:
            for _ in range(200):  # the agent holds its shares again in the background
                if "imgs" in _usage(service):
                    break
                await asyncio.sleep(0.05)
            await service.stripes.expire()
            status = service.stripes.status(("imgs", digest))
            assert status["complete"] and status["holding"] == "whole", status
            await service.stripes.release("imgs")  # an operator's release drops it
            assert _usage(service) == {}

    asyncio.run(run())


def test_the_idle_sweep_removes_a_kept_whole_copy_and_leaves_a_held_share(
    tmp_path: Path, loopback: tuple[Path, str, Any]
) -> None:
    url, clock, settings = _node(tmp_path, loopback)
    settings = settings.model_copy(update={"idle_ttl": 600.0})

    async def run() -> None:
        async with _service(settings, clock) as service:
            await _held(service, url, "imgs", whole=True)
            await _held(service, url, "other", whole=True)
            await service.stripes.release("imgs", keep_whole=True)  # the group let this node go
            clock.now += 601
            await _held(service, url, "other", whole=True)  # its group renews it: a lease, not use
            service.stripes.read_by({("ml", "imgs")})  # a pod reads the kept copy: in use
            await service.sweep()
            assert set(_usage(service)) == {"imgs", "other"}
            service.stripes.read_by(set())  # the pod ends: unused from now
            clock.now += 601
            await _held(service, url, "other", whole=True)
            await service.sweep()
            assert set(_usage(service)) == {"other"}  # the kept copy went; the held share stays

    asyncio.run(run())


def test_a_whole_copy_let_go_before_it_is_complete_keeps_what_it_holds_and_stops_filling(
    tmp_path: Path, loopback: tuple[Path, str, Any]
) -> None:
    url, clock, settings = _node(tmp_path, loopback)

    async def hold(service: CacheService, *, on_demand: bool) -> str:
        status = await service.stripes.hold(
            "imgs", f"{url}/imgs", [NODE, "node-b"], {}, whole=True, holders=[HELD_FOR], ready_after=0,
            store_on_demand=on_demand,
        )  # fmt: skip
        return str(status["digest"])

    async def run() -> None:
        async with _service(settings, clock) as service:
            digest = await hold(service, on_demand=True)  # no peers: it reads only what a reader reads
            await hold(service, on_demand=True)
            key = ("imgs", digest)
            for bundle in [b.digest for b in service.stripes._shares[key].layout.bundles][:2]:
                _, _, stream = await service.stripes.open_bundle("imgs", digest, bundle)  # a reader reads two
                stream.close()
            assert service.stripes.status(key)["bundles_held"] == 2
            await service.stripes.release("imgs", keep_whole=True)  # the group lets the node go
            share = service.stripes._shares[key]
            assert not share.filling and len(share.held) == 2 and _usage(service)["imgs"].kept
            assert service.stripes.pending_bytes() == 0, "no room is held for the bundles it lacks"
        clock.now += 10 * settings.stripe_lease
        async with _service(settings, clock) as service:
            for _ in range(200):  # the agent holds its shares again in the background, kept last
                if "imgs" in _usage(service) and _usage(service)["imgs"].kept:
                    break
                await asyncio.sleep(0.05)
            await service.stripes.expire()
            share = service.stripes._shares[key]
            assert len(share.held) == 2 and not share.filling and _usage(service)["imgs"].kept
            await _held(service, url, "imgs", whole=True)  # a group holds it again: it fills on, from the store
            assert service.stripes.status(key)["complete"] and not _usage(service)["imgs"].kept

            await service.stripes.release("imgs")
            await hold(service, on_demand=True)  # holds nothing yet
            await service.stripes.release("imgs", keep_whole=True)
            assert _usage(service) == {}, "a whole copy holding no bundle is not kept"

    asyncio.run(run())


def test_a_share_its_nodes_pods_read_outlives_its_lease_and_lapses_a_lease_after_its_last_use(
    tmp_path: Path, loopback: tuple[Path, str, Any]
) -> None:
    """The controller renews the current version's shares only: a job still reading the one it
    was admitted with keeps its share past the lease, and the share goes a lease after the
    job's last pod on the node ends. A share nobody reads goes when its lease lapses."""
    url, clock, settings = _node(tmp_path, loopback)
    lease = settings.stripe_lease

    async def run() -> None:
        async with _service(settings, clock) as service:
            await _held(service, url, "imgs", whole=False)
            await _held(service, url, "other", whole=False)
            service.stripes.read_by({HELD_FOR})  # a pod on this node reads imgs
            clock.now += 2 * lease  # nobody renewed either
            await service.stripes.expire()
            assert set(_usage(service)) == {"imgs"}, "the unread share lapsed, the read one stays"
            service.stripes.read_by(set())  # the job's pod ends: last used now
            clock.now += lease / 2
            await service.stripes.expire()
            assert set(_usage(service)) == {"imgs"}, "within a lease of its last use"
            clock.now += lease / 2 + 1
            await service.stripes.expire()
            assert _usage(service) == {}, "a lease after its last use it lapses"

    asyncio.run(run())


def test_a_share_a_job_reads_is_held_again_after_a_restart_once_the_store_moved_on(
    tmp_path: Path, loopback: tuple[Path, str, Any]
) -> None:
    """A job reads a version its Dataset has moved on from (the store holds a newer one) past
    the share's lease, and the agent restarts: the share is held again from the manifest kept
    beside it, bundles and all, and lapses a lease after its last use."""
    url, clock, settings = _node(tmp_path, loopback)
    www = loopback[0]
    lease = settings.stripe_lease

    async def run() -> None:
        async with _service(settings, clock) as service:
            status = await service.stripes.hold("imgs", f"{url}/imgs", [NODE], {}, holders=[HELD_FOR])
            digest = str(status["digest"])
            await _complete(service, "imgs", digest)
            service.stripes.read_by({HELD_FOR})  # the job's pod on this node reads it
            # the store moves on to a new version of imgs
            write_tree(www / "src-imgs", {"imgs/new.bin": os.urandom(5000)})
            pack(www / "src-imgs", www / "imgs", name="imgs", max_files=4)
            clock.now += 2 * lease  # never renewed: the controller holds the new version only
            await service.stripes.expire()
            assert set(_usage(service)) == {"imgs"}, "read by the job: kept past its lease"
            used = service.stripes._shares[("imgs", digest)].last_used
        clock.now += 60  # the agent restarts
        async with _service(settings, clock) as service:
            for _ in range(200):  # held again in the background
                if "imgs" in _usage(service):
                    break
                await asyncio.sleep(0.05)
            status = service.stripes.status(("imgs", digest))
            assert status["complete"] and status["bundles_held"] == status["bundles_owned"], status
            record = json.loads((service.stripes.version_dir(("imgs", digest)) / "hold.json").read_text())
            assert record["lastUsed"] == used and record["expiresAt"] < clock.now, "the restart is no use of it"
            await service.stripes.expire()
            assert set(_usage(service)) == {"imgs"}, "used within its lease: still held"
            clock.now += lease  # no pod reads it now
            await service.stripes.expire()
            assert _usage(service) == {}, "a lease after its last use it lapses"

    asyncio.run(run())


def test_an_agent_down_past_the_lease_holds_a_share_again_until_the_pods_say_who_reads_it(
    tmp_path: Path, loopback: tuple[Path, str, Any]
) -> None:
    """Cluster mode: the controller stops renewing a share (its Dataset moved on) while a job
    reads it, and the agent is down for more than a lease. Its record says it was last used
    long ago, but the job's pod may still be there: it is held again, nothing lapses before
    the node's pods are reported, and then it stays while a pod names its Dataset and lapses
    a lease after the last one ends. Standalone (no pods reported), the same record is dropped
    at the restart, as before."""
    url, clock, settings = _node(tmp_path, loopback)
    lease = settings.stripe_lease
    cluster = ServiceHooks(reports_pods=True)

    async def run() -> None:
        async with _service(settings, clock, cluster) as service:
            status = await service.stripes.hold("imgs", f"{url}/imgs", [NODE], {}, holders=[HELD_FOR])
            digest = str(status["digest"])
            await _complete(service, "imgs", digest)
            service.stripes.read_by({HELD_FOR})
            clock.now += lease / 2
            await service.stripes.expire()
            assert set(_usage(service)) == {"imgs"}, "read by a pod: kept"
        clock.now += 3 * lease  # down for longer than a lease: its record is old
        async with _service(settings, clock, cluster) as service:
            for _ in range(200):
                if "imgs" in _usage(service):
                    break
                await asyncio.sleep(0.05)
            assert set(_usage(service)) == {"imgs"}, "held again: the pods are not known yet"
            assert await service.stripes.expire() == [], "nothing lapses before the pods are reported"
            service.stripes.read_by({HELD_FOR})  # the job's pod is still on the node
            await service.stripes.expire()
            assert set(_usage(service)) == {"imgs"}, "read by a pod: kept"
            service.stripes.read_by(set())  # the job ends
            clock.now += lease / 2
            await service.stripes.expire()
            assert set(_usage(service)) == {"imgs"}, "within a lease of its last use"
            clock.now += lease
            assert await service.stripes.expire() == [("imgs", digest)], "a lease after its last use"
            # held once more, then the agent is down past the lease again, standalone this time
            await service.stripes.hold("imgs", f"{url}/imgs", [NODE], {}, digest=digest, holders=[HELD_FOR], lease=60)
            await _complete(service, "imgs", digest)
        clock.now += 3 * lease
        async with _service(settings, clock) as service:
            for _ in range(40):
                await asyncio.sleep(0.05)
            assert _usage(service) == {}, "standalone: its record decides at the restart"
            assert not service.stripes.version_dir(("imgs", digest)).exists()

    asyncio.run(run())


def test_a_release_waits_for_the_bundle_fetches_under_way(tmp_path: Path, loopback: tuple[Path, str, Any]) -> None:
    """A share released while its bundles are being fetched: the release returns once those
    fetches have ended (they run on threads no cancel stops), so none of them writes into the
    share's directory after it is gone, and none leaves an error nobody reads."""
    url, clock, settings = _node(tmp_path, loopback)
    loopback[2].slow_down(lambda path: "/imgs/" in path and path.endswith(".tar.zst"), 1.0)

    async def run() -> None:
        async with _service(settings, clock) as service:
            share, fetching = await _held_while_fetching(service, url)
            await service.stripes.release("imgs")
            assert all(task.done() for task in fetching), "the release waited for them"
            directory = service.stripes.version_dir(share.key)
            assert not directory.exists()
            await asyncio.sleep(1.2)
            assert not directory.exists(), "nothing written after the release"

    asyncio.run(run())


def test_the_manifest_kept_beside_a_share_counts_against_the_cache(
    tmp_path: Path, loopback: tuple[Path, str, Any]
) -> None:
    """The manifest a share keeps for a restart takes disk as its bundles do: what the shares
    count against the cache's capacity includes it, and so does it after a restart."""
    url, clock, settings = _node(tmp_path, loopback)

    async def run() -> None:
        for _restart in range(2):
            async with _service(settings, clock) as service:
                stripes = service.stripes
                digest = await _held(service, url, "imgs", whole=True)
                share = stripes._shares[("imgs", digest)]
                kept = (stripes.version_dir(share.key) / "manifest").stat().st_size
                bundles = sum(stripes.disk(b.size, b.count) for b in share.layout.bundles)
                assert share.held == {b.digest for b in share.layout.bundles}
                assert stripes.total_bytes() == bundles + stripes.disk(kept, 1) + stripes.window.bytes

    asyncio.run(run())


def test_two_holds_of_one_version_at_once_hold_it_once(tmp_path: Path, loopback: tuple[Path, str, Any]) -> None:
    """A restarted agent's recover() and the controller's renewal may ask for the same share
    together: both succeed, and the node holds it once, with one fill."""
    url, clock, settings = _node(tmp_path, loopback)

    async def run() -> None:
        async with _service(settings, clock) as service:
            asks = [
                service.stripes.hold("imgs", f"{url}/imgs", [NODE, "node-b"], {}, holders=[HELD_FOR], whole=True)
                for _ in range(2)
            ]
            first, second = await asyncio.gather(*asks)
            assert first["digest"] == second["digest"]
            fills = [t for t in asyncio.all_tasks() if t.get_name() == "stripe-imgs" and not t.done()]
            assert len(fills) <= 1, "one fill"
            await _complete(service, "imgs", str(first["digest"]))

    asyncio.run(run())


def test_a_new_group_waits_for_the_old_plans_fetches(tmp_path: Path, loopback: tuple[Path, str, Any]) -> None:
    """A share re-planned for a new group while its bundles are being fetched: the new plan
    starts once those fetches have ended, so it counts what they brought as held and no
    fetch of the old plan writes beside the new one's."""
    url, clock, settings = _node(tmp_path, loopback)
    loopback[2].slow_down(lambda path: "/imgs/" in path and path.endswith(".tar.zst"), 1.0)

    async def run() -> None:
        async with _service(settings, clock) as service:
            old, fetching = await _held_while_fetching(service, url)
            await service.stripes.hold("imgs", f"{url}/imgs", [NODE, "node-b"], {}, holders=[HELD_FOR])
            assert all(task.done() for task in fetching), "the re-plan waited for them"
            new = service.stripes._shares[old.key]
            assert new is not old and old.held <= new.held | new.handover, "what they brought is held"
            await _complete(service, "imgs", old.key[1])

    asyncio.run(run())
