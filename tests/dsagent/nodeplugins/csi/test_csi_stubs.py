"""The committed CSI stubs are exactly what tools/proto/regen_csi.sh generates from csi.proto."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

STUBS = ("csi_pb2.py", "csi_pb2.pyi", "csi_pb2_grpc.py")


@pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools is not installed (pip install grpcio-tools)"
)
def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    subprocess.run(
        ["sh", str(REPO_ROOT / "tools" / "proto" / "regen_csi.sh"), str(tmp_path)],
        check=True,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
    )
    for name in STUBS:
        fresh = tmp_path / "dsagent" / "nodeplugins" / "proto" / "csi" / name
        committed = REPO_ROOT / "dsagent" / "nodeplugins" / "proto" / "csi" / name
        assert fresh.read_text() == committed.read_text(), f"{name} is stale: run tools/proto/regen_csi.sh"


def test_the_stubs_speak_csi_v1() -> None:
    from dsagent.nodeplugins.proto.csi import csi_pb2

    node = csi_pb2.DESCRIPTOR.services_by_name["Node"]
    assert csi_pb2.DESCRIPTOR.package == "csi.v1"
    assert {m.name for m in node.methods} == {
        "NodePublishVolume",
        "NodeUnpublishVolume",
        "NodeGetCapabilities",
        "NodeGetInfo",
    }
    fields = {f.name: f.number for f in csi_pb2.NodePublishVolumeRequest.DESCRIPTOR.fields}
    assert fields == {
        "volume_id": 1,
        "publish_context": 2,
        "staging_target_path": 3,
        "target_path": 4,
        "volume_capability": 5,
        "readonly": 6,
        "secrets": 7,
        "volume_context": 8,
    }
