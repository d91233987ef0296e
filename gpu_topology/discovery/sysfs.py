"""Discovery from Linux sysfs and the kernel's address list, with an injectable root.

Reads, under ``root`` (``/`` on a real machine, a temporary tree in tests):

* ``sys/bus/pci/devices/*``: NVIDIA display/3D controllers (vendor 0x10de, class
  0x0300xx/0x0302xx) become GPUs, numbered in PCI bus order as ``nvidia-smi`` numbers
  them, with ``numa_node`` (-1 means unknown) and ``local_cpulist``;
* ``sys/class/infiniband/*``: every RDMA device becomes a NIC: its PCI device
  (``device`` link), first port's ``link_layer`` and ``state`` (``4: ACTIVE``), and its
  net device (``device/net/*``); SR-IOV VFs (``device/physfn`` exists) are not NICs;
* addresses per net device from ``ip -j address show`` (the ``addresses`` callable is
  injectable; when ``ip`` is missing the addresses stay unknown).

PCIe levels: each device's path below ``sys/devices`` (host bridge, root port, switch
ports, device) becomes a :class:`~gpu_topology.pcie.PciePlace` and
:func:`gpu_topology.pcie.pcie_level`, the rule the NCCL dump reader shares, decides.
sysfs knows nothing of NVLink: merge with nvml or nvidia-smi.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gpu_topology.discovery.base import Backend, Runner, run_command
from gpu_topology.errors import BackendUnavailable, DiscoveryError, ParseError
from gpu_topology.model import Gpu, Link, Nic, Topology, subnets_of
from gpu_topology.pcie import PciePlace, pcie_level, slot_of, switches_in_device_path

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")
AddressSource = Callable[[], Mapping[str, Sequence[str]]]


class SysfsBackend(Backend):
    """GPUs, RDMA NICs and PCIe levels from sysfs under ``root``."""

    name = "sysfs"
    install_hint = "run on Linux with /sys mounted (in a container: mount the host's /sys read-only)"

    def __init__(
        self,
        *,
        root: str | os.PathLike[str] = "/",
        addresses: AddressSource | None = None,
        runner: Runner = run_command,
    ) -> None:
        self.root = Path(root)
        self.runner = runner
        self.addresses = addresses if addresses is not None else self._ip_addresses

    def unavailable_reason(self) -> str | None:
        if not (self.root / "sys/bus/pci/devices").is_dir():
            return f"{self.root / 'sys/bus/pci/devices'} does not exist"
        return None

    def discover(self) -> Topology:
        self.require()
        try:
            return self._discover()
        except OSError as exc:
            raise DiscoveryError(f"reading sysfs under {self.root} failed: {exc}") from exc

    def _discover(self) -> Topology:
        pci = self.root / "sys/bus/pci/devices"
        gpu_dirs = sorted(p for p in pci.iterdir() if _is_gpu(p))
        addresses = self.addresses()
        gpus = [
            Gpu(
                index=i,
                pci_bus_id=p.name,
                numa_node=_numa(p),
                cpu_affinity=_read(p / "local_cpulist"),
            )
            for i, p in enumerate(gpu_dirs)
        ]
        # An SR-IOV VF is an RDMA device too, but it is a share of its PF, not a NIC of
        # the node: it is left out (gpu_topology.discovery.sriov lists VFs).
        nics = [
            self._nic(p, addresses)
            for p in _sorted_names(self.root / "sys/class/infiniband")
            if not (p / "device" / "physfn").exists()
        ]
        places = {g.name: self._place(d) for g, d in zip(gpus, gpu_dirs)}
        for nic in nics:
            device = self.root / "sys/class/infiniband" / nic.name / "device"
            if device.exists():  # software RDMA (rxe, siw) has no PCI device: no PCIe link
                places[nic.name] = self._place(device)
        names = list(places)
        links: dict[str, dict[str, Link]] = {}
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                links.setdefault(a, {})[b] = Link(pcie_level(places[a], places[b]))
        return Topology(gpus=tuple(gpus), nics=tuple(nics), links=links)

    def _nic(self, ib: Path, addresses: Mapping[str, Sequence[str]]) -> Nic:
        device = ib / "device"
        port = next(iter(_sorted_names(ib / "ports")), None)
        netdev = _netdev(ib, port)
        addrs = tuple(addresses.get(netdev, ())) if netdev else ()
        return Nic(
            name=ib.name,
            netdev=netdev,
            numa_node=_numa(device),
            link_layer=_read(port / "link_layer") if port else None,
            state=_port_state(_read(port / "state")) if port else None,
            addresses=addrs,
            subnets=subnets_of(addrs),
            pci_bus_id=device.resolve().name if device.exists() else None,
        )

    def _place(self, device: Path) -> PciePlace:
        """Where a device directory (or link to one) sits in the PCIe tree."""
        real = device.resolve()
        devices = (self.root / "sys/devices").resolve()
        try:
            parts = real.relative_to(devices).parts
        except ValueError:
            parts = (real.name,)  # not below a host bridge
        return PciePlace(
            numa_node=_numa(device),
            root=parts[0] if len(parts) > 1 else None,
            switches=switches_in_device_path(parts),
            slot=slot_of(parts[-1]),
        )

    def _ip_addresses(self) -> Mapping[str, Sequence[str]]:
        return ip_addresses(self.runner)


def ip_addresses_in(path: str, runner: Runner = run_command) -> dict[str, list[str]]:
    """:func:`ip_addresses` of the network namespace ``path`` (:mod:`dsplatform.netns`: the
    node's, for a discovery on the pod network); {} when it cannot be entered."""
    from dsplatform import netns

    try:
        where = netns.entered(path)
    except netns.NamespaceError:
        return {}  # addresses stay unknown; the fetch links say why
    return where.call(ip_addresses, runner)


def ip_addresses(runner: Runner = run_command) -> dict[str, list[str]]:
    """Net device -> its addresses (``ip -j address show``, in the calling thread's network
    namespace); {} when ``ip`` is missing or fails: the addresses stay unknown."""
    try:
        text = runner(["ip", "-j", "address", "show"], 10.0, "install iproute2")
    except (BackendUnavailable, DiscoveryError):
        return {}  # addresses stay unknown; everything else still stands
    return parse_ip_json(text)


def parse_ip_json(text: str) -> dict[str, list[str]]:
    """``ip -j address show`` output -> net device -> ``["10.0.0.5/24", ...]``."""
    try:
        links = json.loads(text) if text.strip() else []
    except ValueError as exc:
        raise ParseError(f"'ip -j address' output is not JSON: {exc}") from exc
    found: dict[str, list[str]] = {}
    for link in links if isinstance(links, list) else []:
        name = link.get("ifname") if isinstance(link, dict) else None
        if not name:
            continue
        for info in link.get("addr_info", []):
            if info.get("family") in ("inet", "inet6") and "local" in info and "prefixlen" in info:
                found.setdefault(name, []).append(f"{info['local']}/{info['prefixlen']}")
    return found


def _is_gpu(device: Path) -> bool:
    vendor, cls = _read(device / "vendor"), _read(device / "class")
    return vendor == NVIDIA_VENDOR and cls is not None and cls.startswith(GPU_CLASSES)


def _netdev(ib: Path, port: Path | None) -> str | None:
    names = _sorted_names(ib / "device" / "net")
    if names:
        return names[0].name
    if port is not None:
        return _read(port / "gid_attrs" / "ndevs" / "0")
    return None


def _port_state(text: str | None) -> str | None:
    """``4: ACTIVE`` -> ``ACTIVE``."""
    if not text:
        return None
    return text.split(":", 1)[-1].strip() or None


def _numa(device: Path) -> int | None:
    text = _read(device / "numa_node")
    if text is None or not text.lstrip("-").isdigit():
        return None
    value = int(text)
    return value if value >= 0 else None


def _read(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return text or None


def _sorted_names(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(directory.iterdir(), key=lambda p: _natural(p.name))


def _natural(name: str) -> tuple[object, ...]:
    """mlx5_2 before mlx5_10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))
