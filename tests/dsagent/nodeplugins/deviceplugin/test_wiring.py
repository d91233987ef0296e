"""``dsagent serve`` wiring of the device plugin: settings, discovery, registration."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from dsagent.cache.settings import Settings
from dsagent.errors import InvalidInput, SettingsError
from dsagent.nodeagent.nodeparts import start_device_plugin
from gpu_topology import Topology
from tests.fake_kubelet import FakeKubelet
from tests.sysfs_vf import build_dgx_a100_vfs


def test_device_plugin_settings() -> None:
    settings = Settings.from_env(
        {
            "DSAGENT_DEVICE_PLUGIN": "on",
            "DSAGENT_RESOURCE_PREFIX": "example.com",
            "DSAGENT_DEVICE_PLUGIN_DIR": "/k/dp",
            "DSAGENT_POD_RESOURCES_SOCKET": "/k/pr.sock",
        }
    )
    assert (settings.device_plugin, settings.resource_prefix) == ("on", "example.com")
    assert (settings.device_plugin_dir, settings.pod_resources_socket) == (Path("/k/dp"), Path("/k/pr.sock"))
    defaults = Settings()
    assert (defaults.device_plugin, defaults.resource_prefix) == ("off", "dsagent.io")
    # auto: where the node's hardware carries it (dsagent.nodeagent.hardware); booleans still read
    assert Settings.from_env({"DSAGENT_DEVICE_PLUGIN": "auto"}).device_plugin == "auto"
    assert Settings.from_env({"DSAGENT_DEVICE_PLUGIN": "true"}).device_plugin == "on"
    with pytest.raises(SettingsError, match="DSAGENT_DEVICE_PLUGIN"):
        Settings.from_env({"DSAGENT_DEVICE_PLUGIN": "sometimes"})
    assert defaults.device_plugin_dir == Path("/var/lib/kubelet/device-plugins")
    for bad in ("Example.com", "dsagent.io/x", "-a.io", ""):
        with pytest.raises(SettingsError, match="DSAGENT_RESOURCE_PREFIX"):
            Settings.from_env({"DSAGENT_RESOURCE_PREFIX": bad})
    with pytest.raises(SettingsError, match="DSAGENT_DEVICE_PLUGIN="):
        Settings.from_env({"DSAGENT_DEVICE_PLUGIN": "perhaps"})


def test_serve_starts_and_registers_the_plugin(short_dir: Path, tmp_path: Path, dgx_a100: Topology) -> None:
    build_dgx_a100_vfs(tmp_path / "sys-root")
    (short_dir / "dp").mkdir()
    settings = Settings(
        root=tmp_path / "root",
        device_plugin=True,
        resource_prefix="example.com",
        device_plugin_dir=short_dir / "dp",
        pod_resources_socket=short_dir / "none.sock",
        host_root=Path("/nvme/dsagent"),
    )

    async def scenario() -> None:
        kubelet = FakeKubelet(short_dir / "dp")
        await kubelet.start()
        plugin = await start_device_plugin(settings, topology=dgx_a100, sysfs_root=tmp_path / "sys-root")
        try:
            assert [r.resource_name for r in kubelet.registrations][-1] == "example.com/gpu-all"
            assert len(kubelet.registrations) == 4 + 6 + 1  # classes, runs of classes, gpu-all
            answer = await kubelet.allocate("example.com/gpu-roce3", [dgx_a100.gpus[4].uuid or ""])
            assert answer.envs["NCCL_IB_HCA"] == "=mlx5_18"  # one VF, of mlx5_4 (mlx5_4 and mlx5_5 are both near)
            # the kubelet gets the host's path of the file the agent wrote under its own root
            host_path = Path(answer.mounts[0].host_path)
            assert host_path.parent == Path("/nvme/dsagent/kubelet/nccl")
            assert (tmp_path / "root" / "kubelet" / "nccl" / host_path.name).read_text().startswith("# written")
        finally:
            await plugin.stop()
            await kubelet.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_serve_refuses_gpus_without_uuids(short_dir: Path, fixtures_dir: Path) -> None:
    from gpu_topology.dumps import load_dump

    topology = load_dump(fixtures_dir / "topology" / "dgx1-v100-4ib-nvidia-smi-topo-m.txt")
    settings = Settings(root=short_dir / "root", device_plugin=True, device_plugin_dir=short_dir)
    with pytest.raises(InvalidInput, match="no UUID"):
        asyncio.run(start_device_plugin(settings, topology=topology, sysfs_root=short_dir))


@pytest.mark.parametrize(("mode", "classes"), [("numa", 4), ("none", 1)])
def test_the_plugin_cuts_classes_by_the_mode_the_agent_publishes(
    short_dir: Path, tmp_path: Path, dgx_a100: Topology, mode: str, classes: int
) -> None:
    """One variable, DSAGENT_ROCE_CLASSES, for the published topology and the plugin's resources."""
    from gpu_topology import to_json

    build_dgx_a100_vfs(tmp_path / "sys-root")
    (short_dir / "dp").mkdir()
    settings = Settings.from_env(
        {
            "DSAGENT_ROOT": str(tmp_path / "root"),
            "DSAGENT_ROCE_CLASSES": mode,
            "DSAGENT_DEVICE_PLUGIN_DIR": str(short_dir / "dp"),
            "DSAGENT_POD_RESOURCES_SOCKET": str(short_dir / "none.sock"),
        }
    )
    published = [(c["name"], c["gpus"]) for c in json.loads(to_json(dgx_a100, mode=settings.roce_classes))["classes"]]

    async def scenario() -> None:
        kubelet = FakeKubelet(short_dir / "dp")
        await kubelet.start()
        plugin = await start_device_plugin(settings, topology=dgx_a100, sysfs_root=tmp_path / "sys-root")
        try:
            served = [
                (r.split("/", 1)[1], [d.index for d in plugin.node.resource_devices(r)])
                for r in plugin.node.resources
                if not r.endswith("/gpu-all") and r not in plugin.node.sets
            ]
            assert served == published and len(served) == classes
        finally:
            await plugin.stop()
            await kubelet.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_class_rule_that_cannot_be_applied_stops_the_plugin_with_a_clear_error(
    short_dir: Path, tmp_path: Path, dgx_a100: Topology
) -> None:
    """subnet mode on NICs without addresses: the agent publishes no classes, the plugin none either."""
    settings = Settings(root=tmp_path / "root", roce_classes="subnet", device_plugin_dir=short_dir)
    with pytest.raises(SettingsError, match="DSAGENT_ROCE_CLASSES=subnet"):
        asyncio.run(start_device_plugin(settings, topology=dgx_a100, sysfs_root=tmp_path))


def test_serve_creates_the_vfs_and_checks_the_address_file(short_dir: Path, tmp_path: Path, dgx_a100: Topology) -> None:
    """DSAGENT_VF_SETUP: each NIC gets as many VFs as it has affine GPUs; DSAGENT_VF_ADDRESSES names only VFs."""
    build_dgx_a100_vfs(tmp_path / "sys-root")
    numvfs = tmp_path / "sys-root/sys/class/infiniband/mlx5_4/device/sriov_numvfs"
    numvfs.write_text("0\n")  # VFs not enabled on mlx5_4 yet
    (short_dir / "dp").mkdir()
    addresses = tmp_path / "addresses.json"
    addresses.write_text(json.dumps({"eth0": "10.0.0.1/24"}))
    settings = Settings.from_env(
        {
            "DSAGENT_ROOT": str(tmp_path / "root"),
            "DSAGENT_DEVICE_PLUGIN": "on",
            "DSAGENT_DEVICE_PLUGIN_DIR": str(short_dir / "dp"),
            "DSAGENT_POD_RESOURCES_SOCKET": str(short_dir / "none.sock"),
            "DSAGENT_VF_SETUP": "on",
        }
    )
    assert Settings().vf_setup == "off" and Settings().vf_addresses is None

    async def scenario() -> None:
        kubelet = FakeKubelet(short_dir / "dp")
        await kubelet.start()
        plugin = await start_device_plugin(settings, topology=dgx_a100, sysfs_root=tmp_path / "sys-root")
        try:
            assert numvfs.read_text().strip() == "2"  # GPUs 4 and 5 are affine to mlx5_4
            with pytest.raises(InvalidInput, match="eth0 are not VF netdevs"):
                refused = settings.model_copy(update={"vf_setup": "off", "vf_addresses": addresses})
                await start_device_plugin(refused, topology=dgx_a100, sysfs_root=tmp_path / "sys-root")
        finally:
            await plugin.stop()
            await kubelet.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_vfs_another_device_plugin_advertises_are_never_handed_out(
    short_dir: Path, tmp_path: Path, dgx_a100: Topology
) -> None:
    """The SR-IOV network operator's device plugin advertises mlx5_4's VFs (by PCI address, as
    pod-resources' allocatable devices say): GPU 4's container gets a VF of mlx5_5, the other
    NIC near it, not one another container may be given too."""
    from tests.fake_kubelet import FakePodResources
    from tests.sysfs_vf import vf_bus

    build_dgx_a100_vfs(tmp_path / "sys-root")
    (short_dir / "dp").mkdir()
    settings = Settings(
        root=tmp_path / "root",
        device_plugin=True,
        device_plugin_dir=short_dir / "dp",
        pod_resources_socket=short_dir / "pr.sock",
        device_plugin_gpu_resource="nvidia.com/gpu",
    )

    async def scenario() -> None:
        kubelet, pods = FakeKubelet(short_dir / "dp"), FakePodResources(short_dir / "pr.sock")
        pods.allocatable = {
            "openshift.io/rail3": [vf_bus(4, 0), vf_bus(4, 1)],  # the SR-IOV operator's VFs
            "nvidia.com/gpu": [g.uuid or "" for g in dgx_a100.gpus],  # ours (or NVIDIA's): GPUs, not VFs
            "dsagent.io/gpu-roce3": [vf_bus(5, 0)],  # a resource of ours never takes a VF away
        }
        await kubelet.start()
        await pods.start()
        plugin = await start_device_plugin(settings, topology=dgx_a100, sysfs_root=tmp_path / "sys-root")
        try:
            first = await kubelet.allocate("dsagent.io/gpu-roce3", [dgx_a100.gpus[4].uuid or ""])
            second = await kubelet.allocate("dsagent.io/gpu-roce3", [dgx_a100.gpus[5].uuid or ""])
            # both from mlx5_5 (VFs mlx5_20, mlx5_21): mlx5_4's (mlx5_18, mlx5_19) are the operator's
            assert {first.envs["NCCL_IB_HCA"], second.envs["NCCL_IB_HCA"]} == {"=mlx5_20", "=mlx5_21"}
            # the operator comes to mlx5_6's VFs later: the next Allocate reads it, with no
            # reconcile between, and a container near only those gets its GPUs alone (not
            # refused, not given them)
            pods.allocatable["openshift.io/rail4"] = [vf_bus(6, 0), vf_bus(6, 1), vf_bus(7, 0), vf_bus(7, 1)]
            third = await kubelet.allocate("dsagent.io/gpu-roce4", [dgx_a100.gpus[6].uuid or ""])
            assert "NCCL_IB_HCA" not in third.envs and not [d for d in third.devices if "uverbs" in d.host_path]
            assert third.envs["NVIDIA_VISIBLE_DEVICES"] == dgx_a100.gpus[6].uuid
        finally:
            await plugin.stop()
            await pods.stop()
            await kubelet.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))
