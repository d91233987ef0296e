"""Where the agent may connect for a pod: the egress rule for the hosts a request names.

A URL's body becomes the pod's file. The agent runs on the node (often on its network), so
without this rule a pod could name ``http://169.254.169.254/...`` or the GCE metadata server
with its ``Metadata-Flavor`` header, or point an S3 endpoint at them, and read the node's
cloud credentials as a dataset; or reach the cluster's internal services.

Who calls it: the agent's source check (:func:`dsagent.format.sources.check_location`,
every source, bundle store and store endpoint of every request, before anything is
recorded) and every filesystem the agent builds for a request
(:func:`dsagent.format.storage.resolve`, through :class:`~dsagent.format.storageconfig.StoreOptions`).
``dsctl`` on a user's own machine does not use it.

The rule (docs/threat-model.md#egress):

- a host is resolved and **every** address it resolves to must be allowed: none in
  :data:`ALWAYS_DENIED` (loopback, unspecified, link-local, the cloud metadata addresses),
  none in the operator's denied ranges (the cluster's pod and service ranges:
  ``DSAGENT_EGRESS_DENY``, the chart's ``agent.egress.deny``), unless the operator allows
  that address, range or host name (``DSAGENT_EGRESS_ALLOW``); the metadata host names
  (:data:`METADATA_NAMES`) are refused by name;
- the connection goes to an address checked at connect time: the agent's HTTP(S) and S3
  clients open every socket through a :class:`Guard`, which checks the address it connects
  to, so a second resolution (DNS rebinding), an address literal or a redirect to another
  host meets the same rule;
- request headers a pod may set are the operator's allowlist (none by default), and the
  headers metadata services require (:data:`FORBIDDEN_HEADERS`) are never accepted.

Every refusal is :class:`~dsagent.errors.InvalidInput` (400) naming the host, the address and
the setting that would allow it.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from dsagent.errors import InvalidInput
from dsplatform import netns as namespaces

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Never fetched for a request unless the operator allows them by name: loopback,
#: unspecified, link-local (cloud metadata at 169.254.169.254 and fd00:ec2::254 among them),
#: and the metadata and platform addresses outside those ranges (Alibaba's, Azure's WireServer).
ALWAYS_DENIED: tuple[str, ...] = (
    "127.0.0.0/8",
    "::1/128",
    "0.0.0.0/8",
    "::/128",
    "169.254.0.0/16",
    "fe80::/10",
    "fd00:ec2::254/128",
    "100.100.100.200/32",
    "168.63.129.16/32",
)

#: The cloud metadata servers' host names, refused before they are resolved.
METADATA_NAMES = frozenset(
    {"metadata", "metadata.google.internal", "metadata.goog", "instance-data", "instance-data.ec2.internal"}
)

#: Request headers a metadata service requires: never accepted from a request, whatever the
#: operator's header allowlist says.
FORBIDDEN_HEADERS = frozenset(
    {
        "metadata-flavor",
        "metadata",
        "x-google-metadata-request",
        "x-aws-ec2-metadata-token",
        "x-aws-ec2-metadata-token-ttl-seconds",
        "x-forwarded-for",
        "host",
    }
)

#: What the operator allows by default beyond the rule: nothing (the test suite allows its
#: loopback servers here, through the same allowance an operator uses).
DEFAULT_ALLOWED: tuple[str, ...] = ()

#: The cluster ranges denied by default: kubeadm's default service range and the most common
#: pod range (flannel's, kubeadm's documentation). The chart sets a cluster's own.
DEFAULT_DENIED: tuple[str, ...] = ("10.96.0.0/12", "10.244.0.0/16")

_HINT = "the operator can allow it: DSAGENT_EGRESS_ALLOW (the chart's agent.egress.allow)"


def parse_networks(values: Iterable[str]) -> tuple[Network, ...]:
    """CIDRs (or single addresses) as networks; ValueError naming a bad one."""
    out = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{value!r} is not an address or a CIDR range") from None
    return tuple(out)


@dataclass(frozen=True)
class EgressPolicy:
    """The denied ranges and what the operator allows beyond them (ranges, or host names)."""

    denied: tuple[Network, ...] = parse_networks(ALWAYS_DENIED + DEFAULT_DENIED)
    allowed: tuple[Network, ...] = ()
    allowed_hosts: frozenset[str] = frozenset()

    @classmethod
    def of(cls, deny: Iterable[str] = DEFAULT_DENIED, allow: Iterable[str] = DEFAULT_ALLOWED) -> EgressPolicy:
        """The built-in rule plus the operator's ``deny`` ranges; ``allow``: ranges and
        addresses, or host names (anything that is not an address)."""
        networks, hosts = [], set()
        for item in allow:
            try:
                networks.append(ipaddress.ip_network(item.strip(), strict=False))
            except ValueError:
                hosts.add(item.strip().lower().rstrip("."))
        return cls(parse_networks((*ALWAYS_DENIED, *deny)), tuple(networks), frozenset(hosts))

    def refusal(self, address: str) -> str | None:
        """Why ``address`` may not be connected to, or None when it may."""
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in net for net in self.allowed):
            return None
        for net in self.denied:
            if ip in net:
                return f"{ip} is in {net}, which this agent does not fetch from for a request"
        return None

    def host_allowed(self, host: str) -> bool:
        return host.lower().rstrip(".") in self.allowed_hosts

    def check_host(self, host: str, port: int | None, *, what: str) -> None:
        """Refuse ``host`` unless every address it resolves to may be connected to."""
        name = host.strip("[]").lower().rstrip(".")
        if self.host_allowed(name):
            return
        if name in METADATA_NAMES:
            raise InvalidInput(f"{what} names the metadata server {host!r}, which this agent does not fetch from")
        try:
            addresses = [ipaddress.ip_address(name.split("%", 1)[0]).compressed]
        except ValueError:
            addresses = resolve(name, port)
        for address in addresses:
            reason = self.refusal(address)
            if reason is not None:
                raise InvalidInput(f"{what}: host {host!r} resolves to {reason}", hint=_HINT)

    def check_url(self, url: str, *, what: str) -> None:
        parts = urlsplit(url)
        if parts.hostname:
            self.check_host(parts.hostname, parts.port, what=what)

    def bounded(self, protocol: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` whose connections resolve through :class:`CheckedResolver`: fsspec's
        HTTP(S) client (``get_client``), S3's aiobotocore connector (``connector_args``)."""
        merged = dict(options)
        if protocol in ("http", "https"):
            client = merged.get("get_client")
            bound = client if isinstance(client, CheckedClient) else CheckedClient(None)
            merged["get_client"] = CheckedClient(self, bound.local_address, bound.netns)
        elif protocol in ("s3", "s3a"):
            config = dict(merged.get("config_kwargs") or {})
            connector = dict(config.get("connector_args") or {})
            given = connector.get("socket_factory")
            link = given if isinstance(given, Guard) else Guard(None)
            guard = Guard(self, link.local_address, link.netns)
            connector["resolver"], connector["socket_factory"] = guard.resolver, guard
            config["connector_args"] = connector
            merged["config_kwargs"] = config
        return merged


def resolve(host: str, port: int | None) -> list[str]:
    """The addresses ``host`` resolves to (InvalidInput when it does not)."""
    try:
        infos = socket.getaddrinfo(host, port or 443, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise InvalidInput(f"host {host!r} does not resolve: {exc}") from None
    return sorted({str(info[4][0]) for info in infos})


def check_headers(headers: Sequence[str]) -> None:
    """Refuse a header a metadata service requires, whatever the allowlist says."""
    for name in headers:
        if str(name).strip().lower() in FORBIDDEN_HEADERS:
            raise InvalidInput(
                f"request header {name!r} is never sent for a request",
                hint="metadata services require it; credentials come from a storage Secret",
            )


class Guard:
    """The connect-time half of the rule, for one client: a socket factory (aiohttp's
    ``socket_factory``) that refuses to open a connection to an address the policy refuses,
    whether the host was a name or an address literal (aiohttp resolves no literal, and a
    redirect may name one), and a resolver (:attr:`resolver`) that refuses the metadata
    names and grants the addresses of the host names the operator allows. With a
    ``local_address`` every connection leaves from it (a fetch link), with ``netns`` from a
    socket made in that network namespace (:mod:`dsplatform.netns`: the node's, for an agent
    on the pod network). Its ``repr`` names both, so fsspec keeps a filesystem per link."""

    def __init__(self, policy: EgressPolicy | None, local_address: str | None = None, netns: str | None = None) -> None:
        self.policy = policy
        self.local_address = local_address
        self.netns = netns
        self.granted: set[str] = set()  # addresses of host names the operator allows

    @property
    def resolver(self) -> CheckedResolver:
        return _resolver_class()(self)

    def __call__(self, addr_info: Sequence[Any]) -> socket.socket:
        family, kind, proto, sockaddr = addr_info[0], addr_info[1], addr_info[2], addr_info[4]
        address = str(sockaddr[0])
        if self.policy is not None and address not in self.granted:
            reason = self.policy.refusal(address)
            if reason is not None:
                raise OSError(f"refused to connect: {reason}")
        sock = (
            socket.socket(family, kind, proto)
            if self.netns is None
            else namespaces.entered(self.netns).socket(family, kind, proto)
        )
        try:
            sock.setblocking(False)
            if self.local_address is not None:
                sock.bind((self.local_address, 0))
        except BaseException:
            sock.close()
            raise
        return sock

    def __repr__(self) -> str:
        return f"Guard({_named(self.policy)}, {self.local_address!r}{_in(self.netns)})"

    def __eq__(self, other: object) -> bool:
        mine = (self.policy, self.local_address, self.netns)
        return isinstance(other, Guard) and (other.policy, other.local_address, other.netns) == mine

    def __hash__(self) -> int:
        return hash(("Guard", self.local_address))


class CheckedResolver:
    """aiohttp's resolver interface: the system's answers, refusing the metadata names and
    granting (to its :class:`Guard`) the addresses of host names the operator allows; the
    guard checks every address again when it opens the connection. Built through
    :func:`_resolver_class`, which makes it an aiohttp ``AbstractResolver`` (aiobotocore
    checks that) without importing aiohttp where no connection is made."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict[str, Any]]:
        import asyncio

        policy = self.guard.policy
        allowed = policy is not None and policy.host_allowed(host)
        if policy is not None and not allowed and host.lower().rstrip(".") in METADATA_NAMES:
            raise OSError(f"{host} is a metadata server, which this agent does not fetch from")
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM, family=family)
        hosts = []
        for fam, _, proto, _, sockaddr in infos:
            if allowed:
                self.guard.granted.add(str(sockaddr[0]))
            hosts.append(
                {"hostname": host, "host": str(sockaddr[0]), "port": sockaddr[1], "family": fam, "proto": proto}
                | {"flags": 0}
            )
        if not hosts:
            raise OSError(f"{host} does not resolve")
        return hosts

    async def close(self) -> None:
        return None

    def __repr__(self) -> str:  # fsspec keys its filesystem cache by the options' repr
        return f"CheckedResolver({self.guard!r})"


@functools.cache
def _resolver_class() -> type[CheckedResolver]:
    from aiohttp.abc import AbstractResolver

    class Resolver(CheckedResolver, AbstractResolver):  # type: ignore[misc]
        pass

    return Resolver


class CheckedClient:
    """fsspec's HTTP filesystem ``get_client``: an aiohttp session whose connections go
    through a :class:`Guard` (``policy``: None checks nothing; ``local_address``: the link
    every connection leaves from; ``netns``: the network namespace its sockets are made in)."""

    def __init__(self, policy: EgressPolicy | None, local_address: str | None = None, netns: str | None = None) -> None:
        self.policy = policy
        self.local_address = local_address
        self.netns = netns

    async def __call__(self, **kwargs: Any) -> Any:
        import aiohttp

        kwargs.pop("loop", None)  # the running loop; aiohttp takes it from there
        guard = Guard(self.policy, self.local_address, self.netns)
        connector = aiohttp.TCPConnector(resolver=guard.resolver, socket_factory=guard)  # type: ignore[arg-type]
        return aiohttp.ClientSession(connector=connector, **kwargs)

    def __repr__(self) -> str:
        return f"CheckedClient({_named(self.policy)}, {self.local_address!r}{_in(self.netns)})"


def _in(where: str | None) -> str:
    """A network namespace in a repr (nothing for the process's own)."""
    return "" if where is None else f", netns={where!r}"


def _named(policy: EgressPolicy | None) -> str:
    """A policy's name in a repr: fsspec keys its filesystem cache by the options' repr, so
    two policies must not read alike."""
    return "unchecked" if policy is None else f"checked-{hash(policy) & 0xFFFFFFFF:08x}"


__all__ = [
    "ALWAYS_DENIED",
    "DEFAULT_ALLOWED",
    "DEFAULT_DENIED",
    "FORBIDDEN_HEADERS",
    "METADATA_NAMES",
    "CheckedClient",
    "CheckedResolver",
    "EgressPolicy",
    "Guard",
    "check_headers",
    "parse_networks",
    "resolve",
]
