"""The rank-aware reader of a striped (or whole) dataset version, for training code.

Who calls it: training code inside a pod, as a plain Python iterable or (through
:meth:`StripedDataset.torch`) as a PyTorch ``IterableDataset``; torch is imported only when
that method is called, so ``import dsplatform.data`` needs nothing beyond the package's own
dependencies. ``tools/bench/reader.py`` measures it against plain ``open()``.

What it owns: one rank's pass over a version's samples (a sample is one file: its path and
its bytes). Which samples a rank reads, and in which order, is :mod:`dsplatform.stripe`'s
(:func:`~dsplatform.stripe.assign`, :func:`~dsplatform.stripe.epoch_order`): every sample
exactly once per epoch over all ranks, each rank's own node's buckets first, a seeded
shuffle per epoch (docs/design-striping.md#reader). That every rank assigns from the same
inputs is this module's (:func:`agree`: one all-gather of the ranks' nodes and placements),
and so is how the bytes are read:

- a bundle this node holds (its marker ``.stripe/done/<bundle digest>`` is in the share
  directory, or the whole version is local) is read with ``open()`` from the share
  directory, in the shuffled order;
- any other bundle is asked of the node's agent, ``GET /v1/stripes/<name>/<digest>/bundles/
  <bundle>``, which answers a plain tar of the verified files (it fetched them from the
  owner over the peer protocol, or from the store). The tar is read as a stream; only the
  bundle's own members, with the layout's sizes, are accepted; a rank's wanted files are
  held at most ``buffer_bytes`` at a time, shuffled within that window;
- when an answer breaks off, the bundle is asked again (of the same agent, then of the
  ``fallback`` endpoints) and the samples already given are skipped, so a failure costs
  time, never a sample skipped or read twice.

The agent's HTTP is spoken with the standard library (``http.client``, a unix socket or TCP),
because this package imports no web client (pyproject's import contracts).
"""

from __future__ import annotations

import http.client
import os
import random
import socket
import sys
import tarfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple
from urllib.parse import quote, urlsplit

from dsplatform.errors import Superseded, Unavailable
from dsplatform.stripe import LAYOUT_FILE, Assignment, Placement, StripeLayout, assign, epoch_order
from dsplatform.wire import readerenv

DONE_DIR = ".stripe/done"  # relative to the share directory; one empty file per held bundle
DEFAULT_BUFFER_BYTES = 256 << 20
_CHUNK = 1 << 20


class Sample(NamedTuple):
    """One file of the version: its position in path order, its relative path, its bytes. A
    named tuple, not a dataclass: built once per sample, it is the reader's hottest line."""

    position: int
    path: str
    data: bytes


class ReaderError(Unavailable):
    """The reader could not get a bundle from any endpoint (after its retries): worth retrying
    the epoch once an agent answers again."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class AgentEndpoint:
    """One agent to ask for bundles: ``unix:///path/to/socket`` or ``http://host:port``."""

    def __init__(self, address: str, *, token: str | None = None, timeout: float = 120.0) -> None:
        self.address = address
        self.token = token
        self.timeout = timeout
        parts = urlsplit(address)
        if parts.scheme == "unix":
            self._unix: str | None = parts.path
        elif parts.scheme == "http" and parts.hostname:
            self._unix = None
            self._host, self._port = parts.hostname, parts.port or 80
        else:
            raise ValueError(f"an agent endpoint is unix:///PATH or http://HOST:PORT, not {address!r}")

    def _connection(self) -> http.client.HTTPConnection:
        if self._unix is not None:
            return _UnixConnection(self._unix, self.timeout)
        return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)

    def open_bundle(self, name: str, digest: str, bundle: str) -> tuple[IO[bytes], Callable[[], None]]:
        """The plain tar of ``bundle`` and the call that closes it; ``Unavailable`` on a refusal,
        ``Superseded`` when the version is gone for good (410)."""
        conn = self._connection()
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        path = f"/v1/stripes/{quote(name, safe='')}/{digest}/bundles/{bundle}"
        try:
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
        except OSError as exc:
            conn.close()
            raise Unavailable(f"agent {self.address}: {exc}") from exc

        def close() -> None:
            response.close()  # holds the socket when the answer ends the connection
            conn.close()

        if response.status != 200:
            body = response.read(4096).decode("utf-8", "replace")
            close()
            if response.status == Superseded.http_status:  # gone for good: no retry brings it back
                raise Superseded(f"{name}@{digest[:12]}: the agent at {self.address} says: {body}")
            raise Unavailable(f"agent {self.address} answered {response.status} for bundle {bundle}: {body}")
        return response, close


def worker_part(
    order: Sequence[tuple[int, Sequence[int]]], worker: int, workers: int
) -> list[tuple[int, Sequence[int]]]:
    """Worker ``worker`` of ``workers``' part of a rank's epoch ``order`` (``(bundle, files)``
    pairs): whole bundles, so that a bundle read through the agent is streamed once, given
    to the workers largest first, each to the one with the fewest samples so far (the
    lowest index on a tie), then taken in the epoch's order. Bundles hold uneven counts
    (their boundaries follow the paths' hashes), and a worker left with more samples than
    the others ends the epoch alone: by position (``worker::workers``), two loader workers
    over the eight bundles of 5,000 JPEGs got 3,222 and 1,778 samples and decoded the epoch
    in 4.1 s; by this rule 2,451 and 2,549, in 3.2 s (``tools/bench/loader.py``)."""
    if workers == 1:
        return list(order)
    loads = [0] * workers
    mine: set[int] = set()
    for position in sorted(range(len(order)), key=lambda i: (-len(order[i][1]), i)):
        least = min(range(workers), key=lambda k: (loads[k], k))
        loads[least] += len(order[position][1])
        if least == worker:
            mine.add(position)
    return [pair for i, pair in enumerate(order) if i in mine]


#: an all-gather over a job's ranks: each passes one object and gets every rank's, by rank
Gather = Callable[[Any], list[Any]]


def agree(
    layout: StripeLayout, node: str | None, rank: int, world_size: int, gather: Gather
) -> tuple[StripeLayout, list[str | None]]:
    """The layout every rank uses and each rank's node, from one all-gather (two when the
    ranks' layouts differ). Every rank must call it, as any collective.

    Each rank loaded its layout file from its own node, and a group that changed (a member
    drained, a crash) can leave two nodes' files with different owners for a while. Ranks
    that assigned samples from different placements would read some samples twice and
    others never. So the ranks compare placement digests, and where they differ all take
    rank 0's. Where a bundle actually is does not change what a rank reads, only whether it
    comes from disk or through the agent (:meth:`StripedDataset.is_local`)."""
    placement = layout.placement
    got = gather((node, layout.name, layout.digest, placement.key()))
    if not isinstance(got, list) or len(got) != world_size:
        raise ReaderError(f"the gather gave {type(got).__name__} of {len(got) if isinstance(got, list) else '?'}")
    versions = sorted({(g[1], g[2]) for g in got})
    if len(versions) > 1:
        raise ReaderError(f"the ranks read different versions: {', '.join(f'{n} {d}' for n, d in versions)}")
    if len({g[3] for g in got}) > 1:
        chosen = gather(placement if rank == 0 else None)[0]
        if not isinstance(chosen, Placement):
            raise ReaderError("rank 0 sent no placement")
        layout = layout.placed(chosen)
    return layout, [g[0] for g in got]


def _process_group() -> Any:
    """``torch.distributed`` when the program imported it and initialised a process group
    (torch is never imported here)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def _all_gather(dist: Any) -> Gather:
    def gather(value: Any) -> list[Any]:
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, value)
        return out

    return gather


class StripedDataset:
    """Rank ``rank`` of ``world_size``'s samples of one version, an epoch at a time.

    ``layout`` is the version's :class:`~dsplatform.stripe.StripeLayout` (or the path of its
    layout file; by default ``<share_dir>/stripe-layout.jsonl``). ``share_dir`` holds this
    node's bundles as files; ``whole=True`` says every bundle is there (a whole cached
    version). ``agent`` (and ``fallback``) are asked for the others.

    Every rank must compute the same assignment, from the same placement and the same
    ``rank_nodes`` (``rank_nodes[r]`` names the node of rank ``r``). ``gather`` is an
    all-gather over the job's ranks (each rank passes an object and gets the list of all,
    by rank, as ``torch.distributed.all_gather_object`` gives): with it the ranks exchange
    their ``node`` and agree on one layout (:func:`agree`). Without it, and without
    ``rank_nodes``, no rank prefers its own node's bundles. :meth:`from_env` does all this
    from a pod's environment."""

    def __init__(
        self,
        share_dir: str | os.PathLike[str],
        *,
        rank: int = 0,
        world_size: int = 1,
        layout: StripeLayout | str | os.PathLike[str] | None = None,
        node: str | None = None,
        rank_nodes: Sequence[str | None] | None = None,
        gather: Gather | None = None,
        agent: AgentEndpoint | str | None = None,
        fallback: Sequence[AgentEndpoint | str] = (),
        seed: int = 0,
        epoch: int = 0,
        whole: bool = False,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        retries: int = 3,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        self.share_dir = Path(share_dir)
        if not isinstance(layout, StripeLayout):
            with open(layout or self.share_dir / LAYOUT_FILE, "rb") as stream:
                layout = StripeLayout.load(stream)
        if gather is not None and world_size > 1:
            layout, gathered = agree(layout, node, rank, world_size, gather)
            if rank_nodes is None:
                rank_nodes = gathered
        if rank_nodes is None:  # a rank knows only its own node: no preference, the same for all
            rank_nodes = [node] if world_size == 1 else [None] * world_size
        self.layout = layout
        self.rank = rank
        self.world_size = world_size
        self.assignment: Assignment = assign(layout, world_size, rank_nodes)
        endpoints = [agent] if agent is not None else []
        endpoints.extend(fallback)
        self.endpoints = [e if isinstance(e, AgentEndpoint) else AgentEndpoint(e) for e in endpoints]
        self.seed = seed
        self.epoch = epoch
        self.whole = whole
        self.buffer_bytes = buffer_bytes
        self.retries = retries
        self.stats = {"local_bytes": 0, "agent_bytes": 0, "retries": 0}

    @classmethod
    def from_env(
        cls,
        name: str | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        gather: Gather | None = None,
        environ: Mapping[str, str] | None = None,
        **options: Any,
    ) -> StripedDataset:
        """The reader of striped dataset ``name`` (by default the only one) in a pod the
        admission webhook wired (:mod:`dsplatform.wire.readerenv`: the share, the agent's
        socket, the node's name).

        ``rank`` and ``world_size`` default to ``torch.distributed``'s when the program has
        initialised a process group, then to ``RANK`` and ``WORLD_SIZE`` (as ``torchrun``
        sets them), then to 0 of 1. With a process group, the ranks exchange their nodes
        and agree on one layout through ``all_gather_object``; without one, pass ``gather``
        for locality. Other keyword arguments go to the constructor."""
        env = os.environ if environ is None else environ
        shares, socket_path, node = readerenv.from_environ(env)
        share = readerenv.share_named(shares, name)
        dist = _process_group()
        if dist is not None:
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
            gather = gather or _all_gather(dist)
        rank = int(env.get("RANK", "0")) if rank is None else rank
        world_size = int(env.get("WORLD_SIZE", "1")) if world_size is None else world_size
        if socket_path is not None:
            options.setdefault("agent", f"unix://{socket_path}")
        options.setdefault("node", node)
        reader = cls(share.share_dir, rank=rank, world_size=world_size, gather=gather, **options)
        if (reader.layout.name, reader.layout.digest) != (share.name, share.digest):
            raise ReaderError(
                f"the layout in {share.share_dir} is of {reader.layout.name} {reader.layout.digest},"
                f" not of {share.name} {share.digest}"
            )
        return reader

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.assignment.samples(self.rank)

    def is_local(self, bundle_digest: str) -> bool:
        return self.whole or (self.share_dir / DONE_DIR / bundle_digest).exists()

    def __iter__(self) -> Iterator[Sample]:
        return self.samples()

    def samples(self, worker: int = 0, workers: int = 1) -> Iterator[Sample]:
        """This rank's samples for the current epoch; with ``workers`` > 1 only one DataLoader
        worker's part of them (:func:`worker_part`: whole bundles, even sample counts)."""
        if not 0 <= worker < workers:
            raise ValueError(f"worker {worker} is not in 0..{workers - 1}")
        order = epoch_order(self.layout, self.assignment, self.rank, seed=self.seed, epoch=self.epoch)
        for bi, files in worker_part(order, worker, workers):
            bundle = self.layout.bundles[bi]
            if self.is_local(bundle.digest):
                yield from self._local(files)
            else:
                yield from self._remote(bi, files)

    def _local(self, files: Sequence[int]) -> Iterator[Sample]:
        paths, root = self.layout.paths, f"{self.share_dir}/"
        got = 0
        try:
            for index in files:
                path = paths[index]
                with open(root + path, "rb") as f:
                    data = f.read()
                got += len(data)
                yield Sample(index, path, data)
        finally:
            self.stats["local_bytes"] += got

    def _remote(self, bi: int, files: Sequence[int]) -> Iterator[Sample]:
        """A bundle through the agent: streamed, filtered, shuffled within a bounded buffer,
        asked again from where it broke off (the samples given are remembered)."""
        bundle = self.layout.bundles[bi]
        wanted = {self.layout.paths[i]: i for i in files}
        given: set[int] = set()
        rng = random.Random(f"{self.seed}/{self.epoch}/{bundle.digest}/{self.rank}")
        endpoints = self.endpoints
        if not endpoints:
            raise ReaderError(f"bundle {bundle.digest} is not held on this node and no agent endpoint is set")
        attempts = (self.retries + 1) * len(endpoints)
        for attempt in range(attempts):
            try:
                yield from self._stream(endpoints[attempt % len(endpoints)], bi, wanted, given, rng)
                return
            except (Unavailable, OSError, tarfile.TarError, http.client.HTTPException, _Broken) as exc:
                self.stats["retries"] += 1
                if attempt + 1 == attempts:
                    raise ReaderError(f"bundle {bundle.digest}: {exc}") from exc
                time.sleep(min(2.0, 0.1 * (attempt + 1)))

    def _stream(
        self,
        endpoint: AgentEndpoint,
        bi: int,
        wanted: dict[str, int],
        given: set[int],
        rng: random.Random,
    ) -> Iterator[Sample]:
        bundle = self.layout.bundles[bi].digest
        members = dict(self.layout.files(self.layout.bundles[bi]))
        body, close = endpoint.open_bundle(self.layout.name, self.layout.digest, bundle)
        buffer: list[Sample] = []
        held = 0
        seen = 0
        try:
            with tarfile.open(fileobj=body, mode="r|") as tar:
                for member in tar:
                    expected = members.get(member.name)
                    if not member.isreg() or expected is None or member.size != expected:
                        raise _Broken(f"bundle {bundle}: unexpected member {member.name!r}")
                    seen += 1
                    index = wanted.get(member.name)
                    if index is None or index in given:
                        continue  # another rank's sample, or one given before a retry
                    extracted = tar.extractfile(member)
                    assert extracted is not None  # a regular file
                    data = extracted.read()
                    if len(data) != expected:
                        raise _Broken(f"bundle {bundle}: {member.name!r} cut short")
                    buffer.append(Sample(index, member.name, data))
                    held += len(data)
                    if held >= self.buffer_bytes:
                        yield from self._drain(buffer, given, rng)
                        held = 0
            if seen != len(members):
                raise _Broken(f"bundle {bundle}: {seen} of {len(members)} files arrived")
            yield from self._drain(buffer, given, rng)
        finally:
            close()

    def _drain(self, buffer: list[Sample], given: set[int], rng: random.Random) -> Iterator[Sample]:
        rng.shuffle(buffer)
        while buffer:
            sample = buffer.pop()
            given.add(sample.position)
            self.stats["agent_bytes"] += len(sample.data)
            yield sample

    def torch(self) -> Any:
        """This reader as a ``torch.utils.data.IterableDataset`` (torch imported here, not
        before). DataLoader workers split the rank's bundles among themselves."""
        from torch.utils.data import IterableDataset, get_worker_info

        reader = self

        class _Torch(IterableDataset):  # type: ignore[misc,type-arg,unused-ignore]
            def __iter__(self) -> Iterator[Sample]:
                info = get_worker_info()
                if info is None:
                    return reader.samples()
                return reader.samples(info.id, info.num_workers)

            def __len__(self) -> int:
                return len(reader)

            def set_epoch(self, epoch: int) -> None:
                reader.set_epoch(epoch)

        return _Torch()


class _Broken(Exception):
    """An answer that broke the bundle's contract (asked again, never passed on)."""


__all__ = ["AgentEndpoint", "DONE_DIR", "Gather", "ReaderError", "Sample", "StripedDataset", "agree"]
