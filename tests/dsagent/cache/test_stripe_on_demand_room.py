"""A share held ``storeOnDemand`` takes the cache's room as its bundles arrive, not when it
is held (in process, a real bundle store over loopback HTTP; docs/design-striping.md#agent).

A job reading part of an epoch of a version larger than a node reads only that part from
the store; reserving the node's whole share for it at once would evict data the cluster
reads again for bundles nobody may read. So:

- holding the share on demand evicts nothing and reserves nothing (its pods wait for no
  bundle: ``readyAfter`` 0, as the controller asks for ``startBeforeWhole``);
- a bundle a reader asks for takes its room then: beside an idle copy while there is free
  room for it, by evicting that copy once there is not;
- where evicting could not make room for the whole share (the cache is held by data its
  pods read), the hold is still refused at once, so that another node owns in its place;
- a share held to fill at once still reserves every bundle it misses when it is held.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from dsagent.cache.layout import Key
from dsagent.cache.service import CacheService
from dsagent.cache.servicehooks import ServiceHooks
from dsagent.cache.settings import Settings
from dsagent.errors import InsufficientSpace
from dsagent.format.bundles.bundle import pack
from dsagent.policy.eviction import EVICT_RATIO
from tests.clock import Clock
from tests.dsagent.conftest import write_tree
from tools.support.harness import LOOPBACK

NODE = "node-a"


def _stores(www: Path) -> None:
    for name in ("imgs", "other"):
        files = {f"{name}/f{i:03d}.bin": os.urandom(3000 + 97 * i) for i in range(12)}
        write_tree(www / f"src-{name}", files)
        pack(www / f"src-{name}", www / name, name=name, max_files=4)


@contextlib.asynccontextmanager
async def _service(settings: Settings) -> AsyncIterator[CacheService]:
    service = CacheService(settings, clock=Clock(1_000_000.0), hooks=ServiceHooks())
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


async def _complete(service: CacheService, key: tuple[str, str]) -> None:
    for _ in range(600):
        if service.stripes.status(key)["complete"]:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(service.stripes.status(key))


async def _settled(service: CacheService, key: tuple[str, str]) -> None:
    """The fill's pass over the peers (there are none) has ended."""
    share = service.stripes._shares[key]
    for _ in range(600):
        if not share.inflight:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the fill's first pass did not end")


async def _other(service: CacheService, url: str) -> tuple[str, str]:
    """``other`` held whole on this node alone, complete: an idle copy the eviction may take
    (unless the node's pods read ``ml/other``)."""
    status = await service.stripes.hold(
        "other", f"{url}/other", [NODE], {}, whole=True, ready_after=0, holders=[("ml", "other")]
    )
    key = ("other", str(status["digest"]))
    await _complete(service, key)
    return key


async def _on_demand(service: CacheService, url: str) -> dict[str, Any]:
    """``imgs`` held on this node alone ``storeOnDemand``, its pods waiting for no bundle
    (``readyAfter`` 0, as the controller asks for ``startBeforeWhole``)."""
    return await service.stripes.hold("imgs", f"{url}/imgs", [NODE], {}, store_on_demand=True, ready_after=0)


async def _read(service: CacheService, key: tuple[str, str], bundle: str) -> None:
    _, _, stream = await service.stripes.open_bundle(key[0], key[1], bundle)
    stream.close()


def _measure(tmp_path: Path, url: str) -> tuple[int, int, list[int]]:
    """On a cache of no set size: what ``other`` takes held whole, what the manifest kept
    beside a share of ``imgs`` takes, and the disk each of its bundles takes."""

    async def run() -> tuple[int, int, list[int]]:
        settings = Settings(root=tmp_path / "measure", node_name=NODE, egress_allow=LOOPBACK, sweep_interval=3600)
        async with _service(settings) as service:
            await _other(service, url)
            other = service.stripes.total_bytes()
            status = await _on_demand(service, url)
            share = service.stripes._shares[("imgs", str(status["digest"]))]
            return other, share.kept_bytes, [service.stripes.disk(b.size, b.count) for b in share.owned]

    return asyncio.run(run())


def _beside_an_idle_copy(
    tmp_path: Path, loopback: tuple[Path, str, Any], body: Callable[[CacheService, str, Key], Awaitable[None]]
) -> None:
    """``body(service, url, other)`` on a node holding ``other`` whole (``other`` its key), on
    a cache with room beside it for the manifest kept beside a share of ``imgs`` and for
    either of the share's first two bundles at the eviction's ratio: not for both, nor for
    the share."""
    www, url, _ = loopback
    _stores(www)
    other_bytes, kept, bundles = _measure(tmp_path, url)
    room = math.ceil(EVICT_RATIO * max(bundles[:2])) + 1
    assert room < bundles[0] + EVICT_RATIO * bundles[1] and room < EVICT_RATIO * sum(bundles)
    settings = Settings(
        root=tmp_path / "cache",
        node_name=NODE,
        egress_allow=LOOPBACK,
        sweep_interval=3600,
        capacity_bytes=other_bytes + kept + room,
    )

    async def run() -> None:
        async with _service(settings) as service:
            await body(service, url, await _other(service, url))

    asyncio.run(run())


def test_a_share_on_demand_takes_its_room_as_its_bundles_arrive(
    tmp_path: Path, loopback: tuple[Path, str, Any]
) -> None:
    async def body(service: CacheService, url: str, other: Key) -> None:
        status = await _on_demand(service, url)
        key = ("imgs", str(status["digest"]))
        await _settled(service, key)
        share = service.stripes._shares[key]
        assert other in service.stripes._shares, "holding the share on demand evicted nothing"
        assert service.stripes.pending_bytes() == 0 and not share.held

        first, second = share.owned[:2]
        await _read(service, key, first.digest)  # fits beside the idle copy
        assert first.digest in share.held and other in service.stripes._shares
        await _read(service, key, second.digest)  # does not: the idle copy goes for it
        assert second.digest in share.held and other not in service.stripes._shares

    _beside_an_idle_copy(tmp_path, loopback, body)


def test_a_share_held_to_fill_at_once_reserves_what_it_misses(tmp_path: Path, loopback: tuple[Path, str, Any]) -> None:
    www, url, _ = loopback
    _stores(www)
    settings = Settings(root=tmp_path / "cache", node_name=NODE, egress_allow=LOOPBACK, sweep_interval=3600)

    async def run() -> None:
        async with _service(settings) as service:
            status = await service.stripes.hold("imgs", f"{url}/imgs", [NODE], {}, ready_after=0)
            share = service.stripes._shares[("imgs", str(status["digest"]))]  # its fill not begun yet
            owned = sum(service.stripes.disk(b.size, b.count) for b in share.owned)
            assert not share.held and owned > 0 and service.stripes.pending_bytes() == owned
            await _complete(service, share.key)
            assert service.stripes.pending_bytes() == 0

    asyncio.run(run())


def test_a_share_on_demand_is_refused_where_evicting_could_not_make_its_room(
    tmp_path: Path, loopback: tuple[Path, str, Any]
) -> None:
    async def body(service: CacheService, url: str, other: Key) -> None:
        service.stripes.read_by({("ml", "other")})  # a pod on the node reads it: in use
        with pytest.raises(InsufficientSpace):
            await _on_demand(service, url)
        assert list(service.stripes._shares) == [other]  # kept, and imgs not held

    _beside_an_idle_copy(tmp_path, loopback, body)


def test_a_bundle_asked_of_the_peers_takes_free_room_only_with_the_evictions_headroom(tmp_path: Path) -> None:
    # a bundle fetched from peers alone evicts nothing; it still leaves the headroom every
    # other fill keeps (the eviction ratio), so that peers' bundles cannot fill the disk
    # to its last byte where a fetch from the store, for the same bytes, would evict first
    settings = Settings(root=tmp_path / "cache", node_name=NODE, sweep_interval=3600, capacity_bytes=10_000_000)
    key = ("imgs", "0" * 32)

    async def run() -> None:
        async with _service(settings) as service:
            space = service._space
            free = await space.free_bytes(exclude=key)
            assert free > 1_000_000
            with pytest.raises(InsufficientSpace, match="not free"):
                await space.make_room(key, free, how="free")  # free, but not with the headroom
            await space.make_room(key, math.floor(free / EVICT_RATIO), how="free")
            with pytest.raises(InsufficientSpace):  # the same rule as a fill that may evict
                await space.make_room(key, free, how="evict")

    asyncio.run(run())
