"""Every place that checks a Kubernetes name uses dsplatform.names' one rule.

Before the rule was written once, the CSI driver, the cluster agent, the webhook's GPU
class settings, the class-name prefix and the extender each had a looser copy that let an
empty DNS label through (``a..b``, ``a.-b``), or a trailing newline (``re.match`` with
``$``). Each place is driven through its own entry point here with such a name, and must
refuse it; a good name must still pass, so the test cannot pass by refusing everything.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dsplatform.errors import PlatformError

BAD = ["a..b", "a.-b", "good\n"]
POD_UID = "0f6c2d35-0a1b-4c5d-8e9f-0123456789ab"


def _cache_resource_prefix(value: str) -> None:
    from dsagent.cache.settings import Settings

    Settings.read({"DSAGENT_RESOURCE_PREFIX": value})


def _device_plugin_prefix(value: str) -> None:
    from dsagent.nodeplugins.deviceplugin.allocation import validate_prefix

    validate_prefix(value)


def _csi_context(**change: str) -> dict[str, str]:
    from dsagent.nodeplugins.csi import volumes

    context = {volumes.EPHEMERAL: "true", volumes.POD_UID: POD_UID, volumes.POD_NAMESPACE: "ns", volumes.POD_NAME: "p"}
    return {**context, **change}


def _csi_pod_namespace(value: str) -> None:
    from dsagent.nodeplugins.csi import volumes

    volumes.pod_info(_csi_context(**{volumes.POD_NAMESPACE: value}))


def _csi_pod_name(value: str) -> None:
    from dsagent.nodeplugins.csi import volumes

    volumes.pod_info(_csi_context(**{volumes.POD_NAME: value}))


def _csi_target_volume(value: str, tmp_path: Path) -> None:
    from dsagent.nodeplugins.csi.volumes import check_target

    check_target(str(tmp_path / POD_UID / "volumes" / "kubernetes.io~csi" / value / "mount"), tmp_path, POD_UID)


def _csi_driver_name(value: str, tmp_path: Path) -> None:
    from dsagent.cache.settings import Settings
    from dsagent.nodeplugins.csi.driver import NodeDriver

    service: Any = None  # the name is checked before the driver touches its service
    NodeDriver(service, Settings(root=tmp_path, csi_driver_name=value))


def _copies_configmap(value: str) -> None:
    from dsagent.nodeagent.clustersettings import ClusterSettings

    ClusterSettings.from_env({"DSAGENT_COPIES_CONFIGMAP": f"dsplatform/{value}"})


def _webhook_class_prefix(value: str) -> None:
    from dsagent.webhook.gpurequest import GpuClassSettings

    GpuClassSettings(prefix=value)


def _webhook_gpu_resource(value: str) -> None:
    from dsagent.webhook.gpurequest import GpuClassSettings

    GpuClassSettings(gpu_resource=f"{value}/gpu")


def _webhook_networks(value: str) -> None:
    from dsagent.webhook.gpurequest import GpuClassSettings

    GpuClassSettings(networks=value + "/dsp-{class}")


def _class_name_prefix(value: str) -> None:
    from gpu_topology import Gpu, Nic, Topology, roce_classes
    from gpu_topology.model import Link

    topology = Topology(gpus=(Gpu(0),), nics=(Nic("mlx5_0"),), links={"GPU0": {"mlx5_0": Link.parse("PIX")}})
    roce_classes(topology, prefix=f"{value}/gpu-roce")


def _extender_class_prefix(value: str) -> None:
    from scheduler_plugin.settings import Settings

    Settings.from_env({"DSEXT_ROCE_RESOURCE_PREFIX": f"{value}/gpu-roce"})


def _extender_gpu_resource(value: str) -> None:
    from scheduler_plugin.settings import Settings

    Settings.from_env({"DSEXT_GPU_RESOURCE": f"{value}/gpu"})


PLACES: dict[str, Callable[..., None]] = {
    "cache settings: DSAGENT_RESOURCE_PREFIX": _cache_resource_prefix,
    "device plugin: resource prefix": _device_plugin_prefix,
    "CSI: the pod's namespace": _csi_pod_namespace,
    "CSI: the pod's name": _csi_pod_name,
    "CSI: the target path's volume name": _csi_target_volume,
    "CSI: DSAGENT_CSI_DRIVER_NAME": _csi_driver_name,
    "cluster agent: DSAGENT_COPIES_CONFIGMAP": _copies_configmap,
    "webhook: class resource prefix": _webhook_class_prefix,
    "webhook: GPU resource": _webhook_gpu_resource,
    "webhook: network attachment namespace": _webhook_networks,
    "gpu_topology: class name prefix": _class_name_prefix,
    "extender: DSEXT_ROCE_RESOURCE_PREFIX": _extender_class_prefix,
    "extender: DSEXT_GPU_RESOURCE": _extender_gpu_resource,
}


def _call(place: Callable[..., None], value: str, tmp_path: Path) -> None:
    if "tmp_path" in place.__code__.co_varnames[: place.__code__.co_argcount]:
        place(value, tmp_path)
    else:
        place(value)


@pytest.mark.parametrize("place", PLACES, ids=list(PLACES))
def test_a_good_name_passes(place: str, tmp_path: Path) -> None:
    _call(PLACES[place], "dsagent", tmp_path)  # a label, so a subdomain and a domain prefix too


@pytest.mark.parametrize("value", BAD, ids=["double-dot", "dot-dash", "newline"])
@pytest.mark.parametrize("place", PLACES, ids=list(PLACES))
def test_a_name_with_an_empty_label_or_a_newline_is_refused(place: str, value: str, tmp_path: Path) -> None:
    with pytest.raises((PlatformError, ValueError)):
        _call(PLACES[place], value, tmp_path)
