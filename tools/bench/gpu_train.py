"""Benchmark: training images/s and GPU utilisation, a JPEG set read from the store against from the node cache.

    python tools/bench/gpu_train.py                        # on a GPU machine: ResNet-50, 20,000 JPEGs
    python tools/bench/gpu_train.py --images 50000 --latency-ms 30
    python tools/bench/gpu_train.py --smoke                # seconds, no GPU needed: checks that it still runs

The design's experiment on a GPU (seed 002, section 4.3): the same training job, a
torchvision model fed by a PyTorch ``DataLoader`` of ``--workers`` processes (each image
opened, decoded to RGB, resized to 224x224 and normalised, as a training input pipeline does
before the GPU), reading one synthetic JPEG set (:func:`loader.generate`, ImageNet-like
sizes) in two ways:

- ``direct``: every image a GET of its own object from an S3-compatible store on loopback
  (:mod:`tools.support.faststore`: a first-byte latency of ``--latency-ms`` and S3's
  per-prefix request rate), one keep-alive connection per loader process, as a data
  loader reading a bucket object by object does;
- ``cached``: the node cache, the set as the agent leaves it: packed into bundles and
  unpacked, every file verified by digest, by the code ``dsctl cache`` runs
  (``dsagent.format.bundles.bundle.pack`` / ``unpack``), read with ``open()``.

Each way trains ``--epochs`` epochs (the first a warm-up, not counted: cuDNN autotuning,
the page cache); the others give images/s and the GPU's utilisation, sampled every 0.2 s
through NVML while they run (``nvidia-ml-py``), with the time the training loop waited for
its next batch. Ratios: ``cached`` over ``direct`` images/s, and both against the model's
own rate on data already on the GPU (``--model`` alone, ``synthetic``): how far each input
path is from keeping the GPU busy.

``--smoke`` runs the same steps with 32 tiny images on the CPU, and with no model where
torch is not installed (the suite's machine): it checks the data paths, not the figures.
"""

from __future__ import annotations

import argparse
import http.client
import io
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loader import generate  # noqa: E402
from support.record import Record  # noqa: E402

BUCKET = "train"
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class Source:
    """Reads one image's bytes by its relative path: from a directory, or a GET of its object
    from the store (one keep-alive connection per process, opened on first use)."""

    def __init__(self, root: str | None = None, endpoint: str | None = None, prefix: str = "") -> None:
        self.root, self.endpoint, self.prefix = root, endpoint, prefix
        self._conn: http.client.HTTPConnection | None = None
        self._pid = 0

    def read(self, rel: str) -> bytes:
        if self.root is not None:
            with open(os.path.join(self.root, rel), "rb") as f:
                return f.read()
        if self._conn is None or self._pid != os.getpid():  # a DataLoader worker: its own connection
            assert self.endpoint is not None
            host, _, port = self.endpoint.removeprefix("http://").partition(":")
            self._conn, self._pid = http.client.HTTPConnection(host, int(port), timeout=60), os.getpid()
        for attempt in range(5):
            self._conn.request("GET", f"/{BUCKET}/{self.prefix}{rel}")
            answer = self._conn.getresponse()
            body = answer.read()
            if answer.status == 200:
                return body
            if answer.status != 503:  # 503 SlowDown: the store's rate limit, retried as the SDKs do
                raise OSError(f"GET {rel}: HTTP {answer.status}")
            time.sleep(0.05 * 2**attempt)
        raise OSError(f"GET {rel}: still 503 after retries")


def decode(data: bytes) -> Any:
    """An image as the training input: RGB, 224x224, as a float tensor normalised (torch), or
    its side length where torch is not installed."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        rgb = image.convert("RGB").resize((224, 224))
    try:
        import torch
    except ImportError:
        return rgb.size[0]
    t = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8).view(224, 224, 3).permute(2, 0, 1)
    return t


class Images:
    """A map-style dataset of (image, label) from a :class:`Source`."""

    def __init__(self, paths: list[str], source: Source) -> None:
        self.paths, self.source = paths, source

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        rel = self.paths[i]
        return decode(self.source.read(rel)), int(rel[1:4])  # label: the class folder c000..c099


class Utilisation:
    """The GPU's utilisation sampled every ``every`` seconds through NVML while it runs."""

    def __init__(self, every: float = 0.2) -> None:
        self.every, self.samples = every, []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Utilisation:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no GPU, no NVML: no samples
            return self

        def sample() -> None:
            while not self._stop.wait(self.every):
                self.samples.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


def train(
    images: Images | None, *, model_name: str, batch: int, workers: int, epochs: int, device: str, steps: int = 0
) -> dict[str, Any]:
    """Epochs of training; the figures of the epochs after the first. ``images`` None: the
    model alone on batches already on the device (``steps`` per epoch)."""
    import torch
    import torchvision

    model = getattr(torchvision.models, model_name)(num_classes=100).to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
    use_amp = device == "cuda"
    if images is None:
        fixed = torch.randint(0, 255, (batch, 3, 224, 224), dtype=torch.uint8, device=device)
        labels = torch.randint(0, 100, (batch,), device=device)
        batches: Callable[[], Any] = lambda: ((fixed, labels) for _ in range(steps))  # noqa: E731
    else:
        loader = torch.utils.data.DataLoader(
            images, batch_size=batch, shuffle=True, num_workers=workers, pin_memory=device == "cuda",
            persistent_workers=workers > 0, prefetch_factor=4 if workers > 0 else None, drop_last=True,
        )  # fmt: skip
        batches = lambda: iter(loader)  # noqa: E731
    out: dict[str, Any] = {}
    for epoch in range(epochs):
        seen, waited = 0, 0.0
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        sync()
        started = time.perf_counter()
        with Utilisation() as gpu:
            it = batches()
            while True:
                asked = time.perf_counter()
                try:
                    x, y = next(it)
                except StopIteration:
                    break
                waited += time.perf_counter() - asked
                x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
                y = y.to(device, non_blocking=True)
                with torch.autocast(device, dtype=torch.bfloat16, enabled=use_amp):
                    loss = torch.nn.functional.cross_entropy(model((x.float() - mean) / std), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                seen += x.shape[0]
            sync()
        took = time.perf_counter() - started
        rate = seen / took if took else 0.0
        print(f"    epoch {epoch}: {seen} images in {took:.1f} s, {rate:.0f} images/s, GPU {gpu.mean}", flush=True)
        if epoch > 0 or epochs == 1:
            out.setdefault("images", 0)
            out["images"] += seen
            out["seconds"] = out.get("seconds", 0.0) + took
            out["waited_s"] = out.get("waited_s", 0.0) + waited
            out.setdefault("gpu_util", []).extend(gpu.samples)
    util = out.pop("gpu_util", [])
    out["images_per_s"] = out["images"] / out["seconds"] if out.get("seconds") else 0.0
    out["gpu_util_mean"] = sum(util) / len(util) if util else None
    return out


def read_only(images: Images, workers: int) -> dict[str, Any]:
    """Without torch: every image read and decoded by ``workers`` processes (the smoke's path)."""
    from multiprocessing import get_context

    started = time.perf_counter()
    with get_context("fork").Pool(max(1, workers)) as pool:
        sizes = pool.map(_item, [(images, i) for i in range(len(images))])
    assert all(s == 224 for s, _ in sizes)
    took = time.perf_counter() - started
    return {"images": len(images), "seconds": took, "images_per_s": len(images) / took, "gpu_util_mean": None}


def _item(job: tuple[Images, int]) -> tuple[Any, int]:
    images, i = job
    return images[i]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=320, help="pixels, square (320: ~50 KB JPEGs)")
    parser.add_argument("--model", default="resnet50", help="a torchvision model name")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="DataLoader processes")
    parser.add_argument("--epochs", type=int, default=3, help="the first is a warm-up")
    parser.add_argument("--latency-ms", type=float, default=10.0, help="the store's first-byte latency")
    parser.add_argument("--ways", default="synthetic,direct,cached")
    parser.add_argument("--store-workers", type=int, default=4, help="the store's processes (they share the CPUs)")
    parser.add_argument("--workdir", type=Path, default=ROOT / ".bench" / "gpu_train")
    parser.add_argument("--json", type=Path, help="write the results here (default: WORKDIR/gpu_train.json)")
    parser.add_argument("--smoke", action="store_true", help="32 tiny images on the CPU; no model without torch")
    args = parser.parse_args(argv)
    try:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        torch, device = None, "cpu"
    if args.smoke:
        args.images, args.size, args.batch, args.epochs, args.latency_ms = 32, 48, 8, 2, 1.0
        args.workers, args.model = min(args.workers, 2), "resnet18"
    ways = [w for w in args.ways.split(",") if w]
    work = args.workdir.absolute()
    work.mkdir(parents=True, exist_ok=True)
    src = work / "src"
    started = time.perf_counter()
    paths = generate(src, args.images, args.size)
    total = sum((src / p).stat().st_size for p in paths)
    print(f"dataset: {args.images} JPEGs, {total / 1e6:.1f} MB ({time.perf_counter() - started:.0f} s to make)")

    from dsagent.format.bundles.bundle import pack, unpack
    from tools.support.faststore import FastStore

    cached = work / "cache"
    shutil.rmtree(cached, ignore_errors=True)
    shutil.rmtree(work / "store", ignore_errors=True)
    started = time.perf_counter()
    pack(src, work / "store", name="jpeg", max_files=max(1, min(50_000, args.images // 8)))
    unpack(work / "store", name="jpeg", dest=cached)  # every file verified by digest, as dsctl cache does
    fill_s = time.perf_counter() - started

    gpu_name = torch.cuda.get_device_name(0) if torch is not None and device == "cuda" else None
    record = Record(
        "gpu_train",
        {
            "images": args.images, "size": args.size, "bytes": total, "model": args.model, "batch": args.batch,
            "workers": args.workers, "epochs": args.epochs, "latency_ms": args.latency_ms, "device": device,
            "gpu": gpu_name, "torch": getattr(torch, "__version__", None),
        },
    )  # fmt: skip
    record.row("cache", "pack+unpack", fill_s)
    store = FastStore(workers=args.store_workers, latency_ms=args.latency_ms)
    store.add_tree(BUCKET, src, prefix="raw/")
    results: dict[str, dict[str, Any]] = {}
    with store:
        for way in ways:
            if way == "synthetic" and torch is None:
                continue
            print(f"  {way}:", flush=True)
            images = {
                "synthetic": None,
                "direct": Images(paths, Source(endpoint=store.endpoint, prefix="raw/")),
                "cached": Images(paths, Source(root=str(cached))),
            }[way]
            before = store.stats().get("requests", 0.0)
            if torch is None:
                assert images is not None
                figures = read_only(images, args.workers)
            else:
                steps = max(1, args.images // args.batch)
                figures = train(
                    images, model_name=args.model, batch=args.batch, workers=args.workers, epochs=args.epochs,
                    device=device, steps=steps,
                )  # fmt: skip
            figures["store_requests"] = store.stats().get("requests", 0.0) - before
            results[way] = figures
            record.row(
                "train", way, figures["seconds"], images_per_s=figures["images_per_s"],
                gpu_util_mean=figures["gpu_util_mean"], waited_s=figures.get("waited_s"),
            )  # fmt: skip
    print(f"images/s (load average {os.getloadavg()[0]:.2f}; {device} {gpu_name or ''}):")
    for way, f in results.items():
        util = "-" if f["gpu_util_mean"] is None else f"{f['gpu_util_mean']:.0f}%"
        print(f"  {way:<10} {f['images_per_s']:9.0f} images/s  GPU {util:>5}  waited {f.get('waited_s', 0.0):6.1f} s")
    if "direct" in results and "cached" in results:
        ratio = results["cached"]["images_per_s"] / results["direct"]["images_per_s"]
        record.ratio(f"training images/s, cached / direct at {args.latency_ms:g} ms, {args.model}", ratio, None)
        print(f"  ratio cached / direct images/s {ratio:.2f}")
    if "synthetic" in results:
        for way in ("direct", "cached"):
            if way in results:
                share = results[way]["images_per_s"] / results["synthetic"]["images_per_s"]
                record.ratio(f"training images/s, {way} / data on the GPU, {args.model}", share, None)
    record.write(args.json or work / "gpu_train.json")
    if args.smoke:
        for path in (src, cached, work / "store"):
            shutil.rmtree(path, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
