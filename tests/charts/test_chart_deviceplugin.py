"""The chart's device plugin values: auto by default (the agent decides per node from its
hardware, in NVIDIA's plugin's place), and what the plugin needs where it may run."""

from __future__ import annotations

from typing import Any

import pytest

from dsagent.cache import settings as agent_settings
from tests.charts.test_chart import CHART, DEVICE_PLUGIN, agent_pod, find, helm, render

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    # CSI (on by default) makes the agent privileged; these tests look at the device plugin alone
    no_csi = {"csi": {"enabled": False}}
    off = {**no_csi, "agent": {"devicePlugin": {"enabled": False}}}
    auto = {**no_csi, "agent": {"devicePlugin": {"enabled": "auto"}}, "gpuClasses": {"enabled": False}}
    return {
        "default": render(no_csi),
        "off": render(off),
        "auto": render(auto),
        "device-plugin": render({**DEVICE_PLUGIN, **no_csi}),
    }


def test_off_no_kubelet_mounts_and_non_root(rendered: dict[str, list[dict[str, Any]]]) -> None:
    pod = agent_pod(rendered["off"])
    [container] = pod["containers"]
    assert not any(e["name"].startswith(("DSAGENT_DEVICE_PLUGIN", "DSAGENT_POD_RESOURCES")) for e in container["env"])
    assert not any("/var/lib/kubelet" in m["mountPath"] for m in container["volumeMounts"])
    assert container["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("values", ["default", "auto"])
def test_auto_the_agent_decides_per_node_as_root_without_capabilities(
    rendered: dict[str, list[dict[str, Any]]], values: str
) -> None:
    pod = agent_pod(rendered[values])
    [container] = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DSAGENT_DEVICE_PLUGIN"] == "auto"  # on where the RoCE NICs sit in 2+ NUMA groups
    # in NVIDIA's plugin's place there: nvidia.com/gpu too, once that plugin has left
    assert env["DSAGENT_DEVICE_PLUGIN_GPU_RESOURCE"] == "nvidia.com/gpu"
    assert env["DSAGENT_DEVICE_PLUGIN_HANDOVER"] == "120s"
    settings = agent_settings.Settings.from_env(
        {k: v for k, v in env.items() if v is not None and k != "DSAGENT_ADMIN_TOKEN_FILE"}
    )
    assert (settings.device_plugin, settings.device_plugin_gpu_resource) == ("auto", "nvidia.com/gpu")
    assert settings.device_plugin_handover == 120.0
    assert env["DSAGENT_DEVICE_PLUGIN_DEVICES"] == "gpus" and settings.device_plugin_devices == "gpus"
    paired = render({"csi": {"enabled": False}, "agent": {"devicePlugin": {"enabled": "auto", "devices": "pairs"}}})
    paired_env = {e["name"]: e.get("value") for e in agent_pod(paired)["containers"][0]["env"]}
    assert (
        agent_settings.Settings.from_env(
            {"DSAGENT_DEVICE_PLUGIN_DEVICES": paired_env["DSAGENT_DEVICE_PLUGIN_DEVICES"]}
        ).device_plugin_devices
        == "pairs"
    )
    mounts = {m["name"] for m in container["volumeMounts"]}
    assert {"device-plugins", "pod-resources"} <= mounts
    security = container["securityContext"]
    assert security["runAsUser"] == 0 and security["capabilities"]["drop"] == ["ALL"]
    assert security["allowPrivilegeEscalation"] is False
    assert "add" not in security["capabilities"]
    # and may write its Node's DsplatformRoceClasses condition (the admission policy: that one only)
    [role] = [
        d for d in rendered[values] if d.get("kind") == "ClusterRole" and d["metadata"]["name"].endswith("-agent")
    ]
    assert {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]} in role["rules"]


def test_on_it_mounts_the_kubelet_dirs_and_host_sysfs_and_configures_the_agent(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    pod = agent_pod(rendered["device-plugin"])
    [container] = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DSAGENT_DEVICE_PLUGIN"] == "true"
    assert env["DSAGENT_RESOURCE_PREFIX"] == "example.com"
    assert env["DSAGENT_DEVICE_PLUGIN_NODE_LABEL"] == "example.com/gpu-plugin"
    assert env["DSAGENT_HOST_ROOT"] == "/nvme/dsagent"  # nccl.conf host paths for the kubelet
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    for name, path in (
        ("device-plugins", "/var/lib/kubelet/device-plugins"),
        ("pod-resources", "/var/lib/kubelet/pod-resources"),
    ):
        assert volumes[name] == path and mounts[name]["mountPath"] == path  # directories: kubelet restarts
    assert volumes["host-sys"] == "/sys" and not mounts["host-sys"]["readOnly"]  # VF creation (auto)
    assert mounts["host-sys"]["mountPath"] == env["DSAGENT_SYSFS_ROOT"] + "/sys"
    assert container["securityContext"]["runAsUser"] == 0  # the kubelet's sockets are root's
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert "chown 0:0" in pod["initContainers"][0]["args"][0]
    agent_settings.Settings.from_env(
        {k: v for k, v in env.items() if v is not None and k != "DSAGENT_ADMIN_TOKEN_FILE"}
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"agent": {"devicePlugin": {"nodeLabel": "bad label"}}},
        {"agent": {"devicePlugin": {"extra": 1}}},
        # the prefix is gpuClasses' alone now: a second one could disagree with the webhook's
        {"agent": {"devicePlugin": {"resourcePrefix": "example.com"}}},
        {"gpuClasses": {"resourcePrefix": "Example.com"}},
        {"gpuClasses": {"resourcePrefix": "a/b"}},
        {"gpuClasses": {"resourcePrefix": "a..b"}},
    ],
)
def test_bad_device_plugin_values_are_refused(bad: dict[str, Any]) -> None:
    values = {
        "agent": {
            "devicePlugin": {**DEVICE_PLUGIN["agent"]["devicePlugin"], **bad.get("agent", {}).get("devicePlugin", {})}
        },
        "gpuClasses": {**DEVICE_PLUGIN["gpuClasses"], **bad.get("gpuClasses", {})},
    }
    with pytest.raises(helm.HelmValuesError):
        helm.Chart.load(str(CHART)).validate_schema(values)
    assert render(DEVICE_PLUGIN)


def _env(docs: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    return {e["name"]: e.get("value") for c in doc["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])}


def test_the_webhook_the_extender_and_the_device_plugin_name_the_same_class_resources() -> None:
    """One prefix and one class rule: what the webhook writes is what the node advertises."""
    docs = render({**DEVICE_PLUGIN, "gpuClasses": {"enabled": True, "resourcePrefix": "example.com"}})
    agent = {e["name"]: e.get("value") for e in agent_pod(docs)["containers"][0]["env"]}
    webhook = _env(docs, "Deployment", "-webhook")
    extender = _env(docs, "Deployment", "-extender")
    assert agent["DSAGENT_RESOURCE_PREFIX"] == "example.com"
    assert webhook["DSAGENT_WEBHOOK_CLASS_PREFIX"] == "example.com"
    assert extender["DSEXT_ROCE_RESOURCE_PREFIX"] == "example.com/gpu-roce"
    # the agent publishes and the plugin cuts classes from the same variable
    assert agent["DSAGENT_ROCE_CLASSES"] == "numa"
    assert list(agent).count("DSAGENT_ROCE_CLASSES") == 1


def _vf_values(**device_plugin: Any) -> dict[str, Any]:
    plugin = {**DEVICE_PLUGIN["agent"]["devicePlugin"], **device_plugin}
    return {
        **DEVICE_PLUGIN,
        "agent": {**DEVICE_PLUGIN["agent"], "devicePlugin": plugin},
        "csi": {"enabled": False},  # CSI makes the agent privileged: look at what the VF set-up adds alone
        "topologyDiscovery": {"hostNetwork": True},
    }


def test_vf_setup_gets_exactly_the_rights_it_needs_and_nothing_when_off() -> None:
    """sriov_numvfs writes need the host's /sys writable (the agent is root, the files' owner);
    netlink address set-up needs NET_ADMIN in the host's network namespace and the file."""
    from kubernetes_validate import utils as kv

    def parts(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], list[str], dict[str, Any]]:
        pod = agent_pod(docs)
        [container] = [c for c in pod["containers"] if c["name"] == "agent"]
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        env = {e["name"]: e.get("value") for e in container["env"]}
        return pod, mounts, container["securityContext"].get("capabilities", {}).get("add", []), env

    pod, mounts, added, env = parts(render(_vf_values(vfSetup=False)))
    assert mounts["host-sys"]["readOnly"] is True and "vf-addresses" not in mounts and added == []
    assert not {"DSAGENT_VF_SETUP", "DSAGENT_VF_ADDRESSES"} & set(env)

    # the default, auto: VFs only where SR-IOV is on and none exist yet; the same rights as true
    docs = render(_vf_values())
    pod, mounts, added, env = parts(docs)
    assert mounts["host-sys"]["readOnly"] is False and added == [] and env["DSAGENT_VF_SETUP"] == "auto"
    assert agent_settings.Settings.from_env({"DSAGENT_VF_SETUP": env["DSAGENT_VF_SETUP"]}).vf_setup == "auto"

    docs = render(_vf_values(vfSetup=True))
    pod, mounts, added, env = parts(docs)
    assert mounts["host-sys"]["readOnly"] is False and added == [], "sriov_numvfs: a writable /sys, no capability"
    assert env["DSAGENT_VF_SETUP"] == "true" and "DSAGENT_VF_ADDRESSES" not in env
    kv.validate(find(docs, "DaemonSet", "-agent"), "1.29.0", strict=True)

    docs = render(_vf_values(vfSetup=False, vfAddresses="/etc/dsagent/vf-addresses.json"))
    pod, mounts, added, env = parts(docs)
    assert added == ["NET_ADMIN"] and pod["hostNetwork"] is True and mounts["host-sys"]["readOnly"] is True
    assert mounts["vf-addresses"] == {
        "name": "vf-addresses",
        "mountPath": "/etc/dsagent-vf/addresses.json",
        "readOnly": True,
    }
    volume = next(v for v in pod["volumes"] if v["name"] == "vf-addresses")
    assert volume["hostPath"] == {"path": "/etc/dsagent/vf-addresses.json", "type": "File"}
    assert env["DSAGENT_VF_ADDRESSES"] == mounts["vf-addresses"]["mountPath"]
    settings = agent_settings.Settings.from_env({k: v for k, v in env.items() if k.startswith("DSAGENT_VF")})
    assert settings.vf_addresses is not None and settings.vf_setup == "off"
    kv.validate(find(docs, "DaemonSet", "-agent"), "1.29.0", strict=True)

    with pytest.raises(Exception, match="hostNetwork or csi.enabled"):
        render({**_vf_values(vfAddresses="/etc/vf.json"), "topologyDiscovery": {"hostNetwork": False}})
    # on the pod network, a privileged agent (the CSI driver's) sets them in the node's namespace
    pod_network = {**_vf_values(vfAddresses="/etc/vf.json"), "csi": {"enabled": True}}
    pod, mounts, added, env = parts(render({**pod_network, "topologyDiscovery": {"hostNetwork": False}}))
    assert "hostNetwork" not in pod and env["DSAGENT_NODE_NETNS"] == "/proc/1/ns/net" and "vf-addresses" in mounts
    settings = agent_settings.Settings.from_env(
        {k: v for k, v in env.items() if k in ("DSAGENT_NODE_NETNS", "DSAGENT_VF_ADDRESSES")}
    )
    assert settings.node_netns == "/proc/1/ns/net" and settings.vf_addresses is not None
    with pytest.raises(Exception, match="devicePlugin.enabled"):
        render({"agent": {"devicePlugin": {"enabled": False, "nodeLabel": "x", "vfSetup": True}}})
    # the device plugin off leaves the default auto with nothing to do: no VF set-up, no refusal
    off = parts(render({"csi": {"enabled": False}, "agent": {"devicePlugin": {"enabled": False}}}))
    assert "DSAGENT_VF_SETUP" not in off[3] and off[1]["host-sys"]["readOnly"] is True  # discovery reads it


def test_the_default_install_runs_the_class_path_where_the_hardware_carries_it() -> None:
    """Defaults: the agent decides per node, the webhook rewrites multi-worker jobs only where
    the nodes the plugin serves (the label the agent writes) can hold them, and the plain
    resource the webhook leaves alone is the one the plugin serves in NVIDIA's place."""
    from dsagent.webhook.gpurequest import GpuClassSettings

    docs = render({})
    agent = {e["name"]: e.get("value") for e in agent_pod(docs)["containers"][0]["env"]}
    webhook = _env(docs, "Deployment", "-webhook")
    assert agent["DSAGENT_DEVICE_PLUGIN"] == "auto" and webhook["DSAGENT_WEBHOOK_GPU_CLASSES"] == "auto"
    assert webhook["DSAGENT_WEBHOOK_SERVED_LABEL"] == agent["DSAGENT_DEVICE_PLUGIN_NODE_LABEL"]
    assert webhook["DSAGENT_WEBHOOK_GPU_RESOURCE"] == agent["DSAGENT_DEVICE_PLUGIN_GPU_RESOURCE"]
    classes = GpuClassSettings.read({k: v for k, v in webhook.items() if k.startswith("DSAGENT_WEBHOOK_") and v})
    assert classes.mode == "auto" and classes.served_label == agent["DSAGENT_DEVICE_PLUGIN_NODE_LABEL"]
    # the job Leases, and the nodes the vote reads
    [role] = [d for d in docs if d.get("kind") == "ClusterRole" and d["metadata"]["name"].endswith("-webhook")]
    assert any(r["resources"] == ["leases"] for r in role["rules"])
    # a renamed label reaches both
    renamed = render({"agent": {"devicePlugin": {"enabled": "auto", "nodeLabel": "example.com/gpus-by-dsagent"}}})
    assert _env(renamed, "Deployment", "-webhook")["DSAGENT_WEBHOOK_SERVED_LABEL"] == "example.com/gpus-by-dsagent"


def test_auto_without_the_class_rewrite_still_serves_plain_gpu_pods() -> None:
    docs = render({"agent": {"devicePlugin": {"enabled": "auto"}}, "gpuClasses": {"enabled": False}})
    env = {e["name"]: e.get("value") for e in agent_pod(docs)["containers"][0]["env"]}
    assert env["DSAGENT_DEVICE_PLUGIN"] == "auto" and env["DSAGENT_DEVICE_PLUGIN_GPU_RESOURCE"] == "nvidia.com/gpu"
    assert _env(docs, "Deployment", "-webhook")["DSAGENT_WEBHOOK_GPU_CLASSES"] == "false"


def test_uninstalling_hands_the_nodes_back_to_nvidias_plugin_with_just_those_rights() -> None:
    """A pre-delete hook runs ``dsagent release-nodes`` (tested against the fake API server in
    tests/dsagent/nodeagent/test_hardware.py) with a ServiceAccount that may list and patch
    Nodes and patch their status, nothing else; no hook where the plugin never runs."""
    from kubernetes_validate import utils as kv

    docs = render({"agent": {"devicePlugin": {"enabled": "auto", "nodeLabel": "example.com/gpus-by-dsagent"}}})
    hook = [d for d in docs if d["metadata"]["name"].endswith("-release-nodes")]
    assert sorted(d["kind"] for d in hook) == ["ClusterRole", "ClusterRoleBinding", "Job", "ServiceAccount"]
    for doc in hook:
        annotations = doc["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete"
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    weights = {d["kind"]: int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for d in hook}
    assert weights["Job"] > max(w for k, w in weights.items() if k != "Job")  # its rights exist first
    [role] = [d for d in hook if d["kind"] == "ClusterRole"]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    ]
    [job] = [d for d in hook if d["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"] == ["dsagent", "release-nodes", "--label", "example.com/gpus-by-dsagent"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["restartPolicy"] == "Never"
    kv.validate(job, "1.29.0", strict=True)
    off = render({"agent": {"devicePlugin": {"enabled": False}}})
    assert not [d for d in off if d["metadata"]["name"].endswith("-release-nodes")]


def test_the_kubelets_root_moves_the_device_plugin_dirs_and_a_wrong_one_blocks_no_agent() -> None:
    """csi.kubeletDir (k0s, microk8s: another kubelet root) moves device-plugins/ and
    pod-resources/ with it; both are created if missing, so a wrong root never keeps the agent
    from starting (its plugin then stays off: no kubelet.sock, tests/dsagent/nodeplugins)."""
    pod = agent_pod(render({"csi": {"kubeletDir": "/var/lib/k0s/kubelet"}}))
    volumes = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    assert volumes["device-plugins"] == {"path": "/var/lib/k0s/kubelet/device-plugins", "type": "DirectoryOrCreate"}
    assert volumes["pod-resources"] == {"path": "/var/lib/k0s/kubelet/pod-resources", "type": "DirectoryOrCreate"}
