"""Fixtures and builders shared by the gpu_topology tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from gpu_topology import Gpu, Link, Nic, Topology


@pytest.fixture(scope="session")
def topology_fixtures(fixtures_dir: Path) -> Path:
    """``tests/fixtures/topology``: real ``nvidia-smi topo -m`` and NCCL XML outputs."""
    return fixtures_dir / "topology"


@pytest.fixture(scope="session")
def read_fixture(topology_fixtures: Path) -> Callable[[str], str]:
    def read(stem: str) -> str:
        matches = sorted(p for p in topology_fixtures.glob(f"{stem}*") if p.suffix in (".txt", ".xml"))
        assert len(matches) == 1, f"fixture {stem!r} matches {matches}"
        return matches[0].read_text(encoding="utf-8")

    return read


def build(
    links: Mapping[tuple[str, str], str],
    *,
    numa: Mapping[int, int | None] | None = None,
    nics: Mapping[str, int | None] | None = None,
    gpus: int | None = None,
) -> Topology:
    """A topology from ``{("GPU0", "GPU1"): "NV2", ...}``; GPU count from the names."""
    names = {n for pair in links for n in pair}
    count = gpus if gpus is not None else 1 + max((int(n[3:]) for n in names if n.startswith("GPU")), default=-1)
    numa = numa or {}
    nics = nics or {n: None for n in sorted(names) if not n.startswith("GPU")}
    table: dict[str, dict[str, Link]] = {}
    for (a, b), text in links.items():
        table.setdefault(a, {})[b] = Link.parse(text)
    return Topology(
        gpus=tuple(Gpu(index=i, numa_node=numa.get(i)) for i in range(count)),
        nics=tuple(Nic(name=n, numa_node=node) for n, node in nics.items()),
        links=table,
    )
