"""Benchmark: training read throughput, images decoded per second by a data loader.

    python tools/bench/loader.py                       # 20,000 JPEGs, 2 workers per CPU... see --workers
    python tools/bench/loader.py --images 5000 --latency-ms 10
    python tools/bench/loader.py --smoke               # seconds: checks that it still runs

The design's own experiment, on CPU: a synthetic JPEG dataset (made with Pillow: noise
over gradients, ``--size`` pixels square, ImageNet-like file sizes), read and decoded by a
loader of ``--workers`` processes (each image opened, decoded to RGB and resized to
224x224, as a training input pipeline does before the GPU) from:

- ``cache``: the node cache, the dataset as the agent leaves it (packed into bundles and
  unpacked, verified, by the same code ``dsctl cache`` runs) on this disk;
- ``local``: the same files on this disk without the platform (the source directory);
- ``s3``: the store, each file read through s3fs from an S3-compatible store on loopback
  (:mod:`tools.support.faststore`, with ``--latency-ms`` of first-byte latency, as
  ``ready.py``);
- ``striped``: the node cache read by the package's rank-aware reader
  (:class:`dsplatform.data.StripedDataset` over the version's layout, every bundle local as
  in a whole cached version), each loader process taking its part of the epoch
  (``samples(worker, workers)``, as a PyTorch DataLoader worker does), in the reader's
  shuffled order;
- ``reader``: with ``--reader MODULE:CALLABLE``, another reader of the whole dataset:
  ``CALLABLE(root, paths)`` returns an iterator of bytes in ``paths``' order, read in each
  worker for its share of the paths.

Each way runs over the same images, interleaved, ``--repeat`` rounds (best kept); the page
cache is warm for ``cache``, ``local`` and ``striped`` (a training epoch after the first).
Ratios: ``cache`` over ``local`` images/s (goal: within 5%, >= 0.95), ``striped`` over
``local`` (the reader's goal: within 10%, >= 0.90) and ``s3`` over ``local``.
A GPU run (utilisation with a small torchvision model) needs a GPU machine; this one
measures what the CPU side delivers.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from support.record import Record  # noqa: E402

_fetch: Callable[[str], bytes] | None = None


def generate(root: Path, images: int, size: int, seed: int = 1) -> list[str]:
    """``images`` JPEGs under ``root`` in 100 class folders; their relative paths."""
    from PIL import Image

    stamp = root.parent / f".{root.name}.complete"
    wanted = f"{images} {size} {seed}"
    paths = [f"c{i % 100:03d}/{i:07d}.jpg" for i in range(images)]
    if stamp.exists() and stamp.read_text() == wanted and all((root / rel).is_file() for rel in paths[:1] + paths[-1:]):
        return paths  # kept (--keep) by an earlier run
    shutil.rmtree(root, ignore_errors=True)
    rng = random.Random(seed)
    base = Image.linear_gradient("L").resize((size, size)).convert("RGB")
    for i, rel in enumerate(paths):
        noise = Image.frombytes("RGB", (size, size), rng.randbytes(size * size * 3))
        image = Image.blend(base, noise, 0.35 + 0.3 * ((i * 7919) % 100) / 100)
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path, "JPEG", quality=85)
    stamp.write_text(wanted)
    return paths


def _decode(data: bytes) -> int:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        out = image.convert("RGB").resize((224, 224))
    return out.size[0]


def _init_files(root: str) -> None:
    global _fetch
    _fetch = lambda rel: Path(root, rel).read_bytes()  # noqa: E731


def _init_s3(endpoint: str, prefix: str) -> None:
    global _fetch
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
    _fetch = lambda rel: fs.cat_file(f"{prefix}/{rel}")  # noqa: E731


def _load_one(rel: str) -> int:
    assert _fetch is not None
    return _decode(_fetch(rel))


def _load_share(job: tuple[str, str, Sequence[str]]) -> int:
    target, root, paths = job
    module, _, name = target.partition(":")
    reader: Callable[[str, Sequence[str]], Iterator[bytes]] = getattr(importlib.import_module(module), name)
    return sum(_decode(data) for data in reader(root, paths))


def _load_striped(job: tuple[str, str, int, int]) -> int:
    from dsplatform.data import StripedDataset

    root, layout, worker, workers = job
    data = StripedDataset(root, layout=layout, whole=True)
    return sum(_decode(sample.data) for sample in data.samples(worker, workers))


def run_striped(count: int, workers: int, root: str, layout: str) -> float:
    """Seconds for ``workers`` processes to decode one epoch through the striped reader."""
    started = time.perf_counter()
    with get_context("fork").Pool(workers) as pool:
        decoded = sum(pool.map(_load_striped, [(root, layout, i, workers) for i in range(workers)]))
    assert decoded == 224 * count, (decoded, count)
    return time.perf_counter() - started


def write_layout(manifest: Any, path: Path) -> None:
    """The version's stripe layout as one node holding all of it (a whole cached version)."""
    from dsplatform.stripe import StripeLayout

    layout = StripeLayout.create(
        manifest.name,
        manifest.digest,
        ["this-node"],
        [(b.digest, b.first, b.count, b.size) for b in manifest.bundles],
        manifest.entries.paths,
        [e.size for e in manifest.entries],
    )
    with open(path, "wb") as out:
        for line in layout.dump():
            out.write(line)


def run_loader(paths: list[str], workers: int, init: Callable[..., None], initargs: tuple[Any, ...]) -> float:
    """Seconds to load and decode every image with ``workers`` processes (pool start included)."""
    started = time.perf_counter()
    with get_context("fork").Pool(workers, initializer=init, initargs=initargs) as pool:
        decoded = sum(pool.imap_unordered(_load_one, paths, chunksize=16))
    assert decoded == 224 * len(paths)
    return time.perf_counter() - started


def run_reader(paths: list[str], workers: int, target: str, root: str) -> float:
    started = time.perf_counter()
    shares = [(target, root, paths[i::workers]) for i in range(workers)]
    with get_context("fork").Pool(workers) as pool:
        decoded = sum(pool.map(_load_share, shares))
    assert decoded == 224 * len(paths)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=256, help="pixels, square (256: ~40 KB JPEGs)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="loader processes")
    parser.add_argument("--latency-ms", type=float, default=10.0)
    parser.add_argument(
        "--ways", default="cache,local,striped,s3", help="comma-separated: cache, local, striped, s3 (and reader)"
    )
    parser.add_argument("--reader", help="MODULE:CALLABLE reading (root, paths) -> bytes iterator (the 'reader' way)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=ROOT / ".bench" / "loader")
    parser.add_argument("--json", type=Path, help="write the results here (default: WORKDIR/loader.json)")
    parser.add_argument("--smoke", action="store_true", help="a few dozen small images, one round")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.images, args.size, args.repeat, args.latency_ms = 48, 64, 1, 2.0
    ways = [w for w in args.ways.split(",") if w]
    if args.reader and "reader" not in ways:
        ways.append("reader")
    work = args.workdir.absolute()
    work.mkdir(parents=True, exist_ok=True)
    src = work / "src"
    paths = generate(src, args.images, args.size)
    total = sum((src / p).stat().st_size for p in paths)
    record = Record(
        "loader",
        {
            "images": args.images,
            "size": args.size,
            "workers": args.workers,
            "latency_ms": args.latency_ms,
            "bytes": total,
        },
    )
    print(f"dataset: {args.images} JPEGs, {total / 1e6:.1f} MB; {args.workers} loader processes", flush=True)

    from dsagent.format.bundles.bundle import pack, unpack

    cached = work / "cache"
    shutil.rmtree(cached, ignore_errors=True)
    shutil.rmtree(work / "store", ignore_errors=True)
    manifest = pack(src, work / "store", name="jpeg", max_files=max(1, args.images // 8))  # several bundles
    unpack(work / "store", name="jpeg", dest=cached)
    layout = work / "layout.jsonl"
    write_layout(manifest, layout)

    store = None
    endpoint = ""
    if "s3" in ways:
        import ready

        from tools.support.faststore import FastStore

        os.environ.update(ready.CREDENTIALS)
        store = FastStore(workers=2, latency_ms=args.latency_ms)
        store.add_tree("images", src, "jpeg/")
        store.start()
        endpoint = store.endpoint

    runs: dict[str, Callable[[], float]] = {
        "cache": lambda: run_loader(paths, args.workers, _init_files, (str(cached),)),
        "local": lambda: run_loader(paths, args.workers, _init_files, (str(src),)),
        "s3": lambda: run_loader(paths, args.workers, _init_s3, (endpoint, "images/jpeg")),
        "reader": lambda: run_reader(paths, args.workers, args.reader, str(cached)),
        "striped": lambda: run_striped(len(paths), args.workers, str(cached), str(layout)),
    }
    best: dict[str, float] = {}
    try:
        for way in ways:  # warm-up: page cache, bytecode, the S3 server's first requests
            if way != "s3":
                runs[way]()
        for _ in range(max(1, args.repeat)):
            for way in ways:
                took = runs[way]()
                record.row("load", way, took, images_per_s=len(paths) / took)
                best[way] = min(best.get(way, took), took)
    finally:
        if store is not None:
            store.close()
    print(f"images/s (best of {args.repeat}; load average {os.getloadavg()[0]:.2f}):")
    for way in ways:
        print(f"  {way:<8} {len(paths) / best[way]:10.0f} images/s  {total / best[way] / 1e6:8.1f} MB/s", flush=True)
    if "cache" in best and "local" in best:
        share = best["local"] / best["cache"]
        record.ratio(f"images/s from the node cache / local disk, {args.images} images", share, 0.95)
        print(f"  ratio cache / local images/s {share:8.3f}", flush=True)
    if "striped" in best and "local" in best:
        share = best["local"] / best["striped"]
        record.ratio(f"images/s through the striped reader / local disk, {args.images} images", share, 0.90)
        print(f"  ratio striped / local images/s {share:6.3f}", flush=True)
    if "s3" in best and "local" in best:
        share = best["local"] / best["s3"]
        record.ratio(f"images/s from s3fs at {args.latency_ms:g} ms / local disk", share, None)
        print(f"  ratio s3 / local images/s    {share:8.3f}", flush=True)
    record.write(args.json or work / "loader.json")
    if not args.keep:
        for path in (src, cached, work / "store"):
            shutil.rmtree(path, ignore_errors=True)
        layout.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
