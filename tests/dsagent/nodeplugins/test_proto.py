"""The committed kubelet stubs are what tools/proto/regen.sh generates, and keep upstream's wire numbers."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsagent.nodeplugins.proto import deviceplugin_v1beta1_pb2 as dp
from dsagent.nodeplugins.proto import podresources_v1_pb2 as pr
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

PROTO_DIR = REPO_ROOT / "dsagent/nodeplugins/proto"


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools is not installed (pip install '.[test]')")
    import grpc_tools
    from grpc_tools import protoc  # noqa: F401  (only to read its version below)

    generated = (PROTO_DIR / "deviceplugin_v1beta1_pb2_grpc.py").read_text()
    version = getattr(grpc_tools, "__version__", None) or _tools_version()
    if f"GRPC_GENERATED_VERSION = '{version}'" not in generated:
        pytest.skip(f"grpcio-tools {version} differs from the version that generated the committed stubs")
    env = dict(os.environ, PYTHON=sys.executable)
    subprocess.run([str(REPO_ROOT / "tools/proto/regen.sh"), str(tmp_path)], check=True, env=env, timeout=120)
    fresh = sorted((tmp_path / "dsagent/nodeplugins/proto").iterdir())
    assert [p.name for p in fresh] == sorted(
        p.name for p in PROTO_DIR.iterdir() if p.suffix in (".py", ".pyi") and p.name != "__init__.py"
    )
    for path in fresh:
        assert path.read_text() == (PROTO_DIR / path.name).read_text(), (
            f"{path.name} is stale: run tools/proto/regen.sh"
        )


def _tools_version() -> str:
    from importlib.metadata import version

    return version("grpcio-tools")


def test_wire_names_and_numbers_are_upstreams() -> None:
    assert dp.DESCRIPTOR.package == "v1beta1" and pr.DESCRIPTOR.package == "v1"
    assert [m.full_name for m in dp.DESCRIPTOR.services_by_name["DevicePlugin"].methods] == [
        "v1beta1.DevicePlugin.GetDevicePluginOptions",
        "v1beta1.DevicePlugin.ListAndWatch",
        "v1beta1.DevicePlugin.GetPreferredAllocation",
        "v1beta1.DevicePlugin.Allocate",
        "v1beta1.DevicePlugin.PreStartContainer",
    ]
    numbers = {f.name: f.number for f in dp.ContainerAllocateResponse.DESCRIPTOR.fields}
    assert numbers == {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}
    numbers = {f.name: f.number for f in dp.ContainerPreferredAllocationRequest.DESCRIPTOR.fields}
    assert numbers == {"available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3}
    assert {f.name: f.number for f in dp.RegisterRequest.DESCRIPTOR.fields} == {
        "version": 1,
        "endpoint": 2,
        "resource_name": 3,
        "options": 4,
    }
    assert {f.name: f.number for f in dp.Device.DESCRIPTOR.fields} == {"ID": 1, "health": 2, "topology": 3}
    assert [m.name for m in pr.DESCRIPTOR.services_by_name["PodResourcesLister"].methods] == [
        "List",
        "GetAllocatableResources",
        "Get",
    ]
    assert {f.name: f.number for f in pr.ContainerResources.DESCRIPTOR.fields} == {
        "name": 1,
        "devices": 2,
        "cpu_ids": 3,
        "memory": 4,
        "dynamic_resources": 5,
    }
    assert {f.name: f.number for f in pr.DynamicResource.DESCRIPTOR.fields} == {
        "claim_name": 2,
        "claim_namespace": 3,
        "claim_resources": 4,
    }
    # a message encoded by hand with upstream's numbers decodes as expected
    wire = bytes([0x0A, 0x04]) + b"GPU0" + bytes([0x12, 0x07]) + b"Healthy"
    device = dp.Device.FromString(wire)
    assert (device.ID, device.health) == ("GPU0", "Healthy")
