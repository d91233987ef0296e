"""``make demo``: the main job on its embedded defaults, in a few readable lines.

Stage 1 (datasets and bundles): generate a small image-like dataset (incompressible
"JPEGs" in class folders, one empty class), digest it, pack it into tar+zstd bundles,
change one file and pack again to show that unchanged bundles are reused, then unpack
and verify it into a cache folder. Everything lives under ``./demo-cache`` and takes a
second or two.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

from dsagent.bundle import unpack, verify_tree, write_bundles
from dsagent.manifest import build_manifest
from dsagent.sizes import format_size

DEMO_ROOT = Path("demo-cache")
DATASET = "imagenet-mini"
FILES = 600
CLASSES = 20
MAX_BYTES = 8_000_000


def generate(root: Path, files: int = FILES, classes: int = CLASSES, seed: int = 7) -> int:
    """An ImageNet-shaped toy: log-normal sizes around 50 KB of random bytes; returns total bytes."""
    rng = random.Random(seed)
    total = 0
    for i in range(files):
        size = max(2000, int(rng.lognormvariate(10.8, 0.5)))
        path = root / "train" / f"n{i % classes:08d}" / f"img_{i:05d}.JPEG"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(size))
        total += size
    (root / "train" / f"n{classes:08d}").mkdir(parents=True)  # a class with no images yet
    return total


def run(root: Path = DEMO_ROOT) -> list[str]:
    """Run stage 1 under ``root``; returns the lines it printed."""
    lines: list[str] = []

    def say(verb: str, text: str) -> None:
        lines.append(f"  {verb:<10} {text}")
        print(lines[-1], flush=True)

    source, store, cache = root / "source", root / "store", root / "datasets"
    for path in (source, store, cache):
        shutil.rmtree(path, ignore_errors=True)
    print("dsplatform demo, stage 1: digest, pack, unpack and verify a dataset")
    total = generate(source)
    say("generated", f"{source}: {FILES} image-like files, {format_size(total)} in {CLASSES} classes (+1 empty class)")

    start = time.monotonic()
    manifest = build_manifest(source, name=DATASET)
    say("digested", f"{manifest.file_count} files in {time.monotonic() - start:.2f} s: dataset digest {manifest.digest}")

    start = time.monotonic()
    packed, _ = write_bundles(manifest, source, store, max_bytes=MAX_BYTES)
    stored = sum(b.compressed_size for b in packed.bundles)
    say("packed", f"into {len(packed.bundles)} tar+zstd bundles of at most {format_size(MAX_BYTES)} ({format_size(stored)} stored) in {time.monotonic() - start:.2f} s")

    changed = source / packed.entries[len(packed.entries) // 2].path
    changed.write_bytes(random.Random(1).randbytes(changed.stat().st_size))
    repacked, reused = write_bundles(build_manifest(source, name=DATASET), source, store, max_bytes=MAX_BYTES)
    say("re-packed", f"after changing {changed.name}: {len(repacked.bundles) - reused} bundle rewritten, {reused} reused; new digest {repacked.digest}")

    start = time.monotonic()
    target = cache / DATASET
    unpack(store, name=DATASET, dest=target)
    say("unpacked", f"into {target}: every file checked against its xxh3-128 while written, in {time.monotonic() - start:.2f} s")

    verify_tree(target, repacked)
    say("verified", f"{target} holds exactly the {repacked.file_count} files and the empty class of {DATASET}")
    return lines


def main() -> None:
    run()


if __name__ == "__main__":
    main()
