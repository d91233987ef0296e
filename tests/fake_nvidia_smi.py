"""A fake ``nvidia-smi`` on ``PATH``: a shell script printing a node's recorded ``topo -m``
(tests/fixtures/topology) and made-up GPU UUIDs, so that topology discovery runs as on a GPU
node, through its real ``nvidia-smi`` backend."""

from __future__ import annotations

import stat
import zlib
from pathlib import Path

from gpu_topology.discovery.nvidia_smi import parse_topo_matrix

FIXTURES = Path(__file__).parent / "fixtures" / "topology"


def uuid(node: str, index: int) -> str:
    """GPU ``index`` of ``node``'s made-up UUID, the same in every process."""
    return f"GPU-{zlib.crc32(node.encode()):08x}-0000-4000-8000-{index:012x}"


def fake_nvidia_smi(bindir: Path, node: str, fixture: str) -> None:
    """``nvidia-smi`` printing the node's recorded ``topo -m`` and its GPUs' UUIDs."""
    gpus = parse_topo_matrix((FIXTURES / fixture).read_text(encoding="utf-8")).gpus
    query = "".join(f"{g.index}, {uuid(node, g.index)}, 00000000:{0x20 + g.index:02X}:00.0\n" for g in gpus)
    (bindir / "topo.txt").write_text((FIXTURES / fixture).read_text(encoding="utf-8"))
    (bindir / "query.csv").write_text(query)
    script = bindir / "nvidia-smi"
    script.write_text(
        f'#!/bin/sh\nif [ "$1" = topo ]; then cat "{bindir}/topo.txt"; else cat "{bindir}/query.csv"; fi\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
