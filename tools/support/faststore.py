"""An S3-compatible store on loopback that is not the bottleneck of a benchmark.

``moto`` (:mod:`tools.support.s3server`) is a faithful S3 for correctness tests, but it is one
Python process that spends milliseconds per request: a per-file tool against it measures
moto. This store serves objects from memory, from several worker processes, and models
the two properties of a real store that matter to time to ready:

- a first-byte latency (``latency_ms``): every response, 503s included, starts this long
  after its request was read;
- a request-rate limit per prefix (``get_rate`` GET/HEAD requests per second), with S3's
  answer past it: ``503 SlowDown``, which the SDKs and CLIs retry with backoff.

Defaults and their sources:

- ``DEFAULT_GET_RATE = 5500``: "at least 3,500 PUT/COPY/POST/DELETE or 5,500 GET/HEAD
  requests per second per partitioned Amazon S3 prefix" (Amazon S3 User Guide, "Best
  practices design patterns: optimizing Amazon S3 performance",
  https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html).
  S3 partitions a busy prefix further over time; a fresh one starts at this rate.
- ``DEFAULT_LATENCY_MS = 10``: the low end of "small requests (for example, less than
  512 KB), where median latencies are often in the tens of milliseconds range" (AWS
  whitepaper "Best Practices Design Patterns: Optimizing Amazon S3 Performance", section
  "Timeouts and Retries for Latency-Sensitive Applications",
  https://docs.aws.amazon.com/whitepapers/latest/s3-optimizing-performance-best-practices/timeouts-and-retries-for-latency-sensitive-applications.html).
  The often-quoted "100-200 ms to the first byte" comes from training material, not from
  an AWS documentation page we could find; the benchmark runs at 0, 10 and 30 ms anyway.
- ``prefix_depth = 1``: the rate-limit prefix is the key's first ``/``-separated component
  (``ds-raw/`` for ``ds-raw/n00001/0000001.JPEG``): a dataset under one prefix, as a
  fresh upload is before S3 has split it. A modelling choice, not an S3 figure.
- ``burst_s = 0.1``: a bucket holds at most 0.1 s of requests, so a burst past the rate
  is refused within 0.1 s. A modelling choice (S3 documents no burst).

The limit is one token bucket per prefix shared by all worker processes (shared memory
under one lock, keyed by CRC-32 of the prefix into ``_SLOTS`` slots: two prefixes that
collide share a bucket, which only throttles more). LIST requests are not limited.

What it serves (path style only, ``http://127.0.0.1:PORT/BUCKET/KEY``): GET with
``Range`` (``bytes=a-b``, ``a-``, ``-n``), HEAD, ListObjectsV2 (``prefix``, ``delimiter``,
``max-keys`` up to 1000, ``continuation-token``, ``start-after``, ``encoding-type=url``),
ListObjects (v1, ``marker``), HeadBucket, GetBucketLocation and ListBuckets. Signatures are
not checked (any ``Authorization`` is accepted). Objects are loaded before the workers start
(:meth:`FastStore.add_tree`, :meth:`FastStore.add_object`) into one shared anonymous
mapping, so the workers share one copy; PUT is refused (501): with several processes a
write would have to reach every worker's index, and the benchmarks load their data
directly instead. ``GET /_faststore/stats`` returns the counters as JSON.

Why a hand-rolled HTTP/1.1 loop on stdlib asyncio rather than aiohttp (which the lock has)
or uvloop (which it has not): the store's cost per request is what the benchmark must keep
small, and a ``Protocol`` that parses only the request line and the four headers it needs
does several times fewer Python operations per request than a general server. Requests
on a connection are answered in order (no pipelining); large bodies are written in 1 MiB
pieces under the transport's flow control.

The workers share one listening socket (inherited, not ``SO_REUSEPORT``): an idle worker
accepts the next connection, so connections are not hashed onto a busy worker.

Capacity: :func:`measure_capacity` drives small GETs from a raw keep-alive client in its own
process on the same machine, so on a small machine the client and the store share the
CPUs and the figure is a lower bound on what the store serves. ``DECLARED_CAPACITY_PER_WORKER`` is the
conservative rate per worker process that the benchmarks expect of the store.

    python -m tools.support.faststore --tree bench=DIR --latency-ms 10   # serve DIR as bucket bench
    python -m tools.support.faststore --measure                          # its capacity here
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import ctypes
import email.utils
import hashlib
import json
import mmap
import multiprocessing
import os
import socket
import time
import zlib
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote
from xml.sax.saxutils import escape

#: GET/HEAD requests per second per prefix (the S3 User Guide's figure, above)
DEFAULT_GET_RATE = 5500.0
#: first-byte latency, ms (the whitepaper's "tens of milliseconds", its low end)
DEFAULT_LATENCY_MS = 10.0
#: small GETs per second per worker process that the store promises (tools/bench/ready.py says
#: when a run measured less, since then the store may bound that run); 2 workers measured
#: 6,000-60,000 in all on a 2-core machine shared with its client and, at the low end, a test run
DECLARED_CAPACITY_PER_WORKER = 3000.0
_SLOTS = 4096
_CHUNK = 1 << 20
_STATS = ("requests", "get", "head", "list", "throttled", "errors", "bytes_out", "cpu_s")
_NS = len(_STATS)


@dataclass(frozen=True)
class _Obj:
    offset: int
    size: int
    etag: str
    modified: str  # HTTP date
    iso: str  # ListBucketResult's LastModified


def _http_date(ts: float) -> str:
    return email.utils.formatdate(ts, usegmt=True)


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts))


class FastStore:
    """The store, its workers forked from this process on :meth:`start`."""

    def __init__(
        self,
        *,
        workers: int | None = None,
        latency_ms: float = DEFAULT_LATENCY_MS,
        get_rate: float | None = DEFAULT_GET_RATE,
        prefix_depth: int = 1,
        burst_s: float = 0.1,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.workers = workers or os.cpu_count() or 1
        self.latency_ms = latency_ms
        self.get_rate = get_rate  # None: no limit
        self.prefix_depth = prefix_depth
        self.burst_s = burst_s
        self.host, self.port = host, port
        self._pending: dict[str, dict[str, tuple[Path | None, bytes | None, float]]] = {}
        self._procs: list[Any] = []
        self._ctx = multiprocessing.get_context("fork")
        self._stats = self._ctx.RawArray(ctypes.c_double, self.workers * _NS)
        self._buckets = self._ctx.RawArray(ctypes.c_double, 2 * _SLOTS)
        self._lock = self._ctx.Lock()
        self._knobs = self._ctx.RawArray(ctypes.c_double, 3)  # latency s, GET rate (0: none), burst
        self.set_limits(latency_ms=latency_ms, get_rate=get_rate)
        self._sock: socket.socket | None = None
        self.endpoint = ""
        self.objects = 0
        self.bytes = 0

    # ---------------------------------------------------------------- loading

    def add_object(self, bucket: str, key: str, data: bytes, mtime: float | None = None) -> None:
        self._pending.setdefault(bucket, {})[key] = (None, bytes(data), mtime or time.time())

    def add_bucket(self, bucket: str) -> None:
        self._pending.setdefault(bucket, {})

    def add_tree(self, bucket: str, directory: str | os.PathLike[str], prefix: str = "") -> int:
        """Every file under ``directory`` as ``prefix + relative path``; returns the count."""
        root = Path(directory)
        objs = self._pending.setdefault(bucket, {})
        count = 0
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            rel = Path(dirpath).relative_to(root).as_posix()
            for name in filenames:
                path = Path(dirpath) / name
                key = prefix + (name if rel == "." else f"{rel}/{name}")
                objs[key] = (path, None, path.stat().st_mtime)
                count += 1
        return count

    def _load(self) -> tuple[mmap.mmap, dict[str, dict[str, _Obj]], dict[str, list[str]]]:
        total = 0
        for objs in self._pending.values():
            for path, data, _ in objs.values():
                total += len(data) if data is not None else path.stat().st_size  # type: ignore[union-attr]
        arena = mmap.mmap(-1, max(1, total))  # anonymous and shared: the forked workers see one copy
        index: dict[str, dict[str, _Obj]] = {}
        offset = 0
        for bucket, objs in self._pending.items():
            mine = index[bucket] = {}
            for key, (path, data, mtime) in objs.items():
                if data is None:
                    data = path.read_bytes()  # type: ignore[union-attr]
                size = len(data)
                arena[offset : offset + size] = data
                etag = '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'
                mine[key] = _Obj(offset, size, etag, _http_date(mtime), _iso(mtime))
                offset += size
        self.objects = sum(len(v) for v in index.values())
        self.bytes = total
        self._pending = {}
        return arena, index, {b: sorted(v) for b, v in index.items()}

    # ---------------------------------------------------------------- life

    def start(self) -> FastStore:
        arena, index, keys = self._load()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(4096)
        sock.setblocking(False)
        self._sock = sock
        self.port = sock.getsockname()[1]
        self.endpoint = f"http://{self.host}:{self.port}"
        config = _Config(depth=self.prefix_depth, workers=self.workers, capacity=self.declared_capacity)
        for n in range(self.workers):
            proc = self._ctx.Process(
                target=_worker,
                args=(n, sock, arena, index, keys, config, self._stats, self._buckets, self._lock, self._knobs),
                daemon=True,
                name=f"faststore-{n}",
            )
            proc.start()
            self._procs.append(proc)
        arena.close()  # the workers hold their own mappings
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # every worker serving (each counts its start in cpu_s)
            if all(self._stats[n * _NS + _STATS.index("cpu_s")] > 0 for n in range(self.workers)):
                return self
            if any(not p.is_alive() for p in self._procs):
                break
            time.sleep(0.01)
        self.close()
        raise RuntimeError("faststore workers did not start")

    def close(self) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            proc.join(10)
        self._procs = []
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> FastStore:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_limits(self, *, latency_ms: float | None = None, get_rate: float | None | bool = False) -> None:
        """Change the first-byte latency and (``get_rate``: a rate, or None for no limit) the
        rate limit of a running store; every prefix's bucket starts full again."""
        if latency_ms is not None:
            self.latency_ms = latency_ms
        if get_rate is not False:
            self.get_rate = get_rate or None  # type: ignore[assignment]
        with self._lock:
            self._knobs[0] = self.latency_ms / 1000
            self._knobs[1] = self.get_rate or 0.0
            self._knobs[2] = max(1.0, (self.get_rate or 0.0) * self.burst_s)
            for i in range(2 * _SLOTS):
                self._buckets[i] = 0.0

    # ---------------------------------------------------------------- figures

    @property
    def declared_capacity(self) -> float:
        """Small GETs per second this store promises on this machine (conservative)."""
        return DECLARED_CAPACITY_PER_WORKER * self.workers

    def stats(self) -> dict[str, float]:
        """The counters summed over the workers (``cpu_s``: their CPU seconds, to 0.2 s)."""
        out = dict.fromkeys(_STATS, 0.0)
        for n in range(self.workers):
            for i, name in enumerate(_STATS):
                out[name] += self._stats[n * _NS + i]
        return out

    def limits(self) -> dict[str, Any]:
        return {
            "latency_ms": self.latency_ms,
            "get_rate_per_prefix": self.get_rate,
            "prefix_depth": self.prefix_depth,
            "workers": self.workers,
            "declared_capacity": self.declared_capacity,
        }


@dataclass(frozen=True)
class _Config:
    depth: int
    workers: int
    capacity: float


# -------------------------------------------------------------------- the worker


def _worker(n: int, sock: socket.socket, arena: mmap.mmap, index: Any, keys: Any, config: _Config,
            stats: Any, buckets: Any, lock: Any, knobs: Any) -> None:  # fmt: skip
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    view = memoryview(arena)
    base = n * _NS
    stats[base + 7] = max(time.process_time(), 1e-6)
    loop = asyncio.new_event_loop()
    app = _App(view, index, keys, config, stats, base, buckets, lock, knobs)

    def tick() -> None:
        stats[base + 7] = max(time.process_time(), 1e-6)
        loop.call_later(0.2, tick)

    async def serve() -> None:
        server = await loop.create_server(lambda: _Conn(app, loop), sock=sock, backlog=4096)
        tick()
        async with server:
            await server.serve_forever()

    loop.run_until_complete(serve())


class _App:
    def __init__(self, view: memoryview, index: Any, keys: Any, config: _Config, stats: Any, base: int,
                 buckets: Any, lock: Any, knobs: Any) -> None:  # fmt: skip
        self.view, self.index, self.keys, self.config = view, index, keys, config
        self.stats, self.base, self.buckets, self.lock, self.knobs = stats, base, buckets, lock, knobs
        self.rid = 0

    def count(self, i: int, by: float = 1) -> None:
        self.stats[self.base + i] += by

    def admit(self, key: str) -> bool:
        rate = self.knobs[1]
        if not rate:
            return True
        prefix = "/".join(key.split("/", self.config.depth)[: self.config.depth])
        slot = 2 * (zlib.crc32(prefix.encode()) % _SLOTS)
        b = self.buckets
        with self.lock:
            now = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process
            last = b[slot + 1]
            burst = self.knobs[2]
            tokens = burst if last == 0 else min(burst, b[slot] + (now - last) * rate)
            b[slot + 1] = now
            if tokens >= 1:
                b[slot] = tokens - 1
                return True
            b[slot] = tokens
            return False

    # ------------------------------------------------------------ responses

    def head(self, status: str, headers: list[tuple[str, str]], length: int) -> bytes:
        self.rid += 1
        lines = [f"HTTP/1.1 {status}", f"Content-Length: {length}", f"x-amz-request-id: FS{self.rid:012X}"]
        lines += [f"{k}: {v}" for k, v in headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    def error(self, status: str, code: str, message: str, resource: str, method: str) -> tuple[bytes, Any]:
        self.count(5)
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n<Error>'
            f"<Code>{code}</Code><Message>{escape(message)}</Message><Resource>{escape(resource)}</Resource>"
            f"<RequestId>FS{self.rid + 1:012X}</RequestId></Error>"
        ).encode()
        head = self.head(status, [("Content-Type", "application/xml")], len(body))
        return head, (None if method == "HEAD" else body)

    def xml(self, body: str) -> tuple[bytes, Any]:
        data = ('<?xml version="1.0" encoding="UTF-8"?>\n' + body).encode()
        return self.head("200 OK", [("Content-Type", "application/xml")], len(data)), data

    def handle(self, method: str, target: str, headers: dict[str, str]) -> tuple[bytes, Any]:
        self.count(0)
        path, _, query = target.partition("?")
        path = unquote(path)
        bucket, _, key = path.lstrip("/").partition("/")
        params = dict(parse_qsl(query, keep_blank_values=True))
        if bucket == "_faststore":
            return self.stats_page()
        if method not in ("GET", "HEAD"):
            return self.error("501 Not Implemented", "NotImplemented", f"{method} is not served", path, method)
        if not bucket:
            names = "".join(
                f"<Bucket><Name>{escape(b)}</Name><CreationDate>2026-01-01T00:00:00.000Z</CreationDate></Bucket>"
                for b in sorted(self.index)
            )
            return self.xml(
                '<ListAllMyBucketsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                f"<Owner><ID>faststore</ID></Owner><Buckets>{names}</Buckets></ListAllMyBucketsResult>"
            )
        objs = self.index.get(bucket)
        if objs is None:
            return self.error("404 Not Found", "NoSuchBucket", "The specified bucket does not exist", path, method)
        if not key:
            if method == "HEAD":
                return self.head("200 OK", [], 0), None
            if "location" in params:
                return self.xml('<LocationConstraint xmlns="http://s3.amazonaws.com/doc/2006-03-01/"/>')
            self.count(3)
            return self.listing(bucket, params)
        if not self.admit(key):
            self.count(4)
            return self.error("503 Slow Down", "SlowDown", "Please reduce your request rate.", path, method)
        obj = objs.get(key)
        if obj is None:
            return self.error("404 Not Found", "NoSuchKey", "The specified key does not exist.", path, method)
        common = [
            ("ETag", obj.etag),
            ("Last-Modified", obj.modified),
            ("Accept-Ranges", "bytes"),
            ("Content-Type", "application/octet-stream"),
        ]
        if method == "HEAD":
            self.count(2)
            return self.head("200 OK", common, obj.size), None
        self.count(1)
        first, last = 0, obj.size - 1
        status = "200 OK"
        rng = headers.get("range")
        if rng and rng.startswith("bytes=") and "," not in rng:
            a, _, b = rng[6:].strip().partition("-")
            try:
                if a == "":
                    first = max(0, obj.size - int(b))
                else:
                    first = int(a)
                    last = min(obj.size - 1, int(b)) if b else obj.size - 1
            except ValueError:
                first, last = 0, obj.size - 1
            else:
                if first >= obj.size or first > last:
                    return self.error(
                        "416 Requested Range Not Satisfiable", "InvalidRange", "The requested range is not satisfiable",
                        path, method,
                    )  # fmt: skip
                status = "206 Partial Content"
                common.append(("Content-Range", f"bytes {first}-{last}/{obj.size}"))
        length = last - first + 1
        self.count(6, length)
        return self.head(status, common, length), self.view[obj.offset + first : obj.offset + last + 1]

    def stats_page(self) -> tuple[bytes, Any]:
        out: dict[str, Any] = dict.fromkeys(_STATS, 0.0)
        for w in range(self.config.workers):
            for i, name in enumerate(_STATS):
                out[name] += self.stats[w * _NS + i]
        out["limits"] = {
            "latency_ms": self.knobs[0] * 1000,
            "get_rate_per_prefix": self.knobs[1] or None,
            "prefix_depth": self.config.depth,
            "workers": self.config.workers,
            "declared_capacity": self.config.capacity,
        }
        body = json.dumps(out).encode()
        return self.head("200 OK", [("Content-Type", "application/json")], len(body)), body

    def listing(self, bucket: str, params: dict[str, str]) -> tuple[bytes, Any]:
        v2 = params.get("list-type") == "2"
        prefix = params.get("prefix", "")
        delim = params.get("delimiter", "")
        url = params.get("encoding-type") == "url"
        try:
            max_keys = max(0, min(1000, int(params.get("max-keys", "1000"))))
        except ValueError:
            max_keys = 1000
        token = params.get("continuation-token", "")
        if v2:
            after = base64.urlsafe_b64decode(token.encode()).decode() if token else params.get("start-after", "")
        else:
            after = params.get("marker", "")
        keys = self.keys[bucket]
        objs = self.index[bucket]
        contents: list[str] = []
        prefixes: list[str] = []
        last = ""
        truncated = False
        for kind, name in _walk(keys, prefix, delim, after):
            if len(contents) + len(prefixes) >= max_keys:
                truncated = True
                break
            (contents if kind == "k" else prefixes).append(name)
            last = name

        def enc(s: str) -> str:
            return escape(quote(s, safe="/~") if url else s)

        parts = [
            f'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>{escape(bucket)}</Name>',
            f"<Prefix>{enc(prefix)}</Prefix><MaxKeys>{max_keys}</MaxKeys>",
            f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>",
        ]
        if delim:
            parts.append(f"<Delimiter>{enc(delim)}</Delimiter>")
        if url:
            parts.append("<EncodingType>url</EncodingType>")
        if v2:
            parts.append(f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount>")
            if token:
                parts.append(f"<ContinuationToken>{escape(token)}</ContinuationToken>")
            if "start-after" in params:
                parts.append(f"<StartAfter>{enc(params['start-after'])}</StartAfter>")
            if truncated:
                nxt = base64.urlsafe_b64encode(last.encode()).decode()
                parts.append(f"<NextContinuationToken>{nxt}</NextContinuationToken>")
        else:
            parts.append(f"<Marker>{enc(after)}</Marker>")
            if truncated:
                parts.append(f"<NextMarker>{enc(last)}</NextMarker>")
        for key in contents:
            o = objs[key]
            parts.append(
                f"<Contents><Key>{enc(key)}</Key><LastModified>{o.iso}</LastModified>"
                f"<ETag>{escape(o.etag)}</ETag><Size>{o.size}</Size><StorageClass>STANDARD</StorageClass></Contents>"
            )
        parts += [f"<CommonPrefixes><Prefix>{enc(p)}</Prefix></CommonPrefixes>" for p in prefixes]
        parts.append("</ListBucketResult>")
        return self.xml("".join(parts))


def _after(s: str) -> str:
    """The smallest string greater than every string starting with ``s``."""
    return s + "\U0010ffff"


def _walk(keys: list[str], prefix: str, delim: str, after: str) -> Iterator[tuple[str, str]]:
    """Keys (``k``) and common prefixes (``p``) under ``prefix``, in order, after ``after``."""
    i = bisect_left(keys, prefix)
    if after:
        # a common prefix given as the marker skips all of it: keys starting with it sort before _after(it)
        i = max(i, bisect_right(keys, after))
        if delim and after.endswith(delim):
            i = max(i, bisect_left(keys, _after(after)))
    n = len(keys)
    while i < n:
        key = keys[i]
        if not key.startswith(prefix):
            return
        if delim:
            cut = key.find(delim, len(prefix))
            if cut >= 0:
                common = key[: cut + len(delim)]
                yield "p", common
                i = bisect_left(keys, _after(common), i)
                continue
        yield "k", key
        i += 1


class _Conn(asyncio.Protocol):
    __slots__ = ("app", "loop", "t", "buf", "busy", "paused", "out", "close_after")

    def __init__(self, app: _App, loop: asyncio.AbstractEventLoop) -> None:
        self.app, self.loop = app, loop
        self.buf = bytearray()
        self.busy = False
        self.paused = False
        self.out: deque[Any] = deque()
        self.close_after = False

    def connection_made(self, transport: Any) -> None:
        self.t = transport
        transport.set_write_buffer_limits(high=4 * _CHUNK)
        s = transport.get_extra_info("socket")
        if s is not None:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.out.clear()
        self.busy = True  # nothing more to parse or send

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self.parse()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.pump()

    def parse(self) -> None:
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > 65536:
                self.t.close()
            return
        lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ", 2)
        except ValueError:
            self.t.close()
            return
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name in ("range", "content-length", "connection", "expect", "transfer-encoding"):
                headers[name] = value.strip()
        try:
            body = int(headers.get("content-length", "0"))
        except ValueError:
            body = 0
        if headers.get("transfer-encoding", "").lower() == "chunked":
            self.t.close()  # no chunked request bodies (no PUT): refuse the connection
            return
        if len(buf) < end + 4 + body:
            if headers.get("expect", "").lower() == "100-continue":
                self.t.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                headers.pop("expect")
            return
        del buf[: end + 4 + body]
        self.busy = True
        self.close_after = version != "HTTP/1.1" or headers.get("connection", "").lower() == "close"
        try:
            head, payload = self.app.handle(method, target, headers)
        except Exception as exc:  # noqa: BLE001 - a bug here answers 500, not a dead worker
            head, payload = self.app.error("500 Internal Server Error", "InternalError", repr(exc), target, method)
        latency = self.app.knobs[0]
        if latency:
            self.loop.call_later(latency, self.send, head, payload)
        else:
            self.send(head, payload)

    def send(self, head: bytes, payload: Any) -> None:
        if self.t.is_closing():
            return
        if payload is not None and len(payload) <= _CHUNK:
            self.t.write(head + bytes(payload))  # one write: one segment for a small object
            self.done()
            return
        self.t.write(head)
        if payload is not None:
            self.out.append(payload)
        self.pump()

    def pump(self) -> None:
        while self.out and not self.paused:
            piece = self.out[0]
            self.t.write(piece[:_CHUNK])
            if len(piece) > _CHUNK:
                self.out[0] = piece[_CHUNK:]
            else:
                self.out.popleft()
        if not self.out and self.busy and not self.t.is_closing():
            self.done()

    def done(self) -> None:
        if self.close_after:
            self.t.close()
            return
        self.busy = False
        if self.buf:
            self.parse()


# -------------------------------------------------------------------- capacity


def _client(port: int, path: str, seconds: float, connections: int, result: Any) -> None:
    """Keep-alive GETs of ``path`` on ``connections`` connections for ``seconds``; counts 200s.
    The run is timed from when every connection is open: a client slow to start (a loaded
    machine) offers its load for ``seconds`` all the same, not for what is left of them."""

    async def one(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, deadline: float, counts: list[int]
    ) -> None:
        request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
        try:
            while time.monotonic() < deadline:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                status = head[9:12]
                i = head.lower().find(b"content-length:")
                length = int(head[i + 15 : head.index(b"\r\n", i)])
                await reader.readexactly(length)
                counts[0 if status == b"200" else 1] += 1
        finally:
            writer.close()

    async def main() -> None:
        counts = [0, 0]
        opened = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port) for _ in range(connections)))
        start = time.monotonic()
        await asyncio.gather(*(one(reader, writer, start + seconds, counts) for reader, writer in opened))
        result[0], result[1], result[2] = counts[0], counts[1], time.monotonic() - start

    asyncio.run(main())


def drive(
    endpoint: str, path: str, *, seconds: float = 2.0, connections: int = 64, processes: int = 1
) -> dict[str, float]:
    """Offer as many keep-alive GETs of ``path`` as ``processes`` client processes can;
    returns ``ok`` and ``throttled`` per second over the run."""
    port = int(endpoint.rsplit(":", 1)[1])
    ctx = multiprocessing.get_context("fork")
    results = [ctx.RawArray(ctypes.c_double, 3) for _ in range(processes)]
    procs = [
        ctx.Process(target=_client, args=(port, path, seconds, max(1, connections // processes), r)) for r in results
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(seconds + 60)
    wall = max(r[2] for r in results) or seconds
    return {"ok": sum(r[0] for r in results) / wall, "throttled": sum(r[1] for r in results) / wall, "seconds": wall}


def read_rate(endpoint: str, paths: list[str], *, connections: int = 4) -> dict[str, float]:
    """Read every object in ``paths`` whole, ``connections`` at a time, discarding the bytes
    (a raw client in this process); returns ``bytes`` and ``bytes_per_s``."""
    port = int(endpoint.rsplit(":", 1)[1])

    async def worker(queue: deque[str], got: list[int]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=_CHUNK)
        try:
            while queue:
                path = queue.popleft()
                writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                head = await reader.readuntil(b"\r\n\r\n")
                if head[9:12] != b"200":
                    raise RuntimeError(f"GET {path}: {head[:40]!r}")
                i = head.lower().find(b"content-length:")
                left = int(head[i + 15 : head.index(b"\r\n", i)])
                got[0] += left
                while left:
                    left -= len(await reader.read(min(left, _CHUNK)))
        finally:
            writer.close()

    async def main() -> tuple[int, float]:
        queue, got = deque(paths), [0]
        start = time.perf_counter()
        await asyncio.gather(*(worker(queue, got) for _ in range(max(1, min(connections, len(paths))))))
        return got[0], time.perf_counter() - start

    total, took = asyncio.run(main())
    return {"bytes": total, "seconds": took, "bytes_per_s": total / took if took else 0.0}


def measure_capacity(*, workers: int | None = None, seconds: float = 2.0, size: int = 16_000) -> dict[str, float]:
    """Small GETs per second a store of ``workers`` sustains here: latency 0, no rate limit,
    one ``size``-byte object, a raw keep-alive client in its own process(es) on this machine."""
    store = FastStore(workers=workers, latency_ms=0, get_rate=None)
    store.add_object("cap", "o", os.urandom(size))
    with store:
        drive(store.endpoint, "/cap/o", seconds=0.3, connections=64)  # warm
        before = store.stats()
        got = drive(store.endpoint, "/cap/o", seconds=seconds, connections=64, processes=max(1, store.workers // 2))
        after = store.stats()
    return {
        "requests_per_s": got["ok"],
        "answered": round(got["ok"] * got["seconds"]),  # 200s the client read whole
        "refused": round(got["throttled"] * got["seconds"]),  # answers other than 200
        "store_gets": after["get"] - before["get"],
        "store_errors": after["errors"] - before["errors"],
        "store_cpu_share": (after["cpu_s"] - before["cpu_s"]) / got["seconds"],
        "workers": store.workers,
        "declared": store.declared_capacity,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", default=[], help="BUCKET=DIR[:PREFIX] (repeatable)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--latency-ms", type=float, default=DEFAULT_LATENCY_MS)
    parser.add_argument("--get-rate", type=float, default=DEFAULT_GET_RATE, help="per prefix; 0: no limit")
    parser.add_argument("--prefix-depth", type=int, default=1)
    parser.add_argument("--measure", action="store_true", help="print this machine's capacity and exit")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure_capacity(workers=args.workers), indent=1))
        return
    store = FastStore(
        workers=args.workers, latency_ms=args.latency_ms, get_rate=args.get_rate or None,
        prefix_depth=args.prefix_depth, port=args.port,
    )  # fmt: skip
    for spec in args.tree:
        bucket, _, rest = spec.partition("=")
        directory, _, prefix = rest.partition(":")
        store.add_tree(bucket, directory, prefix)
    with store:
        print(f"serving {store.objects} objects ({store.bytes / 1e6:.1f} MB) on {store.endpoint}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
