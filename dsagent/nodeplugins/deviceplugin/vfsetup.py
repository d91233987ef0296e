"""The node's side of the VFs: how many each RoCE NIC gets, and a VF's address.

Who calls it: ``dsagent serve`` before it starts the device plugin (:func:`set_up_vfs`),
when ``DSAGENT_VF_SETUP`` is on or auto or ``DSAGENT_VF_ADDRESSES`` names a file
(docs/design.md#roce-allocation), and the tests. What it owns:

* :func:`vf_counts`, pure: the RoCE design's claim 3, each physical NIC split into as many
  VFs as there are GPUs affine to it (a GPU is affine to its nearest NICs,
  :func:`gpu_topology.nearest_nics`); :func:`create_vfs` writes those counts through
  :func:`gpu_topology.discovery.sriov.set_numvfs`, leaving a NIC already at its count alone;
  :func:`auto_counts`, what ``auto`` creates: only on NICs with SR-IOV and no VF yet;
* :func:`set_address`: the VF netdev's IPv4 address and link state over netlink
  (``pyroute2``, the ``netlink`` extra), idempotent: the address given is the only IPv4
  address left on the link, and the link is up. The address itself comes from the operator
  (the design names no source); an SR-IOV CNI with an IPAM is the other way
  (docs/design.md#vf-networks). :class:`AddressAtAllocation` sets it when a container is
  given the VF (the device plugin's ``Allocate``, as the kubelet creates the container), as
  the design sets it when the training container starts.

pyroute2 is imported on first use, so nodes without the extra run everything else.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dsagent.errors import DsagentError, InvalidInput
from dsplatform import boundedjson
from gpu_topology import Topology, nearest_nics
from gpu_topology.discovery.sriov import PhysicalFunction, discover_vfs, set_numvfs
from gpu_topology.errors import DiscoveryError

log = logging.getLogger("dsagent.nodeplugins")
MAX_ADDRESS_FILE = 1 << 20


class VfSetupFailed(DsagentError):
    """The kernel refused a VF's count, address or link state."""

    code = "vf_setup_failed"
    grpc_status = "FAILED_PRECONDITION"


def vf_counts(topology: Topology, nics: Iterable[str] | None = None) -> dict[str, int]:
    """NIC -> the number of GPUs affine to it (claim 3), for ``nics`` (default: every NIC near a GPU)."""
    counts: dict[str, int] = {}
    for gpu in topology.gpus:
        for nic in nearest_nics(topology, gpu.index):
            counts[nic] = counts.get(nic, 0) + 1
    if nics is None:
        return dict(sorted(counts.items()))
    return {nic: counts.get(nic, 0) for nic in sorted(nics)}


def create_vfs(root: str | os.PathLike[str], counts: dict[str, int]) -> list[str]:
    """Enable ``counts[nic]`` VFs on each NIC under ``root``; the NICs written to, in order."""
    written = []
    for nic, count in counts.items():
        try:
            if set_numvfs(root, nic, count):
                written.append(nic)
        except DiscoveryError as exc:
            raise VfSetupFailed(str(exc), hint="check the NIC's SR-IOV firmware setting (sriov_totalvfs)") from exc
    return written


def set_address(netdev: str, address: str, *, netns: str | None = None) -> None:
    """Give ``netdev`` the IPv4 ``address`` (``a.b.c.d/len``) as its only IPv4 address, and bring it up.

    ``netns``: the path of the network namespace to act in (``DSAGENT_NODE_NETNS``, the
    node's for an agent on the pod network), else the agent's own; the netlink socket is
    made there (:mod:`dsplatform.netns`).
    """
    try:
        interface = ipaddress.IPv4Interface(address)
    except ValueError as exc:
        raise InvalidInput(f"VF address {address[:64]!r} is not an IPv4 address with a prefix length") from exc
    if "/" not in address:
        raise InvalidInput(f"VF address {address!r} needs a prefix length (a.b.c.d/len)")
    if netns is None:
        _set_address(netdev, interface, netns)
        return
    from dsplatform import netns as namespaces

    try:
        where = namespaces.entered(netns)
    except namespaces.NamespaceError as exc:
        raise VfSetupFailed(f"setting {address} on {netdev}: {exc}") from exc
    where.call(_set_address, netdev, interface, netns)


def _set_address(netdev: str, interface: ipaddress.IPv4Interface, netns: str | None) -> None:
    """:func:`set_address` over a netlink socket of the calling thread's namespace."""
    from pyroute2 import IPRoute  # the netlink extra

    address = str(interface)
    ipr: Any = IPRoute()
    try:
        found = ipr.link_lookup(ifname=netdev)
        if not found:
            raise InvalidInput(f"no network device {netdev!r}" + (f" in netns {netns}" if netns else ""))
        index = found[0]
        wanted = (str(interface.ip), interface.network.prefixlen)
        present = False
        for entry in ipr.get_addr(index=index, family=2):  # AF_INET
            current = (entry.get_attr("IFA_ADDRESS"), entry["prefixlen"])
            if current == wanted:
                present = True
            else:
                ipr.addr("del", index=index, address=current[0], prefixlen=current[1])
        if not present:
            ipr.addr("add", index=index, address=wanted[0], prefixlen=wanted[1])
        ipr.link("set", index=index, state="up")
    except DsagentError:
        raise
    except Exception as exc:  # pyroute2's NetlinkError and OSError: one line, not a traceback
        raise VfSetupFailed(f"setting {address} on {netdev}: {exc}") from exc
    finally:
        ipr.close()


def read_addresses(path: Path, vf_netdevs: Iterable[str]) -> dict[str, str]:
    """The address file: ``{"<vf netdev>": "a.b.c.d/len"}``, bounded, only the node's VF netdevs."""
    try:
        with path.open("rb") as file:
            text = file.read(MAX_ADDRESS_FILE + 1)
        data = boundedjson.loads(text, what=str(path), max_bytes=MAX_ADDRESS_FILE)
    except OSError as exc:
        raise InvalidInput(f"cannot read the VF address file {path}: {exc.strerror}") from exc
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise InvalidInput(f'{path}: expected a JSON object of VF netdev -> "a.b.c.d/len"')
    known = set(vf_netdevs)
    unknown = sorted(k for k in data if k not in known)
    if unknown:
        raise InvalidInput(f"{path}: {', '.join(k[:32] for k in unknown[:5])} are not VF netdevs of this node")
    return dict(data)


def auto_counts(topology: Topology, pfs: Mapping[str, PhysicalFunction]) -> dict[str, int]:
    """What ``auto`` creates: claim 3's count on each GPU-affine NIC whose SR-IOV is on in its
    firmware (``sriov_totalvfs`` > 0) and which has no VF yet, at most what it offers. A NIC
    with VFs already is left as it is: someone else (the SR-IOV network operator, an
    operator) made them, and a new count would destroy the VFs running containers hold."""
    return {
        nic: min(count, pfs[nic].totalvfs or 0)
        for nic, count in vf_counts(topology, pfs).items()
        if count > 0 and pfs[nic].numvfs == 0 and (pfs[nic].totalvfs or 0) > 0
    }


def set_up_vfs(
    topology: Topology,
    pfs: Mapping[str, PhysicalFunction],
    root: str | os.PathLike[str],
    create: str,
    addresses: Path | None,
) -> dict[str, PhysicalFunction]:
    """The agent's start-up step: VFs created (``create``: ``on``, claim 3's count on every
    affine NIC, a refusal stops the start; ``auto``, :func:`auto_counts`, a refusal is
    logged and the NIC goes without VFs; ``off``), the address file checked (every name a VF
    netdev of this node); the VFs read again. The addresses themselves are set when a
    container is given its VF (:class:`AddressAtAllocation`), as the design sets a VF's
    address when the training container starts."""
    if create in ("on", "auto"):
        if create == "on":
            counts = {nic: n for nic, n in vf_counts(topology, pfs).items() if n > 0}
            written = create_vfs(root, counts)
        else:
            counts, written = auto_counts(topology, pfs), []
            for nic, count in counts.items():
                try:
                    written += create_vfs(root, {nic: count})
                except VfSetupFailed as exc:
                    log.warning("VFs on %s not created (its containers get GPUs only): %s", nic, exc)
        if written:
            log.info("enabled VFs: %s", ", ".join(f"{nic}={counts[nic]}" for nic in written))
            pfs = discover_vfs(root)
    if addresses is not None:
        netdevs = [vf.netdev for pf in pfs.values() for vf in pf.vfs if vf.netdev]
        read_addresses(addresses, netdevs)  # a bad file stops the start, not a container later
    return dict(pfs)


class AddressAtAllocation:
    """Sets the address of each VF a container is given, when it is given it: the device
    plugin calls it from ``Allocate``, which the kubelet calls as it creates the container.
    The address file is read again at each call (an operator's change needs no agent
    restart); a VF the file does not name keeps what it has (an SR-IOV CNI's IPAM may own
    it). ``setter`` is :func:`set_address` (a test's stand-in records instead)."""

    def __init__(self, path: Path, known: Iterable[str], setter: Any = None, *, netns: str | None = None) -> None:
        self.path, self.known, self.netns = path, sorted(set(known)), netns  # known: the node's VF netdevs
        self.setter = setter if setter is not None else set_address

    def __call__(self, netdevs: Iterable[str]) -> dict[str, str]:
        """Set the file's address of each of ``netdevs``; the addresses set, by netdev.
        Raises :class:`VfSetupFailed` (the container is refused) or :class:`InvalidInput`."""
        wanted = [n for n in netdevs if n]
        if not wanted:
            return {}
        addresses = read_addresses(self.path, self.known)
        done = {}
        for netdev in wanted:
            address = addresses.get(netdev)
            if address is None:
                continue
            if self.netns is None:
                self.setter(netdev, address)
            else:
                self.setter(netdev, address, netns=self.netns)
            done[netdev] = address
            log.info("VF %s has address %s (its container starts)", netdev, address)
        return done


__all__ = [
    "AddressAtAllocation", "VfSetupFailed", "auto_counts", "create_vfs", "read_addresses", "set_address",
    "set_up_vfs", "vf_counts",
]  # fmt: skip
