"""One bundle read from the store as byte ranges over several links (docs/design.md#links).

Loopback addresses 127.0.0.2-4 stand for the node's NICs (they all route to ``lo`` on
Linux, and a server sees which one a connection came from). The store is a real HTTP
server with ``Range`` support (:mod:`tools.support.ranged_http`) or a real S3 server (moto),
the unpack is the agent's own, and every file is verified by digest.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
import tracemalloc
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from dsagent.cache.fetch import Source, fetch_bundles, finish
from dsagent.cache.fetchlinks import RANGE_MIN, LinkSet
from dsagent.cache.fetchranges import CHUNK, Ranged, range_plan, spool_bound, unpack_ranged
from dsagent.cache.progress import FetchProgress
from dsagent.cache.settings import Settings
from dsagent.format.bundles.bundle import pack, verify_tree
from dsagent.format.bundles.extract import STAGING_DIR
from dsagent.format.manifest import Manifest
from tests.dsagent.conftest import write_tree
from tools.support.harness import wait_ready
from tools.support.ranged_http import RangedServer, RangedServerProcess, Request

pytest.importorskip("aiohttp")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="127.0.0.0/8 routes to lo on Linux only")

LINKS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
#: incompressible, so that the one bundle is about 3 MiB on the wire as well
FILES = {f"shard{i % 3}/part{i:03d}.bin": os.urandom(60_000 + 977 * i) for i in range(48)}
MIN = 256 << 10  # the smallest range here: the bundle splits into 3


@pytest.fixture
def packed(tmp_path: Path) -> tuple[Path, Manifest]:
    www = tmp_path / "www"
    write_tree(www / "src", FILES)
    manifest = pack(www / "src", www / "store", name="one")
    assert len(manifest.bundles) == 1 and manifest.bundles[0].compressed_size > 3 * MIN
    return www, manifest


@pytest.fixture
def server(packed: tuple[Path, Manifest]) -> Iterator[RangedServer]:
    found = RangedServer(packed[0])
    yield found
    found.close()


def _fetch(url: str, manifest: Manifest, staging: Path, links: LinkSet | None, options: Any = None) -> FetchProgress:
    staging.mkdir(parents=True, exist_ok=True)
    progress = FetchProgress(manifest.total_bytes, manifest.file_count)

    async def record(bundle: Any) -> None:
        pass

    async def run() -> None:
        with ThreadPoolExecutor(2) as pool:
            await fetch_bundles(
                Source(f"{url}/src", f"{url}/store", options), manifest, staging, done=set(), on_bundle_done=record,
                progress=progress, executor=pool, workers=2, links=links,
            )  # fmt: skip

    asyncio.run(run())
    finish(staging, manifest)
    verify_tree(staging, manifest)  # every file there, each by its digest
    assert progress.bytes_done == manifest.total_bytes and progress.files_done == manifest.file_count
    return progress


def _bundle_gets(server: RangedServer) -> list[Request]:
    """The server's answers to the bundle's GETs (each recorded once its body ended)."""
    deadline = time.monotonic() + 5
    while True:
        gets = server.requests(lambda r: r.method == "GET" and "/bundles/" in r.path)
        if time.monotonic() > deadline or all(r.status != 206 or r.sent for r in gets):
            return gets
        time.sleep(0.05)


def test_a_one_bundle_version_goes_over_every_link_as_byte_ranges(
    server: RangedServer, packed: tuple[Path, Manifest], tmp_path: Path
) -> None:
    _, manifest = packed
    size = manifest.bundles[0].compressed_size
    links = LinkSet(LINKS, range_min=MIN)
    _fetch(server.url, manifest, tmp_path / "staging", links)
    gets = _bundle_gets(server)
    assert {r.client for r in gets} == set(LINKS), f"the store saw {[(r.client, r.range) for r in gets]}"
    assert all(r.status == 206 for r in gets) and len(gets) == 3, "one range per link, nothing asked twice"
    plan = range_plan(size, 1, 3, MIN)
    assert sorted((r.start, r.start + r.sent) for r in gets) == list(plan), "the ranges cover the bundle once"
    assert {r.client: r.start for r in gets}["127.0.0.2"] == 0, "the first link listed streams the first range"
    assert links.ranges == dict.fromkeys(LINKS, 1)
    assert sum(links.range_bytes.values()) == size
    assert sum(links.bytes.values()) == manifest.total_bytes and sum(links.bundles.values()) == 1
    assert not links.set_aside
    assert not any((tmp_path / "staging" / STAGING_DIR).glob("*")), "no spool left"


@pytest.mark.parametrize("bad", ["127.0.0.2", "127.0.0.3"], ids=["streamed range", "spooled range"])
def test_a_link_failing_mid_range_is_asked_again_over_another(
    server: RangedServer, packed: tuple[Path, Manifest], tmp_path: Path, bad: str
) -> None:
    _, manifest = packed
    server.cut[bad] = 300_000  # every answer over it stops there
    links = LinkSet(LINKS, range_min=MIN)
    _fetch(server.url, manifest, tmp_path / "staging", links)  # every file verified
    gets = _bundle_gets(server)
    (cut,) = [r for r in gets if r.client == bad]
    assert cut.sent == 300_000
    end = cut.range.rsplit("-", 1)[1] if cut.range else None
    (again,) = [r for r in gets if r.client != bad and r.range and r.range.endswith(f"-{end}") and r is not cut]
    assert cut.start <= again.start <= cut.start + cut.sent, "asked again from where it stopped, over another link"
    assert again.status == 206 and again.start + again.sent == int(end or 0) + 1
    assert set(links.set_aside) == {bad}, "set aside: another link delivered what it failed"
    assert links.ranges[bad] == 0 and links.range_bytes[bad] <= 300_000
    assert sum(links.range_bytes.values()) == manifest.bundles[0].compressed_size
    assert sum(links.bytes.values()) == manifest.total_bytes


def test_a_range_failing_over_two_links_falls_back_to_one_stream(
    server: RangedServer, packed: tuple[Path, Manifest], tmp_path: Path
) -> None:
    """Every answer from the second range on is cut, over every link: the ranges fail (each
    over two links), and the bundle is read in one stream from its start."""
    _, manifest = packed
    size = manifest.bundles[0].compressed_size
    server.cut["*"], server.cut_from = 100_000, 1
    links = LinkSet(LINKS, range_min=MIN)
    _fetch(server.url, manifest, tmp_path / "staging", links)  # the one stream over .2 delivers it
    gets = _bundle_gets(server)
    assert [(r.client, r.start) for r in gets if r.sent == size] == [("127.0.0.2", 0)], "one stream, the lease's link"
    assert any(r.start > 0 and r.sent == 100_000 for r in gets), "ranges were asked, and cut"
    assert sum(links.ranges.values()) == 0 and links.bundles == {"127.0.0.2": 1, "127.0.0.3": 0, "127.0.0.4": 0}
    assert sum(links.bytes.values()) == manifest.total_bytes


def test_a_server_without_ranges_gets_one_stream(packed: tuple[Path, Manifest], tmp_path: Path) -> None:
    www, manifest = packed
    server = RangedServer(www, ranges=False)
    try:
        links = LinkSet(LINKS, range_min=MIN)
        _fetch(server.url, manifest, tmp_path / "staging", links)
        gets = _bundle_gets(server)
    finally:
        server.close()
    plan = range_plan(manifest.bundles[0].compressed_size, 1, 3, MIN)
    assert all(r.status == 200 for r in gets) and len(gets) == 2
    assert gets[0].range == f"bytes=0-{plan[0][1] - 1}", "the first range asked; the whole answer dropped"
    assert gets[1].sent == manifest.bundles[0].compressed_size, "then one stream"
    assert sum(links.ranges.values()) == 0 and sum(links.bundles.values()) == 1


def test_without_links_or_with_enough_bundles_nothing_is_ranged(
    server: RangedServer, packed: tuple[Path, Manifest], tmp_path: Path
) -> None:
    _, manifest = packed
    _fetch(server.url, manifest, tmp_path / "default", None)
    _fetch(server.url, manifest, tmp_path / "big", LinkSet(LINKS, range_min=manifest.bundles[0].compressed_size))
    gets = _bundle_gets(server)
    size = manifest.bundles[0].compressed_size
    assert [(r.start, r.sent) for r in gets] == [(0, size)] * 2, "the bundle whole, in one answer, each time"
    assert {r.client for r in gets} == {"127.0.0.1", "127.0.0.2"}


@pytest.fixture
def big(tmp_path: Path) -> tuple[Path, Manifest]:
    """A dataset of one 48 MB bundle (incompressible), packed under ``www``."""
    www = tmp_path / "www"
    write_tree(www / "src", {f"big/{i:02d}.bin": os.urandom(1 << 20) for i in range(48)})
    return www, pack(www / "src", www / "store", name="big")


@pytest.fixture
def server_apart(big: tuple[Path, Manifest]) -> Iterator[RangedServerProcess]:
    """The store in a process of its own, each answer capped at 32 MB/s: its threads and
    buffers are not this process's, so ``tracemalloc`` here counts the fetch alone."""
    with RangedServerProcess(big[0], rate=32 << 20) as found:
        yield found


@pytest.mark.slow  # the store is a process of its own
def test_the_spools_are_bounded_and_leave_nothing(
    server_apart: RangedServerProcess, big: tuple[Path, Manifest], tmp_path: Path
) -> None:
    """A 48 MB bundle in 3 ranges, each answer capped at 32 MB/s: the later ranges arrive
    while the first is unpacked. The disk their spools held is at most what
    :func:`spool_bound` reserved; memory holds a few chunks, never a range (16 MB): a chunk
    a range in flight, the read-ahead's and the decoder's, the one being written, about
    4 MB, and twice that when the writes fall behind on a loaded machine. The memory is
    that of the process's second fetch: what the first does once (import modules, start
    the HTTP client's event loop, open a filesystem and a session per link) is no spool's."""
    _, manifest = big
    (bundle,) = manifest.bundles
    minimum = 4 << 20
    plan = range_plan(bundle.compressed_size, 1, 3, minimum)
    assert len(plan) == 3
    url = f"{server_apart.url}/store"

    def fetch(staging: Path) -> Ranged:
        staging.mkdir()
        links = LinkSet(LINKS, range_min=minimum)
        with links.lease() as lease:
            assert lease.address is not None
            return unpack_ranged(url, None, manifest, bundle, staging, plan, links, lease.address)

    fetch(tmp_path / "first")
    staging = tmp_path / "staging"
    tracemalloc.start()
    try:
        done = fetch(staging)
        _, peak_memory = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    verify_tree(staging, manifest)
    bound = spool_bound(manifest, 3, minimum)
    assert bound == bundle.compressed_size - plan[0][1]
    assert bound // 2 < done.peak_spooled <= bound, f"spooled {done.peak_spooled} of at most {bound}"
    assert peak_memory < 12 * CHUNK < bound // 2, f"{peak_memory} bytes in memory at the peak"
    assert sorted(done.carried) == sorted(LINKS) and sum(done.carried.values()) == bundle.compressed_size
    assert not any((staging / STAGING_DIR).glob("*")), "the spools have no names to leave behind"


def test_an_s3_store_is_read_as_byte_ranges_over_every_link(s3: Any, tmp_path: Path) -> None:
    """moto logs each request with its client address: the three links each read a range."""
    s3.create_bucket("ranges")
    write_tree(tmp_path / "src", FILES)
    manifest = pack(tmp_path / "src", "s3://ranges/store", name="one", store_options=s3.options())
    links = LinkSet(LINKS, range_min=MIN)
    staging = tmp_path / "staging"
    staging.mkdir()
    progress = FetchProgress(manifest.total_bytes, manifest.file_count)

    async def record(bundle: Any) -> None:
        pass

    async def run() -> None:
        with ThreadPoolExecutor(2) as pool:
            await fetch_bundles(
                Source("s3://ranges/src", "s3://ranges/store", s3.options()), manifest, staging, done=set(),
                on_bundle_done=record, progress=progress, executor=pool, workers=2, links=links,
            )  # fmt: skip

    asyncio.run(run())
    finish(staging, manifest)
    verify_tree(staging, manifest)
    assert links.ranges == dict.fromkeys(LINKS, 1), links.ranges
    assert sum(links.range_bytes.values()) == manifest.bundles[0].compressed_size
    pattern = rf"^(127\.0\.0\.\d+) .*\"GET /ranges/store/bundles/{manifest.bundles[0].digest}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        gets = re.findall(pattern, Path(s3._log.name).read_text(), re.M)
        if len(gets) >= 3:
            break
        time.sleep(0.1)
    assert sorted(gets) == sorted(LINKS)


def test_an_agent_fetches_a_one_bundle_dataset_over_every_link(
    server: RangedServer, packed: tuple[Path, Manifest], agent_factory: Any
) -> None:
    """The agent's settings reach the fetch (DSAGENT_FETCH_RANGE_MIN), and its metrics say
    what each link carried."""
    _, manifest = packed
    env = {"DSAGENT_FETCH_LINKS": ",".join(LINKS), "DSAGENT_FETCH_RANGE_MIN": str(MIN)}
    agent = agent_factory("b", env=env)
    with agent.client() as client:
        client.submit_task("t1", [{"name": "one", "source": f"{server.url}/src", "bundles": f"{server.url}/store"}])
        record = wait_ready(client, "t1")
        text = client.metrics()
    assert record["state"] == "ready", record
    verify_tree(Path(record["datasets"][0]["path"]), manifest)
    ranges = dict(re.findall(r'dsplatform_agent_link_ranges_total\{link="([^"]+)"\} (\S+)', text))
    assert ranges == dict.fromkeys(LINKS, "1.0"), text
    carried = re.findall(r'dsplatform_agent_link_bytes_total\{link="[^"]+",source="store"\} (\S+)', text)
    assert sum(float(n) for n in carried) == manifest.total_bytes
    assert {r.client for r in _bundle_gets(server)} == set(LINKS)


# --------------------------------------------------------------------------- the parts


def test_the_plan() -> None:
    mib = 1 << 20
    plan = range_plan(800 * mib, 1, 3, 64 * mib)  # a dataset of one 800 MiB bundle over 3 links
    assert [b - a for a, b in plan] == [279_620_267] * 2 + [279_620_266]
    assert plan[0][0] == 0 and plan[-1][1] == 800 * mib
    assert len(range_plan(800 * mib, 2, 5, 64 * mib)) == 2, "links // bundles each"
    assert len(range_plan(200 * mib, 1, 8, 64 * mib)) == 3, "no range under the minimum"
    assert range_plan(127 * mib, 1, 8, 64 * mib) == (), "under two minimums: one stream"
    assert range_plan(800 * mib, 3, 3, 64 * mib) == (), "as many bundles as links: one link each"
    assert range_plan(800 * mib, 2, 3, 64 * mib) == (), "3 // 2: one link each"


def test_the_range_minimum_setting() -> None:
    assert Settings().fetch_range_min == RANGE_MIN == 64 << 20
    assert Settings.from_env({"DSAGENT_FETCH_RANGE_MIN": "256KiB"}).fetch_range_min == 256 << 10
    with pytest.raises(Exception, match="FETCH_RANGE_MIN"):
        Settings.from_env({"DSAGENT_FETCH_RANGE_MIN": "0"})
