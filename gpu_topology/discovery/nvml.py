"""Discovery through NVML (``nvidia-ml-py``, the optional extra ``dsplatform[nvml]``).

Gives what the driver knows of the GPUs: UUIDs, PCI bus ids, NUMA nodes (drivers that
have ``nvmlDeviceGetNumaNodeId``), CPU affinity, the PCIe common ancestor of every GPU
pair (NVML's INTERNAL/SINGLE/MULTIPLE/HOSTBRIDGE/NODE/SYSTEM are BOARD/PIX/PXB/PHB/
NODE/SYS) and NVLinks (links whose remote end is another GPU count towards that pair;
links to NVSwitches give every switch-connected pair the smaller switch-link total, as
``nvidia-smi`` prints NV18 on an H100 HGX). NVML knows no RDMA NICs: ``discover()``
merges sysfs in for those. The ``pynvml`` module is imported lazily and injectable.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

from gpu_topology.discovery.base import Backend
from gpu_topology.errors import BackendUnavailable, DiscoveryError
from gpu_topology.model import Gpu, Link, LinkKind, Topology, gpu_name, normalize_bus_id

_ANCESTOR_LEVELS = {
    0: LinkKind.BOARD,  # NVML_TOPOLOGY_INTERNAL
    10: LinkKind.PIX,  # NVML_TOPOLOGY_SINGLE
    20: LinkKind.PXB,  # NVML_TOPOLOGY_MULTIPLE
    30: LinkKind.PHB,  # NVML_TOPOLOGY_HOSTBRIDGE
    40: LinkKind.NODE,  # NVML_TOPOLOGY_NODE
    50: LinkKind.SYS,  # NVML_TOPOLOGY_SYSTEM
}
_MAX_LINKS = 18


class NvmlBackend(Backend):
    """GPUs and GPU-GPU links from NVML."""

    name = "nvml"
    install_hint = "pip install 'dsplatform[nvml]' (nvidia-ml-py) and run where the NVIDIA driver is loaded"

    def __init__(self, *, nvml: ModuleType | Any | None = None) -> None:
        self._nvml = nvml

    def _module(self) -> Any:
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                raise BackendUnavailable("nvidia-ml-py is not installed", hint=self.install_hint) from exc
        return self._nvml

    def unavailable_reason(self) -> str | None:
        try:
            nvml = self._module()
            nvml.nvmlInit()
        except BackendUnavailable as exc:
            return exc.message
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            return f"NVML cannot start: {exc}"
        nvml.nvmlShutdown()
        return None

    def discover(self) -> Topology:
        nvml = self._module()
        try:
            nvml.nvmlInit()
        except Exception as exc:
            raise BackendUnavailable(f"NVML cannot start: {exc}", hint=self.install_hint) from exc
        try:
            return self._discover(nvml)
        except nvml.NVMLError as exc:
            raise DiscoveryError(f"NVML query failed: {exc}") from exc
        finally:
            nvml.nvmlShutdown()

    def _discover(self, nvml: Any) -> Topology:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        gpus = [self._gpu(nvml, i, h) for i, h in enumerate(handles)]
        by_bus = {g.pci_bus_id: g.index for g in gpus}
        nvlinks = [self._nvlinks(nvml, h, by_bus) for h in handles]
        links: dict[str, dict[str, Link]] = {}
        for a in range(len(handles)):
            for b in range(a + 1, len(handles)):
                links.setdefault(gpu_name(a), {})[gpu_name(b)] = self._pair(nvml, handles, nvlinks, a, b)
        return Topology(gpus=tuple(gpus), links=links)

    def _gpu(self, nvml: Any, index: int, handle: Any) -> Gpu:
        numa = None
        if hasattr(nvml, "nvmlDeviceGetNumaNodeId"):
            try:
                value = nvml.nvmlDeviceGetNumaNodeId(handle)
                numa = value if value >= 0 else None
            except nvml.NVMLError:
                numa = None
        words = max(1, -(-(os.cpu_count() or 64) // 64))
        return Gpu(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            pci_bus_id=normalize_bus_id(_text(nvml.nvmlDeviceGetPciInfo(handle).busId)),
            numa_node=numa,
            cpu_affinity=_cpu_list(nvml.nvmlDeviceGetCpuAffinity(handle, words)),
        )

    def _nvlinks(self, nvml: Any, handle: Any, by_bus: dict[str | None, int]) -> tuple[dict[int, int], int]:
        peers: dict[int, int] = {}
        switch = 0
        for link in range(_MAX_LINKS):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                    continue
                remote = normalize_bus_id(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
            except nvml.NVMLError:
                break  # NotSupported / InvalidArgument past the last link
            if remote in by_bus:
                peers[by_bus[remote]] = peers.get(by_bus[remote], 0) + 1
            else:
                switch += 1
        return peers, switch

    def _pair(self, nvml: Any, handles: list[Any], nvlinks: list[tuple[dict[int, int], int]], a: int, b: int) -> Link:
        level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])
        pcie = _ANCESTOR_LEVELS.get(int(level), LinkKind.SYS)
        # go-gpuallocator scores an NVLinked pair by its NVLinks plus this PCIe level.
        direct = nvlinks[a][0].get(b, 0) or nvlinks[b][0].get(a, 0)
        if direct:
            return Link(LinkKind.NVLINK, direct, pcie=pcie)
        if nvlinks[a][1] and nvlinks[b][1]:
            return Link(LinkKind.NVLINK, min(nvlinks[a][1], nvlinks[b][1]), pcie=pcie)
        return Link(pcie)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _cpu_list(words: list[int]) -> str | None:
    """NVML's affinity words (64 CPUs each, least significant first) -> ``0-15,32``."""
    cpus = [w * 64 + bit for w, word in enumerate(words) for bit in range(64) if word >> bit & 1]
    ranges: list[str] = []
    for cpu in cpus:
        if ranges and int(ranges[-1].split("-")[-1]) == cpu - 1:
            ranges[-1] = f"{ranges[-1].split('-')[0]}-{cpu}"
        else:
            ranges.append(str(cpu))
    return ",".join(ranges) or None
