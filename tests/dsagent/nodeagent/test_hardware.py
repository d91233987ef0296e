"""The RoCE-class path under ``auto``: on where the node's RoCE NICs sit in two or more NUMA
groups, decided from the recorded topologies of real machines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dsagent.nodeagent.hardware import NVIDIA_PLUGIN_LABEL, PLUGIN_LABEL, node_patch, roce_path, status_patch
from gpu_topology.discovery.nvidia_smi import parse_topo_matrix, with_inferred_nic_numa

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "topology"


def _decide(name: str) -> object:
    return roce_path(with_inferred_nic_numa(parse_topo_matrix((FIXTURES / name).read_text())))


@pytest.mark.parametrize(
    ("fixture", "on", "reason"),
    [
        ("dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt", True, "RoceNicsInNumaGroups"),
        ("mystous-8xH100-11nic-ansi-escapes-captured-nvidia-smi-topo-m.txt", True, "RoceNicsInNumaGroups"),
        ("oneflow-hugectr-8xV100-2nic-mangled-whitespace-nvidia-smi-topo-m.txt", True, "RoceNicsInNumaGroups"),
        ("ml-engineering-8xH100-no-nic-spaces-nvidia-smi-topo-m.txt", False, "NoRoceNics"),
        ("lent-h100-vm-1gpu-nonic-driver580-gpu-numa-id-nvidia-smi-topo-m.txt", False, "NoRoceNics"),
    ],
)
def test_the_roce_class_path_runs_where_the_nics_sit_in_several_numa_groups(
    fixture: str, on: bool, reason: str
) -> None:
    decision = _decide(fixture)
    assert (decision.on, decision.reason) == (on, reason)  # type: ignore[attr-defined]
    if on:
        assert len(decision.classes) >= 2 and "NUMA groups" in decision.message  # type: ignore[attr-defined]


def test_the_node_says_which_plugin_serves_its_gpus_and_takes_back_only_its_own_label() -> None:
    on = _decide("dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt")
    off = _decide("ml-engineering-8xH100-no-nic-spaces-nvidia-smi-topo-m.txt")
    assert node_patch(on, {}) == {"metadata": {"labels": {PLUGIN_LABEL: "true", NVIDIA_PLUGIN_LABEL: "false"}}}  # type: ignore[arg-type]
    assert node_patch(on, {PLUGIN_LABEL: "true", NVIDIA_PLUGIN_LABEL: "false"}) == {}  # type: ignore[arg-type]
    assert node_patch(off, {}) == {"metadata": {"labels": {PLUGIN_LABEL: "false"}}}  # type: ignore[arg-type]
    # the agent ran the plugin before and set NVIDIA's label: it gives it back
    before = {PLUGIN_LABEL: "true", NVIDIA_PLUGIN_LABEL: "false"}
    assert node_patch(off, before) == {"metadata": {"labels": {PLUGIN_LABEL: "false", NVIDIA_PLUGIN_LABEL: None}}}  # type: ignore[arg-type]
    # an operator's own "false" on a node the agent never served stays
    assert node_patch(off, {NVIDIA_PLUGIN_LABEL: "false"}) == {"metadata": {"labels": {PLUGIN_LABEL: "false"}}}  # type: ignore[arg-type]
    [condition] = status_patch(on, "2026-11-26T00:00:00Z")["status"]["conditions"]  # type: ignore[arg-type]
    assert condition["type"] == "DsplatformRoceClasses" and condition["status"] == "True"
    assert condition["reason"] == "RoceNicsInNumaGroups"


def test_the_agent_writes_the_decision_on_its_node(
    apiserver: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dsagent.cache.settings import Settings
    from dsagent.nodeagent.nodeparts import publish_hardware_decision
    from tools.support.fake_apiserver import make_node

    monkeypatch.setenv("KUBECONFIG", str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    node = make_node("gpu-1")
    node["status"] = {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}
    apiserver.create(node)
    settings = Settings(root=tmp_path / "cache", kubernetes=True, node_name="gpu-1")
    on = _decide("dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt")
    publish_hardware_decision(settings, on)
    written = apiserver.get("nodes", "gpu-1")
    assert written is not None
    labels = written["metadata"]["labels"]
    assert labels[PLUGIN_LABEL] == "true" and labels[NVIDIA_PLUGIN_LABEL] == "false"
    conditions = {c["type"]: c for c in written["status"]["conditions"]}
    assert conditions["Ready"]["reason"] == "KubeletReady"  # the kubelet's own stay
    assert conditions["DsplatformRoceClasses"]["status"] == "True"
    events = apiserver.list("events")
    assert [e["reason"] for e in events] == ["DevicePluginOn"] and "NUMA groups" in events[0]["note"]
    # the hardware changed (a NIC gone): the agent says so and gives NVIDIA's plugin back
    off = _decide("ml-engineering-8xH100-no-nic-spaces-nvidia-smi-topo-m.txt")
    publish_hardware_decision(settings, off)
    written = apiserver.get("nodes", "gpu-1")
    assert written is not None
    assert written["metadata"]["labels"][PLUGIN_LABEL] == "false"
    assert NVIDIA_PLUGIN_LABEL not in written["metadata"]["labels"]
    conditions = {c["type"]: c for c in written["status"]["conditions"]}
    assert conditions["DsplatformRoceClasses"]["status"] == "False" and len(conditions) == 2


def test_release_nodes_hands_the_served_nodes_back_to_nvidias_plugin(apiserver: Any, tmp_path: Path) -> None:
    """``dsagent release-nodes`` (the chart's pre-delete hook) against the fake API server."""
    import os
    import subprocess
    import sys

    from tools.support.fake_apiserver import make_node

    served = make_node("served")
    served["metadata"]["labels"] = {PLUGIN_LABEL: "true", NVIDIA_PLUGIN_LABEL: "false", "zone": "a"}
    served["status"] = {
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady"},
            {"type": "DsplatformRoceClasses", "status": "True", "reason": "RoceNicsInNumaGroups"},
        ]
    }
    nvidias = make_node("nvidias")
    nvidias["metadata"]["labels"] = {PLUGIN_LABEL: "false"}
    operators = make_node("operators")  # NVIDIA's plugin kept off by an operator, not by us
    operators["metadata"]["labels"] = {NVIDIA_PLUGIN_LABEL: "false"}
    for node in (served, nvidias, operators):
        apiserver.create(node)
    env = {**os.environ, "KUBECONFIG": str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    done = subprocess.run(
        [sys.executable, "-m", "dsagent", "release-nodes"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "released 2 node(s) to NVIDIA's device plugin: nvidias, served"
    labels = {n: apiserver.get("nodes", n)["metadata"].get("labels") or {} for n in ("served", "nvidias", "operators")}
    assert labels["served"] == {"zone": "a"}  # ours gone, NVIDIA's plugin may come back
    assert labels["nvidias"] == {}
    assert labels["operators"] == {NVIDIA_PLUGIN_LABEL: "false"}  # not ours to change
    conditions = {c["type"]: c for c in apiserver.get("nodes", "served")["status"]["conditions"]}
    assert conditions["Ready"]["reason"] == "KubeletReady"
    assert (conditions["DsplatformRoceClasses"]["status"], conditions["DsplatformRoceClasses"]["reason"]) == (
        "False",
        "Uninstalled",
    )
