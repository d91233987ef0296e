"""The node's links for its own transfers: a version's bundles fetched over every RDMA NIC
near the node's GPUs, each connection bound to one NIC's address (docs/design.md#links).

Who calls it: :class:`dsagent.cache.service.CacheService` builds one :class:`Links` from
``DSAGENT_FETCH_LINKS`` (``auto``: :func:`choose_links` asks the node's topology);
:mod:`dsagent.cache.versions` opens a :class:`LinkSet` per version fetched; and
:func:`dsagent.cache.fetch.fetch_bundles` leases one link per bundle
(:meth:`LinkSet.lease`), over which :class:`~dsagent.cache.peers.PeerFetcher` (an httpx
client per local address) and the store read (:func:`bound_options`: aiohttp's socket
factory for ``http(s)://`` and ``s3://``) make their connections. A version with fewer
bundles than links reads a large bundle from the store as byte ranges, one per link
(:mod:`dsagent.cache.fetchranges`), leasing the extra links here too.

What it owns: which link a bundle goes over (the least busy one, ties to the link listed
first, so that the fetch workers spread the version's bundles over the links and the parts
meet in the version's staging directory, each bundle verified by digest as always), and
what a failure means. The order of the links is a priority: ``auto`` lists the NICs nearest
the node's GPUs first (:func:`gpu_topology.transfer_nics`: the same PCIe switch, then the
same host bridge, then the same NUMA node), so with fewer transfers at once than links the
nearest carry them; a list given in ``DSAGENT_FETCH_LINKS`` is taken in its order. A transfer
that fails over one link is tried once more, from the same source, over another
(:meth:`Lease.attempt`): when that one delivers, the first link is set aside for the rest of
the version's fetch and its remaining bundles go over the others; when it fails too, the
source is at fault and the caller's own handling (the next peer, the store) goes on. The last
link is never set aside. One link, or none configured: the default route, nothing bound.

The scatter of data inside a node's GPUs and the all-gather between them stay NCCL's: the
platform moves datasets onto the node's disk, not tensors into GPU memory.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

import httpcore
import httpx

from dsagent.cache.metrics import Metrics
from dsagent.cache.settings import Settings
from dsagent.errors import CacheDiskError, InsufficientSpace, IntegrityError, TransientError
from dsagent.format.egress import CheckedClient, Guard
from dsagent.format.storageconfig import Options, store_options
from dsplatform import netns as namespaces

log = logging.getLogger("dsagent.fetchlinks")

#: The smallest byte range one bundle is split into over several links (the default of
#: ``DSAGENT_FETCH_RANGE_MIN``; docs/design.md#links and :mod:`dsagent.cache.fetchranges`
#: say why 64 MiB).
RANGE_MIN = 64 << 20

_T = TypeVar("_T")

#: Errors that a transfer over another link may not have: the network's and the stream's.
#: A full or failing cache disk, a refusal or a missing object is the same over every link.
LINK_ERRORS: tuple[type[BaseException], ...] = (TransientError, IntegrityError, OSError, httpx.TransportError)
NOT_LINK_ERRORS: tuple[type[BaseException], ...] = (InsufficientSpace, CacheDiskError)


def can_bind(store: str) -> bool:
    """Whether reads from ``store`` can be bound to a local address (:func:`bound_options`)."""
    return store.startswith(("http://", "https://", "s3://", "s3a://"))


def bound_options(store: str, options: Options, address: str | None, netns: str | None = None) -> Options:
    """``options`` for reading bundles from ``store`` with every connection leaving from
    ``address`` (None: unchanged), its socket made in the network namespace ``netns`` (None:
    the agent's own; :mod:`dsplatform.netns`). ``http(s)://``: an aiohttp session of our own
    (``get_client``); ``s3://``: aiobotocore's connector ``socket_factory``. Other stores
    (gcs, azure, local paths) use the default route."""
    if address is None or not can_bind(store):
        return options
    given = store_options(options)
    merged = dict(given.values)
    if store.startswith(("http://", "https://")):
        merged["get_client"] = CheckedClient(None, address, netns)  # the agent's egress rule joins it in resolve()
    else:
        config = dict(merged.get("config_kwargs") or {})
        connector = dict(config.get("connector_args") or {})
        connector["socket_factory"] = Guard(None, address, netns)
        config["connector_args"] = connector
        merged["config_kwargs"] = config
    return given.with_values(merged)


class _NamespaceBackend(httpcore.SyncBackend):
    """httpcore's own connect, run in the network namespace ``where`` (the socket is its)."""

    def __init__(self, where: str) -> None:
        self.where = where

    def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        return namespaces.entered(self.where).call(super().connect_tcp, *args, **kwargs)


def transport_in(where: str, address: str, limits: httpx.Limits) -> httpx.HTTPTransport:
    """An httpx transport whose connections leave from ``address`` over sockets of the
    network namespace ``where`` (a peer fetch's link, :class:`~dsagent.cache.peers.PeerFetcher`).

    httpx's transport takes no network backend, so its pool is replaced by httpcore's own
    pool with one: the transport's request and response mapping stays httpx's."""
    transport = httpx.HTTPTransport(local_address=address, limits=limits)
    transport._pool = httpcore.ConnectionPool(
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        local_address=address,
        network_backend=_NamespaceBackend(where),
    )
    return transport


def addresses_of(nics: Sequence[Any]) -> tuple[str, ...]:
    """The first routable address of each NIC (``Nic.addresses`` are CIDR strings)."""
    import ipaddress

    found: list[str] = []
    for nic in nics:
        for text in nic.addresses:
            try:
                iface = ipaddress.ip_interface(text)
            except ValueError:
                continue
            if not iface.is_link_local:
                found.append(str(iface.ip))
                break
    return tuple(dict.fromkeys(found))


class LinkChoice(NamedTuple):
    """The links this node's fetches spread over (none: the default route), and why: what
    the agent logs, and in cluster mode says on its Node (the ``DsplatformFetchLinks``
    condition's reason and message, and an Event)."""

    addresses: tuple[str, ...]
    reason: str
    message: str


#: no link configured (``DSAGENT_FETCH_LINKS`` empty): the default route
NO_LINKS = LinkChoice((), "Off", "DSAGENT_FETCH_LINKS is empty: fetches take the default route")


def choose_links(settings: Settings, topology: Any = None) -> LinkChoice:
    """The links fetches spread over, in priority order, and why: ``DSAGENT_FETCH_LINKS``
    as given, or with ``auto`` the addresses of :func:`gpu_topology.transfer_nics` (the NICs
    near the node's GPUs, nearest first: the same PCIe switch, then the same host bridge,
    then the same NUMA node; or every RoCE NIC when no GPU is known) from ``topology`` or,
    when None, the node's own discovered; an address no socket here can leave from is left
    out, with a warning (with ``auto`` and none here at all, the agent on a pod network, an
    info line). With ``DSAGENT_NODE_NETNS`` the NICs' addresses, and whether a socket can
    leave from one, are those of that network namespace (the node's). Fewer than two: no
    link (one link is the default route). Blocking."""
    links = settings.fetch_links
    where = settings.node_netns
    if not links:
        return NO_LINKS
    if where is not None:
        try:
            namespaces.entered(where)
        except namespaces.NamespaceError as exc:  # the operator's setting: said, and the default route
            log.warning("fetch links: %s; fetching over the default route", exc)
            return LinkChoice((), "NamespaceRefused", f"{exc}: fetches take the default route")
    levels: dict[str, Any] = {}
    if links == ("auto",):
        from gpu_topology import TopologyError, discover, transfer_level, transfer_nics

        try:
            if topology is None:
                topology = discover(options=settings.discovery_options)
            nics = transfer_nics(topology)  # addresses read where the links' sockets are made
            links = addresses_of(nics)
            levels = {a: transfer_level(topology, nic) for nic in nics for a in addresses_of([nic])}
        except TopologyError as exc:
            log.warning("fetch links: the node's topology is unknown (%s); fetching over the default route", exc)
            return LinkChoice((), "NoTopology", f"the node's topology is unknown ({exc}): the default route")
        log.info(
            "fetch links from the topology, nearest first: %s", _described(links, levels) or "none with an address"
        )
    usable = tuple(a for a in links if _bindable(a, where))
    if len(usable) < len(links):
        missing = ", ".join(a for a in links if a not in usable)
        if settings.fetch_links == ("auto",) and not usable:
            # on a pod network without DSAGENT_NODE_NETNS: nothing is wrong, the NICs are the host's
            log.info("fetch links: %s are the host's, not in this network namespace: the default route", missing)
        else:
            hint = "" if where is not None else " (the NICs are the node's: DSAGENT_NODE_NETNS, or the host's network)"
            log.warning("fetch links: %s not on this node%s", missing, hint)
    if len(usable) > 1:
        return LinkChoice(usable, "Links", f"fetches split over {_described(usable, levels)}")
    if settings.fetch_links == ("auto",):
        near = f"one NIC near the GPUs ({usable[0]})" if usable else "no NIC near the GPUs with an address here"
        return LinkChoice((), "FewerThanTwoNics", f"{near}: fetches take the default route")
    return LinkChoice((), "NotOnNode", f"fewer than two of {', '.join(links)} on this node: the default route")


def _described(addresses: Sequence[str], levels: dict[str, Any]) -> str:
    """Each address with its NIC's nearest link to a GPU (``auto``), or as listed."""
    if not levels:
        return ", ".join(addresses)
    return ", ".join(f"{a} ({level.value if (level := levels.get(a)) else 'RoCE'})" for a in addresses)


def _bindable(address: str, where: str | None = None) -> bool:
    """Whether a socket can leave from ``address`` (an address of this network namespace, or
    of ``where``)."""
    import ipaddress

    family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    try:
        probe = (
            socket.socket(family, socket.SOCK_STREAM)
            if where is None
            else namespaces.entered(where).socket(family, socket.SOCK_STREAM)
        )
        with probe:
            probe.bind((address, 0))
    except OSError:
        return False
    return True


class Links:
    """The agent's links (local addresses, in priority order) and their metrics;
    :meth:`for_fetch` per version. ``range_min``: the smallest byte range a bundle is split
    into over the links (``DSAGENT_FETCH_RANGE_MIN``, :mod:`dsagent.cache.fetchranges`)."""

    def __init__(
        self, addresses: Sequence[str], metrics: Metrics, *, range_min: int = RANGE_MIN, netns: str | None = None
    ) -> None:
        self.addresses = tuple(addresses)
        self.metrics = metrics
        self.range_min = range_min
        self.netns = netns  # where the links' sockets are made (DSAGENT_NODE_NETNS; None: here)

    def __bool__(self) -> bool:
        return len(self.addresses) > 1

    def for_fetch(self, what: str) -> LinkSet | None:
        """A version's fetch over the links; None with fewer than two."""
        if not self:
            return None
        return LinkSet(self.addresses, self.metrics, what=what, range_min=self.range_min, netns=self.netns)


class LinkSet:
    """One version's fetch over the links: which link each bundle (or byte range of one)
    goes over, which links were set aside, and what each carried (bytes, bundles and
    ranges, by link)."""

    def __init__(
        self,
        addresses: Sequence[str],
        metrics: Metrics | None = None,
        *,
        what: str = "",
        range_min: int = RANGE_MIN,
        netns: str | None = None,
    ) -> None:
        self.addresses = tuple(addresses)
        self.netns = netns
        self.metrics = metrics
        self.what = what
        self.range_min = range_min
        self.bytes: dict[str, int] = dict.fromkeys(self.addresses, 0)
        self.bundles: dict[str, int] = dict.fromkeys(self.addresses, 0)
        self.ranges: dict[str, int] = dict.fromkeys(self.addresses, 0)
        self.range_bytes: dict[str, int] = dict.fromkeys(self.addresses, 0)
        self.set_aside: dict[str, str] = {}  # address -> why
        self._active: dict[str, int] = dict.fromkeys(self.addresses, 0)
        self._lock = threading.Lock()

    def _take(self, exclude: Collection[str] = ()) -> str | None:
        """The least busy link still in use and not in ``exclude`` (ties: the one listed
        first, the nearest), counted busy until :meth:`_give`."""
        with self._lock:
            alive = [a for a in self.addresses if a not in self.set_aside and a not in exclude]
            if not alive:
                return None
            best = min(alive, key=lambda a: (self._active[a], self.addresses.index(a)))
            self._active[best] += 1
            return best

    def _give(self, address: str) -> None:
        with self._lock:
            self._active[address] -= 1

    @contextlib.contextmanager
    def lease(self) -> Iterator[Lease]:
        """A link for one bundle's transfers (peer and store alike)."""
        address = self._take()
        try:
            yield Lease(self, address)
        finally:
            if address is not None:
                self._give(address)

    def _delivered(self, address: str, source: str, size: int, *, bundles: int = 1) -> None:
        with self._lock:
            self.bytes[address] += size
            self.bundles[address] += bundles
        if self.metrics is not None:
            self.metrics.link_transfer(address, source, size)

    def _ranged(self, address: str, compressed: int, *, ranges: int) -> None:
        """``compressed`` bytes of a bundle's byte ranges carried over ``address``, and
        ``ranges`` of them finished there."""
        with self._lock:
            self.range_bytes[address] += compressed
            self.ranges[address] += ranges
        if self.metrics is not None:
            self.metrics.link_range(address, compressed, ranges)

    def _set_aside(self, address: str, why: BaseException) -> None:
        with self._lock:
            if address in self.set_aside or len(self.set_aside) + 1 >= len(self.addresses):
                return  # the last link stays
            self.set_aside[address] = str(why)
        log.warning(
            "%s: link %s failed (%s) where another delivered; its remaining bundles go over the others",
            self.what,
            address,
            why,
        )
        if self.metrics is not None:
            self.metrics.link_failures.labels(link=address).inc()


class Lease:
    """One bundle's link (``address``; None: the default route, no :class:`LinkSet`)."""

    def __init__(self, links: LinkSet | None, address: str | None) -> None:
        self.links, self.address = links, address

    @property
    def netns(self) -> str | None:
        """The network namespace the link's sockets are made in (None: the agent's own)."""
        return self.links.netns if self.links is not None else None

    def attempt(
        self,
        call: Callable[[str | None], _T],
        *,
        source: str,
        size: int,
        answers: tuple[type[BaseException], ...] = (),
    ) -> _T:
        """``call(address)``; after a network or stream error, once more over another link:
        if that one delivers, this lease's link is set aside (see the module docstring); if
        it fails too, its error is raised (the source is at fault). ``answers``: errors that
        are the source's answer (a peer's refusal), raised as they come."""
        links, first = self.links, self.address
        if links is None or first is None:
            return call(None)
        try:
            result = call(first)
        except NOT_LINK_ERRORS + answers:
            raise
        except LINK_ERRORS as exc:
            other = links._take(exclude=(first,))
            if other is None:
                raise
            try:
                result = call(other)
            finally:
                links._give(other)
            links._set_aside(first, exc)
            links._delivered(other, source, size)
            return result
        links._delivered(first, source, size)
        return result


#: The lease of a fetch without links.
DEFAULT_ROUTE = Lease(None, None)

__all__ = [
    "DEFAULT_ROUTE",
    "LINK_ERRORS",
    "LinkChoice",
    "NOT_LINK_ERRORS",
    "RANGE_MIN",
    "Lease",
    "LinkSet",
    "NO_LINKS",
    "Links",
    "addresses_of",
    "bound_options",
    "can_bind",
    "choose_links",
    "transport_in",
]
