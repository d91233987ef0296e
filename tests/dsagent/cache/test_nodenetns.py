"""Fetch links whose sockets are made in another network namespace (``DSAGENT_NODE_NETNS``,
docs/design.md#links): the node's, for an agent on the pod network.

A real network namespace stands for the node's: a veth pair joins it to this test's own
namespace (which stands for the pod network), its end holding the two link addresses,
10.77.0.2 and 10.77.0.3, that exist only in there; the store listens on 10.77.0.1, this side's
end. The store sees every bundle request come from a link address: the sockets were made in
the namespace, since nothing here could leave from those addresses. The last test runs the
chart's defaults on a synthetic /sys whose two NICs are that namespace's net devices. Needs
root (``ip netns``); skipped, saying why, without it.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dsagent.cache.fetchlinks import resolve_addresses, transport_in
from dsagent.cache.settings import Settings
from dsagent.format.bundles.bundle import pack
from dsplatform.netns import Namespace, NamespaceError
from gpu_topology import Gpu, Link, Nic, Topology
from gpu_topology.discovery.sysfs import ip_addresses, ip_addresses_in
from gpu_topology.testing import SysfsTree
from tests.charts.test_chart import render
from tests.dsagent.cache.test_fetchlinks import FILES, RecordingStore, _cache, _metrics
from tests.dsagent.conftest import write_tree
from tests.test_default_install_gpu_path import chart_env

HOST_SIDE, LINKS = "10.77.0.1", ("10.77.0.2", "10.77.0.3")
_names = itertools.count()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def node_ns() -> Iterator[str]:
    """The path of a new network namespace joined to this one by a veth pair: this side
    ``HOST_SIDE``, that side both ``LINKS``, and a second pair inside it (``dspb<n>``,
    10.77.1.2) for a NIC of its own."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to make a network namespace")
    n = f"{os.getpid() % 100000}{next(_names)}"
    name, here, there = f"dsptest{n}", f"dsph{n}", f"dspn{n}"
    try:
        _ip("netns", "add", name)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot make a network namespace here: {exc.stderr.decode().strip()}")
    try:
        _ip("link", "add", here, "type", "veth", "peer", "name", there, "netns", name)
        _ip("addr", "add", f"{HOST_SIDE}/24", "dev", here)
        _ip("link", "set", here, "up")
        for address in LINKS:
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", there)
        _ip("-n", name, "link", "set", there, "up")
        _ip("-n", name, "link", "add", f"dspb{n}", "type", "veth", "peer", "name", f"dspc{n}")
        _ip("-n", name, "addr", "add", "10.77.1.2/24", "dev", f"dspb{n}")
        _ip("-n", name, "link", "set", f"dspb{n}", "up")
        _ip("-n", name, "link", "set", f"dspc{n}", "up")
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("route", "add", "10.77.1.0/24", "dev", here)  # the answers to the second NIC's address
        yield f"/var/run/netns/{name}"
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


@pytest.fixture
def store(tmp_path: Path, node_ns: str) -> Iterator[tuple[Any, RecordingStore]]:
    www = tmp_path / "www"
    write_tree(www / "src", FILES)
    manifest = pack(www / "src", www / "store", name="shards", max_files=3)
    server = RecordingStore(www, host=HOST_SIDE)
    yield manifest, server
    server.shutdown()
    server.server_close()


def test_a_store_fetch_leaves_from_link_addresses_only_the_namespace_has(
    store: Any, node_ns: str, agent_factory: Any
) -> None:
    manifest, server = store
    env = {
        "DSAGENT_FETCH_LINKS": ",".join(LINKS),
        "DSAGENT_NODE_NETNS": node_ns,
        "DSAGENT_FETCH_WORKERS": "2",
        "DSAGENT_EGRESS_ALLOW": f"127.0.0.0/8,{HOST_SIDE}/32",
    }
    agent = agent_factory("b", env=env)
    _cache(agent, store)  # ready, every bundle verified
    assert set(server.seen) == set(LINKS), f"the store saw connections from {dict(server.seen)}"
    assert sum(server.seen.values()) == len(manifest.bundles)
    carried = _metrics(agent, "dsplatform_agent_link_bytes_total")
    assert set(carried) == set(LINKS) and sum(carried.values()) == manifest.total_bytes


def test_without_the_namespace_those_addresses_are_no_links(store: Any, node_ns: str, agent_factory: Any) -> None:
    _, server = store
    env = {"DSAGENT_FETCH_LINKS": ",".join(LINKS), "DSAGENT_EGRESS_ALLOW": f"127.0.0.0/8,{HOST_SIDE}/32"}
    agent = agent_factory("b", env=env)
    _cache(agent, store)
    assert set(server.seen) == {HOST_SIDE}, "the default route: this side's own address"
    assert "not on this node" in agent.log.read_text()


def test_a_peer_transport_connects_from_the_namespace(store: Any, node_ns: str) -> None:
    _, server = store
    limits = httpx.Limits(max_connections=4, max_keepalive_connections=2)
    with httpx.Client(transport=transport_in(node_ns, LINKS[1], limits), timeout=10) as client:
        assert client.get(f"{server.url}/store/bundles/nothing").status_code == 404
    assert set(server.seen) == {LINKS[1]}
    with pytest.raises(httpx.ConnectError), httpx.Client(transport=httpx.HTTPTransport(local_address=LINKS[1])) as here:
        here.get(f"{server.url}/store/bundles/nothing")


def test_discovery_reads_the_nics_addresses_in_the_namespace(node_ns: str) -> None:
    """The topology (from the node's /sys) names the NICs' net devices; their addresses are
    read in the node's namespace, and auto takes them there."""
    n = node_ns.removeprefix("/var/run/netns/dsptest")
    found = ip_addresses_in(node_ns)
    ipv4 = {dev: [a for a in found[dev] if ":" not in a] for dev in (f"dspn{n}", f"dspb{n}")}  # and link-local v6
    assert ipv4 == {f"dspn{n}": [f"{a}/24" for a in LINKS], f"dspb{n}": ["10.77.1.2/24"]}
    assert f"dspn{n}" not in ip_addresses(), "not in this namespace"
    options = Settings(node_netns=node_ns).discovery_options
    assert options is not None and options["sysfs"]["addresses"]() == found
    topology = Topology(
        gpus=(Gpu(0),),
        nics=tuple(
            Nic(name, netdev=dev, link_layer="Ethernet", addresses=tuple(found[dev]))
            for name, dev in (("mlx5_0", f"dspn{n}"), ("mlx5_1", f"dspb{n}"))
        ),
        links={"GPU0": {"mlx5_0": Link.parse("PIX"), "mlx5_1": Link.parse("NODE")}},
    )
    there = Settings(fetch_links=("auto",), node_netns=node_ns)
    assert resolve_addresses(there, topology) == (LINKS[0], "10.77.1.2")
    assert resolve_addresses(Settings(fetch_links=("auto",)), topology) == (), "no socket here leaves from them"


def test_a_namespace_that_cannot_be_entered_is_the_default_route_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    not_one = tmp_path / "plain-file"
    not_one.write_text("")
    with pytest.raises(NamespaceError, match="cannot enter the network namespace"):
        Namespace(str(not_one))
    with pytest.raises(NamespaceError, match="cannot open"):
        Namespace(str(tmp_path / "missing"))
    assert resolve_addresses(Settings(fetch_links=LINKS, node_netns=str(tmp_path / "missing"))) == ()
    assert ip_addresses_in(str(tmp_path / "missing")) == {}, "discovery: the addresses stay unknown"
    assert [r.getMessage() for r in caplog.records if "default route" in r.getMessage()] == [
        f"fetch links: [Errno 2] cannot open the network namespace {tmp_path / 'missing'}: No such file or "
        "directory; fetching over the default route"
    ]


def test_the_setting_takes_an_absolute_path_or_nothing() -> None:
    assert Settings(node_netns="").node_netns is None
    assert Settings(node_netns=" /proc/1/ns/net ").node_netns == "/proc/1/ns/net"
    with pytest.raises(ValueError, match="an absolute path"):
        Settings(node_netns="proc/1/ns/net")


def test_a_default_install_splits_a_fetch_over_the_near_nics(
    store: Any, node_ns: str, agent_factory: Any, tmp_path: Path
) -> None:
    """The chart's defaults, on a node whose two RDMA NICs share a PCIe switch with its GPU
    (a synthetic /sys; their net devices are the namespace's): the agent discovers the NICs,
    reads their addresses in the node's namespace and fetches over both, from the pod network."""
    manifest, server = store
    env = chart_env(render({}), "DaemonSet", "-agent")
    assert env["DSAGENT_FETCH_LINKS"] == "auto" and env["DSAGENT_NODE_NETNS"] == "/proc/1/ns/net"
    n = node_ns.removeprefix("/var/run/netns/dsptest")
    tree = SysfsTree(tmp_path / "host")
    switch = ["pci0000:00", "0000:00:01.0", "0000:01:00.0"]
    tree.gpu([*switch, "0000:02:00.0"])
    tree.rdma("mlx5_0", [*switch, "0000:03:00.0"], netdev=f"dspn{n}")
    tree.rdma("mlx5_1", [*switch, "0000:04:00.0"], netdev=f"dspb{n}")
    only_ip = tmp_path / "bin"
    only_ip.mkdir()
    (only_ip / "ip").symlink_to(str(shutil.which("ip")))
    agent = agent_factory(
        "b",
        env={
            "DSAGENT_FETCH_LINKS": env["DSAGENT_FETCH_LINKS"],
            "DSAGENT_NODE_NETNS": node_ns,  # the node's namespace: this test's stands for /proc/1/ns/net
            "DSAGENT_SYSFS_ROOT": str(tmp_path / "host"),
            "DSAGENT_FETCH_WORKERS": "2",
            "DSAGENT_EGRESS_ALLOW": f"127.0.0.0/8,{HOST_SIDE}/32",
            "PATH": str(only_ip),  # the NICs' addresses: ip; no nvidia-smi, whatever the machine has
        },
    )
    _cache(agent, store)
    assert set(server.seen) == {LINKS[0], "10.77.1.2"}, f"the store saw connections from {dict(server.seen)}"
    assert sum(server.seen.values()) == len(manifest.bundles)
    assert "fetch links from the topology, nearest first: 10.77.0.2 (PIX), 10.77.1.2 (PIX)" in agent.log.read_text()
