"""Fetch links whose sockets are made in another network namespace (``DSAGENT_NODE_NETNS``,
docs/design.md#links): the node's, for an agent on the pod network.

A real network namespace stands for the node's: a veth pair joins it to this test's own
namespace (which stands for the pod network), its end holding two link addresses that exist
only in there; the store listens on this side's end. The store sees every bundle request
come from a link address: the sockets were made in the namespace, since nothing here could
leave from those addresses. One test runs the chart's defaults on a recorded two-NIC node
whose NICs are that namespace's net devices. Needs root (``ip netns``); skipped, saying why,
without it.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from dsagent.cache.fetchlinks import bound_options, choose_links, transport_in
from dsagent.cache.settings import Settings
from dsagent.format.bundles.bundle import pack
from dsagent.format.egress import EgressPolicy, Guard
from dsagent.format.storageconfig import user_options
from dsplatform.netns import Namespace, NamespaceError
from gpu_topology import Gpu, Link, Nic, Topology
from gpu_topology.discovery.sysfs import ip_addresses, ip_addresses_in
from gpu_topology.testing import SysfsTree
from tests.charts.test_chart import render
from tests.dsagent.cache.test_fetchlinks import FILES, RecordingStore, _cache, _metrics
from tests.dsagent.conftest import write_tree
from tests.fake_nvidia_smi import fake_nvidia_smi
from tests.test_default_install_gpu_path import chart_env

_names = itertools.count()


class Node(NamedTuple):
    """A node's network namespace as :func:`node_ns` made it."""

    path: str  # its file (/var/run/netns/<name>)
    host_side: str  # this side's end of the veth pair: where the store listens
    links: tuple[str, str]  # the two addresses on that namespace's end
    second: str  # the address of a second NIC, inside it
    netdevs: tuple[str, str]  # the net devices of the two NICs there


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def node_ns() -> Iterator[Node]:
    """A new network namespace joined to this one by a veth pair: this side ``host_side``,
    that side both ``links``, and a second pair inside it for a NIC of its own (``second``).
    Each namespace has subnets of its own (10.<pid>.<k>.0/24): tests run side by side."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to make a network namespace")
    k = next(_names)
    n = f"{os.getpid() % 100000}{k}"
    net = f"10.{64 + os.getpid() % 128}.{(2 * k) % 254}"
    other = f"10.{64 + os.getpid() % 128}.{(2 * k) % 254 + 1}"
    name, here, there, inner = f"dsptest{n}", f"dsph{n}", f"dspn{n}", f"dspb{n}"
    try:
        _ip("netns", "add", name)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot make a network namespace here: {exc.stderr.decode().strip()}")
    node = Node(f"/var/run/netns/{name}", f"{net}.1", (f"{net}.2", f"{net}.3"), f"{other}.2", (there, inner))
    try:
        _ip("link", "add", here, "type", "veth", "peer", "name", there, "netns", name)
        _ip("addr", "add", f"{node.host_side}/24", "dev", here)
        _ip("link", "set", here, "up")
        for address in node.links:
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", there)
        # no IPv6 link-local addresses inside: one appearing between two reads of a test
        # (the kernel adds it a moment after the link comes up) made them differ
        _ip("-n", name, "link", "set", there, "addrgenmode", "none")
        _ip("-n", name, "link", "set", there, "up")
        _ip("-n", name, "link", "add", inner, "type", "veth", "peer", "name", f"dspc{n}")
        _ip("-n", name, "link", "set", inner, "addrgenmode", "none")
        _ip("-n", name, "link", "set", f"dspc{n}", "addrgenmode", "none")
        _ip("-n", name, "addr", "add", f"{node.second}/24", "dev", inner)
        _ip("-n", name, "link", "set", inner, "up")
        _ip("-n", name, "link", "set", f"dspc{n}", "up")
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("route", "add", f"{other}.0/24", "dev", here)  # the answers to the second NIC's address
        yield node
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


@pytest.fixture
def store(tmp_path: Path, node_ns: Node) -> Iterator[tuple[Any, RecordingStore]]:
    www = tmp_path / "www"
    write_tree(www / "src", FILES)
    manifest = pack(www / "src", www / "store", name="shards", max_files=3)
    server = RecordingStore(www, host=node_ns.host_side)
    yield manifest, server
    server.shutdown()
    server.server_close()


def test_a_store_fetch_leaves_from_link_addresses_only_the_namespace_has(
    store: Any, node_ns: Node, agent_factory: Any
) -> None:
    manifest, server = store
    env = {
        "DSAGENT_FETCH_LINKS": ",".join(node_ns.links),
        "DSAGENT_NODE_NETNS": node_ns.path,
        "DSAGENT_FETCH_WORKERS": "2",
        "DSAGENT_EGRESS_ALLOW": f"127.0.0.0/8,{node_ns.host_side}/32",
    }
    agent = agent_factory("b", env=env)
    _cache(agent, store)  # ready, every bundle verified
    assert set(server.seen) == set(node_ns.links), f"the store saw connections from {dict(server.seen)}"
    assert sum(server.seen.values()) == len(manifest.bundles)
    carried = _metrics(agent, "dsplatform_agent_link_bytes_total")
    assert set(carried) == set(node_ns.links) and sum(carried.values()) == manifest.total_bytes


def test_without_the_namespace_those_addresses_are_no_links(store: Any, node_ns: Node, agent_factory: Any) -> None:
    _, server = store
    env = {
        "DSAGENT_FETCH_LINKS": ",".join(node_ns.links),
        "DSAGENT_EGRESS_ALLOW": f"127.0.0.0/8,{node_ns.host_side}/32",
    }
    agent = agent_factory("b", env=env)
    _cache(agent, store)
    assert set(server.seen) == {node_ns.host_side}, "the default route: this side's own address"
    assert "not on this node" in agent.log.read_text()


def test_a_peer_transport_connects_from_the_namespace(store: Any, node_ns: Node) -> None:
    _, server = store
    limits = httpx.Limits(max_connections=4, max_keepalive_connections=2)
    with httpx.Client(transport=transport_in(node_ns.path, node_ns.links[1], limits), timeout=10) as client:
        assert client.get(f"{server.url}/store/bundles/nothing").status_code == 404
    assert set(server.seen) == {node_ns.links[1]}
    with (
        pytest.raises(httpx.ConnectError),
        httpx.Client(transport=httpx.HTTPTransport(local_address=node_ns.links[1])) as here,
    ):
        here.get(f"{server.url}/store/bundles/nothing")


def test_discovery_reads_the_nics_addresses_in_the_namespace(node_ns: Node) -> None:
    """The topology (from the node's /sys) names the NICs' net devices; their addresses are
    read in the node's namespace, and auto takes them there."""
    first, second = node_ns.netdevs
    found = ip_addresses_in(node_ns.path)
    nics = {dev: found[dev] for dev in node_ns.netdevs}
    assert nics == {first: [f"{a}/24" for a in node_ns.links], second: [f"{node_ns.second}/24"]}
    assert first not in ip_addresses(), "not in this namespace"
    options = Settings(node_netns=node_ns.path).discovery_options
    assert options is not None and options["sysfs"]["addresses"]() == found
    topology = Topology(
        gpus=(Gpu(0),),
        nics=tuple(
            Nic(name, netdev=dev, link_layer="Ethernet", addresses=tuple(found[dev]))
            for name, dev in (("mlx5_0", first), ("mlx5_1", second))
        ),
        links={"GPU0": {"mlx5_0": Link.parse("PIX"), "mlx5_1": Link.parse("NODE")}},
    )
    there = Settings(fetch_links=("auto",), node_netns=node_ns.path)
    assert choose_links(there, topology).addresses == (node_ns.links[0], node_ns.second)
    assert choose_links(Settings(fetch_links=("auto",)), topology).addresses == (), "no socket here leaves from them"


def test_a_namespace_that_cannot_be_entered_is_the_default_route_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    not_one = tmp_path / "plain-file"
    not_one.write_text("")
    with pytest.raises(NamespaceError, match="cannot enter the network namespace"):
        Namespace(str(not_one))
    with pytest.raises(NamespaceError, match="cannot open"):
        Namespace(str(tmp_path / "missing"))
    links = ("192.0.2.2", "192.0.2.3")  # TEST-NET-1: on no node
    assert choose_links(Settings(fetch_links=links, node_netns=str(tmp_path / "missing"))).addresses == ()
    assert ip_addresses_in(str(tmp_path / "missing")) == {}, "discovery: the addresses stay unknown"
    assert [r.getMessage() for r in caplog.records if "default route" in r.getMessage()] == [
        f"fetch links: cannot open the network namespace {tmp_path / 'missing'}: No such file or "
        "directory; fetching over the default route"
    ]


def test_the_setting_takes_an_absolute_path_or_nothing() -> None:
    assert Settings(node_netns="").node_netns is None
    assert Settings(node_netns=" /proc/1/ns/net ").node_netns == "/proc/1/ns/net"
    with pytest.raises(ValueError, match="an absolute path"):
        Settings(node_netns="proc/1/ns/net")


def test_a_default_install_splits_a_fetch_over_the_near_nics(
    store: Any, node_ns: Node, agent_factory: Any, tmp_path: Path
) -> None:
    """The chart's defaults on a recorded two-NIC node (Princeton Della: 2 A100s, each with
    one NIC on its NUMA node; ``nvidia-smi topo -m`` replayed), whose NICs' net devices (a
    synthetic /sys) are the namespace's: the agent reads their addresses in the node's
    namespace and fetches over both, from the pod network."""
    manifest, server = store
    env = chart_env(render({}), "DaemonSet", "-agent")
    assert env["DSAGENT_FETCH_LINKS"] == "auto" and env["DSAGENT_NODE_NETNS"] == "/proc/1/ns/net"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_nvidia_smi(bin_dir, "della", "princeton-della-2xA100-pcie-2nic-epyc-nvidia-smi-topo-m.txt")
    for tool in ("ip", "cat"):  # the NICs' addresses; the replayed nvidia-smi; nothing else of the machine's
        (bin_dir / tool).symlink_to(str(shutil.which(tool)))
    tree = SysfsTree(tmp_path / "host")
    tree.rdma("mlx5_0", ["pci0000:00", "0000:00:01.0", "0000:03:00.0"], netdev=node_ns.netdevs[0])
    tree.rdma("mlx5_1", ["pci0000:80", "0000:80:01.0", "0000:83:00.0"], netdev=node_ns.netdevs[1])
    agent = agent_factory(
        "b",
        env={
            "DSAGENT_FETCH_LINKS": env["DSAGENT_FETCH_LINKS"],
            "DSAGENT_NODE_NETNS": node_ns.path,  # the node's namespace: this test's stands for /proc/1/ns/net
            "DSAGENT_SYSFS_ROOT": str(tmp_path / "host"),
            "DSAGENT_FETCH_WORKERS": "2",
            "DSAGENT_EGRESS_ALLOW": f"127.0.0.0/8,{node_ns.host_side}/32",
            "PATH": str(bin_dir),
        },
    )
    _cache(agent, store)
    assert set(server.seen) == {node_ns.links[0], node_ns.second}, f"the store saw connections from {dict(server.seen)}"
    assert sum(server.seen.values()) == len(manifest.bundles)
    said = f"fetch links from the topology, nearest first: {node_ns.links[0]} (NODE), {node_ns.second} (NODE)"
    assert said in agent.log.read_text()


def test_a_store_read_names_its_namespace_so_each_keeps_its_own_filesystem() -> None:
    """fsspec keeps a filesystem per repr of the options: the namespace is part of it."""
    http = user_options(bound_options("http://store/b", {}, "10.0.0.5", "/proc/1/ns/net"))
    assert repr(http["get_client"]) == "CheckedClient(unchecked, '10.0.0.5', netns='/proc/1/ns/net')"
    s3 = user_options(bound_options("s3://bucket/b", {}, "10.0.0.5", "/proc/1/ns/net"))
    guard = s3["config_kwargs"]["connector_args"]["socket_factory"]
    assert repr(guard) == "Guard(unchecked, '10.0.0.5', netns='/proc/1/ns/net')"
    assert guard != Guard(None, "10.0.0.5") and guard == Guard(None, "10.0.0.5", "/proc/1/ns/net")
    # the agent's egress rule joins the link without losing its namespace
    policy = EgressPolicy.of()
    joined = policy.bounded("s3", s3)["config_kwargs"]["connector_args"]["socket_factory"]
    assert (joined.policy, joined.local_address, joined.netns) == (policy, "10.0.0.5", "/proc/1/ns/net")
    client = policy.bounded("http", http)["get_client"]
    assert (client.policy, client.local_address, client.netns) == (policy, "10.0.0.5", "/proc/1/ns/net")
