"""The rank-aware reader on its own: local bundles from disk, the others from a loopback HTTP
server speaking the agent's stripe route (plain tar), one that breaks off mid-bundle, one that
lies; and the PyTorch adapter with DataLoader workers (when torch is installed)."""

from __future__ import annotations

import http.server
import io
import os
import subprocess
import sys
import tarfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import xxhash

from dsplatform.data import DONE_DIR, ReaderError, StripedDataset
from dsplatform.stripe import StripeLayout

NODES = ["a", "b"]


def _make(tmp_path: Path, bundles: int = 12, per: int = 6) -> tuple[StripeLayout, dict[str, bytes]]:
    files: dict[str, bytes] = {}
    index, paths, sizes = [], [], []
    for b in range(bundles):
        first = len(paths)
        for f in range(per):
            path = f"d{b:02d}/s{f}.bin"
            data = os.urandom(50 + 13 * f + b)
            files[path] = data
            paths.append(path)
            sizes.append(len(data))
        index.append((xxhash.xxh3_128_hexdigest(f"b{b}".encode()), first, per, sum(sizes[first:])))
    layout = StripeLayout.create("ds", xxhash.xxh3_128_hexdigest(b"v"), NODES, index, paths, sizes)
    share = tmp_path / "share"
    for bundle in layout.held_by("a"):
        for path, _ in layout.files(bundle):
            (share / path).parent.mkdir(parents=True, exist_ok=True)
            (share / path).write_bytes(files[path])
        (share / DONE_DIR).mkdir(parents=True, exist_ok=True)
        (share / DONE_DIR / bundle.digest).touch()
    (share / "stripe-layout.jsonl").write_bytes(layout.dumps())
    return layout, files


class _Agent(http.server.ThreadingHTTPServer):
    """Serves ``/v1/stripes/<name>/<digest>/bundles/<bundle>`` as the agent does: a plain tar.
    ``break_after`` cuts the first answer of each bundle after that many members; ``lie`` adds
    a member the bundle does not have."""

    def __init__(
        self, layout: StripeLayout, files: dict[str, bytes], break_after: int | None = None, lie: bool = False
    ):
        self.layout, self.files, self.break_after, self.lie = layout, files, break_after, lie
        self.asked: Counter[str] = Counter()
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Agent

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:
        digest = self.path.rsplit("/", 1)[-1]
        self.server.asked[digest] += 1
        bundle = next(b for b in self.server.layout.bundles if b.digest == digest)
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            members = self.server.layout.files(bundle)
            if self.server.lie:
                members = [("d99/evil.bin", 3), *members]
            for n, (path, size) in enumerate(members):
                if (
                    self.server.break_after is not None
                    and self.server.asked[digest] == 1
                    and n == self.server.break_after
                ):
                    break
                info = tarfile.TarInfo(path)
                info.size = size
                tar.addfile(info, io.BytesIO(self.server.files.get(path, b"xyz")))
        body = out.getvalue()
        if self.server.break_after is not None and self.server.asked[digest] == 1:
            body = body[: len(body) - 2048]  # no end-of-archive: the stream breaks off
        self.send_response(200)
        self.send_header("Content-Type", "application/x-tar")
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[StripeLayout, dict[str, bytes], Path]]:
    layout, files = _make(tmp_path)
    yield layout, files, tmp_path / "share"


def _all(readers: list[StripedDataset], files: dict[str, bytes]) -> Counter[str]:
    seen: Counter[str] = Counter()
    for reader in readers:
        for sample in reader:
            assert sample.data == files[sample.path]
            seen[sample.path] += 1
    return seen


def test_the_layout_file_in_the_share_is_found_and_local_bundles_are_read_from_disk(setup) -> None:  # type: ignore[no-untyped-def]
    layout, files, share = setup
    agent = _Agent(layout, files)
    reader = StripedDataset(share, rank=0, world_size=1, node="a", agent=agent.url)
    seen = _all([reader], files)
    assert set(seen) == set(files) and set(seen.values()) == {1}
    local = sum(b.size for b in layout.held_by("a"))
    assert reader.stats["local_bytes"] == local
    assert reader.stats["agent_bytes"] == layout.total_bytes - local
    assert set(agent.asked) == {b.digest for b in layout.held_by("b")}
    assert len(reader) == len(files)
    agent.close()


def test_two_ranks_share_the_epoch_exactly_once(setup) -> None:  # type: ignore[no-untyped-def]
    layout, files, share = setup
    agent = _Agent(layout, files)
    readers = [StripedDataset(share, rank=r, world_size=2, rank_nodes=NODES, agent=agent.url, epoch=4) for r in (0, 1)]
    seen = _all(readers, files)
    assert set(seen) == set(files) and set(seen.values()) == {1}
    assert abs(len(readers[0]) - len(readers[1])) <= 1
    agent.close()


def test_ranks_that_each_know_only_their_own_node_still_read_every_sample_once(setup) -> None:  # type: ignore[no-untyped-def]
    """Without ``rank_nodes`` or a gather, a rank cannot know where the others run: all ranks
    assign with no preference, so they agree. (Had each preferred its own node, these four
    ranks on two nodes would each have read half the samples twice and the rest never.)"""
    layout, files, share = setup
    agent = _Agent(layout, files)
    readers = [StripedDataset(share, rank=r, world_size=4, node=NODES[r % 2], agent=agent.url) for r in range(4)]
    seen = _all(readers, files)
    assert set(seen) == set(files) and set(seen.values()) == {1}
    agent.close()


class _Gather:
    """A real all-gather among threads, one per rank, as ``all_gather_object`` behaves."""

    def __init__(self, world_size: int) -> None:
        self.slots: list[Any] = [None] * world_size
        self.barrier = threading.Barrier(world_size, timeout=10)
        self.calls = 0

    def of(self, rank: int) -> Any:
        def gather(value: Any) -> list[Any]:
            self.slots[rank] = value
            self.barrier.wait()
            out = list(self.slots)
            self.calls += rank == 0
            self.barrier.wait()
            return out

        return gather


def ranks_in_threads(make: Any, world_size: int) -> list[Any]:
    """``make(rank, gather)`` on one thread per rank; what each returned or raised."""
    gather = _Gather(world_size)
    out: list[Any] = [None] * world_size

    def run(rank: int) -> None:
        try:
            out[rank] = make(rank, gather.of(rank))
        except Exception as exc:  # noqa: BLE001 - handed back to the test
            out[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    out.append(gather.calls)
    return out


def test_ranks_exchange_their_nodes_and_read_their_own_nodes_bundles(setup) -> None:  # type: ignore[no-untyped-def]
    from dsplatform.stripe import assign

    layout, files, share = setup
    agent = _Agent(layout, files)
    *readers, calls = ranks_in_threads(
        lambda r, g: StripedDataset(share, rank=r, world_size=2, node=NODES[r], gather=g, agent=agent.url), 2
    )
    assert calls == 1  # one exchange: the layouts agreed
    assert all(r.assignment == assign(layout, 2, NODES) for r in readers)
    for rank, reader in enumerate(readers):
        owners = {layout.bundles[bi].owner for bi, _ in reader.assignment.ranks[rank]}
        assert owners == {NODES[rank]}  # even bundle counts per node: all local
    seen = _all(readers, files)
    assert set(seen) == set(files) and set(seen.values()) == {1}
    agent.close()


def test_ranks_whose_layout_files_differ_agree_on_rank_0s(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A group change reached one node's layout file before the other's: rank 1 sees member
    ``c`` where rank 0 still sees ``b``. Both take rank 0's placement, so the epoch still
    gives every sample exactly once; where a bundle actually is only decides disk or agent."""
    layout, files, share = setup
    index = [(b.digest, b.first, b.count, b.size) for b in layout.bundles]
    changed = StripeLayout.create(layout.name, layout.digest, ["a", "c"], index, layout.paths, layout.sizes)
    assert changed.placement.key() != layout.placement.key()
    agent = _Agent(layout, files)
    own = [layout, changed]
    *readers, calls = ranks_in_threads(
        lambda r, g: StripedDataset(
            share, rank=r, world_size=2, layout=own[r], node=["a", "c"][r], gather=g, agent=agent.url
        ),
        2,
    )
    assert calls == 2  # the second round carried rank 0's placement
    assert readers[0].layout.placement == readers[1].layout.placement == layout.placement
    seen = _all(readers, files)
    assert set(seen) == set(files) and set(seen.values()) == {1}
    agent.close()


def test_ranks_reading_different_versions_all_stop_with_a_clear_error(setup) -> None:  # type: ignore[no-untyped-def]
    layout, files, share = setup
    index = [(b.digest, b.first, b.count, b.size) for b in layout.bundles]
    other = StripeLayout.create(layout.name, xxhash.xxh3_128_hexdigest(b"w"), NODES, index, layout.paths, layout.sizes)
    own = [layout, other]
    *errors, _ = ranks_in_threads(lambda r, g: StripedDataset(share, rank=r, world_size=2, layout=own[r], gather=g), 2)
    assert all(isinstance(e, ReaderError) and "different versions" in str(e) for e in errors)


def test_the_reader_is_built_from_the_pods_environment(setup) -> None:  # type: ignore[no-untyped-def]
    from dsplatform.errors import InvalidInput
    from dsplatform.wire import readerenv

    layout, files, share = setup
    mine = readerenv.Share(layout.name, layout.digest, str(share))
    environ = {
        "DSAGENT_STRIPES": readerenv.encode([mine]),
        "DSAGENT_SOCKET": "/dsagent-run/agent.sock",
        "DSAGENT_NODE_NAME": "b",
        "RANK": "1",
        "WORLD_SIZE": "2",
    }
    reader = StripedDataset.from_env(environ=environ, seed=5)
    assert (reader.rank, reader.world_size, reader.seed) == (1, 2, 5)
    assert reader.endpoints[0].address == "unix:///dsagent-run/agent.sock"
    assert reader.share_dir == share
    solo = StripedDataset.from_env(environ={"DSAGENT_STRIPES": environ["DSAGENT_STRIPES"]}, agent="http://x")
    assert (solo.rank, solo.world_size) == (0, 1)
    assert solo.assignment.ranks[0]  # one rank: every sample, its node's bundles first
    two = readerenv.encode([mine, readerenv.Share("other", layout.digest, "/elsewhere")])
    with pytest.raises(InvalidInput, match="name the one"):
        StripedDataset.from_env(environ={"DSAGENT_STRIPES": two})
    assert StripedDataset.from_env(layout.name, environ={"DSAGENT_STRIPES": two}).share_dir == share
    stale = readerenv.encode([readerenv.Share(layout.name, xxhash.xxh3_128_hexdigest(b"w"), str(share))])
    with pytest.raises(ReaderError, match="not of ds"):
        StripedDataset.from_env(environ={"DSAGENT_STRIPES": stale})
    for hostile in ('{"name": "ds"}', '[{"name": "../x", "digest": "0", "shareDir": "/s"}]', "[" * 100, "x"):
        with pytest.raises(InvalidInput):
            StripedDataset.from_env(environ={"DSAGENT_STRIPES": hostile})


def test_a_stream_broken_off_is_asked_again_without_repeating_a_sample(setup) -> None:  # type: ignore[no-untyped-def]
    layout, files, share = setup
    agent = _Agent(layout, files, break_after=3)
    reader = StripedDataset(share, rank=0, world_size=1, node="a", agent=agent.url, buffer_bytes=1)
    seen = _all([reader], files)
    assert set(seen) == set(files) and set(seen.values()) == {1}
    assert reader.stats["retries"] == len(layout.held_by("b"))
    agent.close()


def test_a_lying_agent_is_never_passed_on(setup) -> None:  # type: ignore[no-untyped-def]
    layout, files, share = setup
    liar = _Agent(layout, files, lie=True)
    honest = _Agent(layout, files)
    reader = StripedDataset(share, rank=0, world_size=1, node="a", agent=liar.url, fallback=[honest.url], retries=0)
    seen = _all([reader], files)
    assert set(seen.values()) == {1} and "d99/evil.bin" not in seen
    alone = StripedDataset(share, rank=0, world_size=1, node="a", agent=liar.url, retries=1)
    with pytest.raises(ReaderError, match="unexpected member"):
        _all([alone], files)
    liar.close()
    honest.close()


def test_without_an_agent_a_missing_bundle_is_a_clear_error(setup) -> None:  # type: ignore[no-untyped-def]
    layout, files, share = setup
    with pytest.raises(ReaderError, match="no agent endpoint"):
        _all([StripedDataset(share, node="a")], files)
    whole = StripedDataset(share, node="a", whole=True)
    with pytest.raises(FileNotFoundError):  # whole=True promises every file is there
        _all([whole], files)


def test_importing_the_reader_does_not_import_torch() -> None:
    code = "import sys, dsplatform.data; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_torch_adapter_splits_bundles_over_dataloader_workers(setup) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    layout, files, share = setup
    agent = _Agent(layout, files)
    reader = StripedDataset(share, rank=0, world_size=1, node="a", agent=agent.url)
    dataset = reader.torch()
    assert isinstance(dataset, torch.utils.data.IterableDataset) and len(dataset) == len(files)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    seen = Counter(sample.path for sample in loader)
    assert set(seen) == set(files) and set(seen.values()) == {1}
    dataset.set_epoch(1)
    assert reader.epoch == 1
    agent.close()


def test_dataloader_workers_take_whole_bundles_with_even_sample_counts(setup) -> None:  # type: ignore[no-untyped-def]
    from dsplatform.data import worker_part

    layout, files, share = setup
    agent = _Agent(layout, files)
    reader = StripedDataset(share, rank=0, world_size=1, node="a", agent=agent.url)
    for workers in (2, 3):
        parts = [list(reader.samples(w, workers)) for w in range(workers)]
        seen = Counter(sample.path for part in parts for sample in part)
        assert set(seen) == set(files) and set(seen.values()) == {1}
        assert all(sample.data == files[sample.path] for part in parts for sample in part)
    agent.close()
    # uneven bundles: largest first, each to the least loaded worker, in the epoch's order
    order = [(0, range(9)), (1, range(1)), (2, range(5)), (3, range(4)), (4, range(6)), (5, range(2))]
    parts = [worker_part(order, w, 2) for w in range(2)]
    assert [[b for b, _ in part] for part in parts] == [[0, 1, 3], [2, 4, 5]]
    assert [sum(len(f) for _, f in part) for part in parts] == [14, 13]
    assert worker_part(order, 0, 1) == order
    with pytest.raises(ValueError):
        list(reader.samples(2, 2))
