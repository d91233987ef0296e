"""What ``dsagent serve`` runs beside the cache service on this node, chosen by its settings.

Who calls it: the node agent's process (:mod:`dsagent.nodeagent.serve`), once at start-up. What it
owns: the hooks the service is built with and the companions that run on its loop
(:func:`node_parts`: cluster mode's :class:`~dsagent.nodeagent.clusteragent.ClusterAgent` and its
hooks, the CSI node plugin), the device plugin (:func:`device_plugin_wanted`,
:func:`start_device_plugin`; once NVIDIA's has left the node, :func:`start_when_handed_over`),
the kubelet's free GPUs for cluster mode, and the one-line refusal where a chosen part is
missing from the install (:func:`require_kubelet_extra`, :class:`KubernetesUnavailable`).
Each part is imported only when the settings choose it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from dsagent.api import CompanionFactory
from dsagent.cache.service import CacheService
from dsagent.cache.servicehooks import ServiceHooks
from dsagent.cache.settings import Settings
from dsagent.errors import DsagentError, SettingsError
from dsagent.nodeagent.clustersettings import ClusterSettings

#: every settings class the node agent reads: what its start-up check accepts (dsagent.kube.envnames)
SETTINGS = (Settings, ClusterSettings)


class KubernetesUnavailable(SettingsError):
    """Cluster mode was asked for, but this build or install lacks it (like a missing extra)."""


def require_kubelet_extra(settings: Settings) -> None:
    """Stop at start-up, in one line, where a chosen kubelet plugin lacks the ``kubelet`` extra.

    grpcio and protobuf are an extra so that ``pip install dsplatform`` for dsctl in a training
    image does not force their newest releases beside TensorFlow or Ray; the agent's image
    installs them. The CSI node plugin, the device plugin and cluster mode (free GPUs from the
    kubelet's pod-resources API) need them.
    """
    wanted = [
        feature
        for feature, on in (
            ("the CSI node plugin (DSAGENT_CSI_SOCKET)", settings.csi_socket is not None),
            ("the device plugin (--device-plugin)", settings.device_plugin != "off"),
            ("cluster mode (--kubernetes: free GPUs from the kubelet's pod-resources API)", settings.kubernetes),
        )
        if on
    ]
    if not wanted:
        return
    try:
        import google.protobuf  # noqa: F401
        import grpc  # noqa: F401
    except ImportError as exc:
        raise SettingsError(
            f"{wanted[0]} needs {exc.name!r}, which is not installed",
            hint="pip install 'dsplatform[kubelet]' (the agent's image has it)",
        ) from exc


def load_cluster_agent(settings: Settings) -> tuple[ServiceHooks, CompanionFactory]:
    """Cluster mode's hooks for the service and ``dsagent.nodeagent.clusteragent.ClusterAgent``'s
    factory (sharing one ``ClusterHooks``), imported only in cluster mode."""
    try:
        from dsagent.nodeagent.clusteragent import ClusterAgent
        from dsagent.nodeagent.clusterhooks import ClusterHooks
    except ImportError as exc:
        name = getattr(exc, "name", None) or ""
        if name and not name.startswith("dsagent"):
            raise KubernetesUnavailable(
                f"cluster mode needs {name!r}, which is not installed", hint="pip install dsplatform"
            ) from exc
        raise KubernetesUnavailable(
            "cluster mode (--kubernetes) is not available in this build: dsagent.nodeagent.clusteragent is missing",
            hint="run without --kubernetes / DSAGENT_KUBERNETES, or install a build with the Kubernetes integration",
        ) from exc
    free_gpus = free_gpu_source(settings)
    cluster = ClusterSettings.from_env(os.environ)
    hooks = ClusterHooks(settings, cluster)
    return hooks.for_service(), lambda svc: ClusterAgent(
        svc, settings, cluster=cluster, free_gpus=free_gpus, hooks=hooks
    )


class CsiCompanion:
    """The CSI node plugin beside the service (docs/design.md#csi): recover, then serve the socket."""

    def __init__(self, service: CacheService, settings: Settings) -> None:
        self.service, self.settings = service, settings
        self._server: Any = None
        self._driver: Any = None

    async def start(self) -> None:
        from dsagent.nodeplugins.csi.driver import NodeDriver, serve

        assert self.settings.csi_socket is not None
        self._driver = NodeDriver(self.service, self.settings)
        await self._driver.recover()
        self._server = await serve(self._driver, self.settings.csi_socket)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(5)
        if self._driver is not None:
            await self._driver.stop()


@dataclass(frozen=True)
class NodeParts:
    """What ``dsagent serve`` builds around the cache service: the hooks it is built with,
    and the companions that run beside it."""

    hooks: ServiceHooks = ServiceHooks()
    companions: tuple[CompanionFactory, ...] = ()


def node_parts(settings: Settings) -> NodeParts:
    """The service's hooks and the companions on this node, by the settings."""
    hooks = ServiceHooks()
    chosen: list[CompanionFactory] = []
    if settings.kubernetes:
        hooks, cluster_agent = load_cluster_agent(settings)
        chosen.append(cluster_agent)
    if settings.csi_socket is not None:
        chosen.append(lambda svc: CsiCompanion(svc, settings))
    return NodeParts(hooks, tuple(chosen))


async def device_plugin_wanted(settings: Settings) -> bool:
    """False on a node without ``<DSAGENT_DEVICE_PLUGIN_NODE_LABEL>=true`` (cluster mode only).

    The label is how the plugin and NVIDIA's never serve one node: NVIDIA's DaemonSet
    excludes labelled nodes, ours serves only them (docs/user-guide/gpu-allocation.md).
    """
    label = settings.device_plugin_node_label
    if not label or not settings.kubernetes:
        return True
    from dsagent.kube import apiclient

    def labels() -> dict[str, str]:
        from kubernetes import client

        api = apiclient.load()
        try:
            with apiclient.translated(f"read node {settings.node_name}"):
                node = client.CoreV1Api(api).read_node(settings.node_name, _request_timeout=10)
        finally:
            api.close()
        return dict((node.metadata.labels if node.metadata else None) or {})

    value = (await asyncio.to_thread(labels)).get(label)
    if value != "true":
        logging.getLogger("dsagent").info(
            "node %s is not labelled %s=true: no device plugin here", settings.node_name, label
        )
    return value == "true"


async def decide_device_plugin(settings: Settings) -> tuple[bool, Any]:
    """Whether this node runs the device plugin, and the topology discovered to decide it
    (None where none was): ``off``, no; ``on``, where the node carries the label
    (:func:`device_plugin_wanted`); ``auto``, where its hardware carries the RoCE-class path
    (:func:`dsagent.nodeagent.hardware.roce_path`) and the kubelet's device-plugin socket is
    where the agent looks for it, which in cluster mode the agent writes on its Node (labels,
    the ``DsplatformRoceClasses`` condition, an Event) before it starts."""
    if settings.device_plugin == "off":
        return False, None
    if settings.device_plugin == "on":
        return await device_plugin_wanted(settings), None
    from dsagent.nodeagent.hardware import Decision, roce_path
    from gpu_topology import TopologyError, discover

    topology = None
    try:
        topology = await asyncio.to_thread(partial(discover, options=settings.discovery_options))
        decision = roce_path(topology, mode=settings.roce_classes)
    except TopologyError as exc:
        decision = Decision(False, "NoTopology", f"GPU discovery found no topology ({exc}): no device plugin here")
    kubelet = settings.device_plugin_dir / "kubelet.sock"
    if decision.on and not await asyncio.to_thread(kubelet.exists):
        # a kubelet root other than the chart's (csi.kubeletDir): taking the node from NVIDIA's
        # plugin would leave it with none that the kubelet hears
        decision = Decision(
            False,
            "NoKubeletSocket",
            f"no kubelet device-plugin socket at {kubelet} (the kubelet's root directory differs: "
            "the chart's csi.kubeletDir): NVIDIA's device plugin serves the GPUs",
            decision.classes,
        )
    logging.getLogger("dsagent").info(
        "device plugin auto: %s on node %s (%s: %s)",
        "on" if decision.on else "off", settings.node_name, decision.reason, decision.message,
    )  # fmt: skip
    if settings.kubernetes:
        await asyncio.to_thread(publish_hardware_decision, settings, decision)
    return decision.on, topology


def publish_hardware_decision(settings: Settings, decision: Any) -> None:
    """Say on the agent's Node which device plugin serves its GPUs and why: the labels
    (:func:`dsagent.nodeagent.hardware.node_patch`), the condition and a Node Event. Best
    effort: a refusal (RBAC, the admission policy) is logged, the agent goes on."""
    from dsagent.nodeagent.hardware import CONDITION, PLUGIN_LABEL, node_patch

    label = settings.device_plugin_node_label or PLUGIN_LABEL
    _say_on_node(
        settings, decision, CONDITION, ("DevicePluginOn", "DevicePluginOff"), "which device plugin serves its GPUs",
        labels=lambda now: node_patch(decision, now, label),
    )  # fmt: skip


def publish_links(settings: Settings, choice: Any) -> None:
    """Say on the agent's Node which links its fetches spread over, and why
    (:class:`dsagent.cache.fetchlinks.LinkChoice`): the ``DsplatformFetchLinks`` condition
    and a Node Event. Best effort, as :func:`publish_hardware_decision`."""
    from dsagent.nodeagent.hardware import LINKS_CONDITION, Decision

    decision = Decision(bool(choice.addresses), choice.reason, choice.message)
    _say_on_node(settings, decision, LINKS_CONDITION, ("FetchLinksOn", "FetchLinksOff"), "which links it fetches over")


def _say_on_node(
    settings: Settings,
    decision: Any,
    condition: str,
    reasons: tuple[str, str],
    what: str,
    *,
    labels: Callable[[dict[str, str]], dict[str, Any]] | None = None,
) -> None:
    """A decision on the agent's Node: ``labels``' patch of its labels (given the Node's
    now), ``condition`` and a Node Event (``reasons``: on, off). Best effort: a refusal or an
    unreachable API server is logged (``what`` the agent could not say), the agent goes on."""
    from kubernetes import client

    from dsagent.kube import apiclient
    from dsagent.kube.events import EventRecorder, ObjectRef

    log = logging.getLogger("dsagent")
    try:
        api = apiclient.load()
    except DsagentError as exc:
        log.warning("could not say on node %s %s: %s", settings.node_name, what, exc)
        return
    try:
        core = client.CoreV1Api(api)
        with apiclient.translated(f"read node {settings.node_name}"):
            node = core.read_node(settings.node_name, _request_timeout=10)
        now = dict((node.metadata.labels if node.metadata else None) or {})
        patch = labels(now) if labels is not None else {}
        _write_on_node(core, settings.node_name, patch, decision, condition=condition)
        uid = str(node.metadata.uid or "") if node.metadata else ""
        events = EventRecorder(api, controller="dsagent.io/agent", instance=settings.node_name)
        events.record(
            ObjectRef("v1", "Node", "default", settings.node_name, uid),
            type="Normal", reason=reasons[0] if decision.on else reasons[1], action="Decide", note=decision.message,
        )  # fmt: skip
    except DsagentError as exc:
        log.warning("could not say on node %s %s: %s", settings.node_name, what, exc)
    finally:
        api.close()


async def start_when_handed_over(settings: Settings, topology: Any = None, seen: list[str] | None = None) -> Any:
    """The device plugin, started once NVIDIA's has left this node (:mod:`dsagent.nodeagent.handover`);
    None where it is still there after ``DSAGENT_DEVICE_PLUGIN_HANDOVER``: this agent's then
    stays off (with ``auto``, its Node says so and NVIDIA's label is taken back), for the two
    would hand one GPU to two pods. ``seen``: NVIDIA's sockets the caller's probe just found
    answering (not probed again at once)."""
    from dsagent.nodeagent.handover import wait_until_gone

    log = logging.getLogger("dsagent")
    stays = await wait_until_gone(settings.device_plugin_dir, settings.device_plugin_handover, seen=seen)
    if not stays:
        return await start_device_plugin(settings, topology=topology, sysfs_root=settings.sysfs_root)
    from dsagent.nodeagent.hardware import Decision

    decision = Decision(
        False,
        "NvidiaPluginStays",
        f"NVIDIA's device plugin still serves this node ({', '.join(stays)}) "
        f"{settings.device_plugin_handover:g} s after the agent asked it to leave: this agent's plugin "
        "stays off (a plain NVIDIA DaemonSet needs the node affinity in docs/user-guide/gpu-allocation.md)",
    )
    log.warning("device plugin off on node %s: %s", settings.node_name, decision.message)
    if settings.device_plugin == "auto" and settings.kubernetes:
        await asyncio.to_thread(publish_hardware_decision, settings, decision)
    return None


def _others_devices(settings: Settings, client: Any) -> Callable[[], Awaitable[set[str]]]:
    """What the device plugin asks, at start and at each reconcile: the device IDs other
    plugins advertise to the kubelet (pod-resources' allocatable devices of the resources that
    are not this plugin's). The SR-IOV network operator's device plugin names its VFs by PCI
    address, so a VF among them is another plugin's: handed out by both, it would go to two
    containers."""
    from dsagent.nodeplugins.deviceplugin.allocation import others_devices

    prefix, plain = f"{settings.resource_prefix}/", settings.device_plugin_gpu_resource

    async def others() -> set[str]:
        return others_devices(await client.allocatable(), lambda r: r.startswith(prefix) or r == plain)

    return others


def _write_on_node(
    core: Any, name: str, labels_patch: dict[str, Any], decision: Any | None, *, condition: str | None = None
) -> None:
    """Node ``name``'s labels patched (``labels_patch``, none when empty) and its
    ``condition`` (``DsplatformRoceClasses`` unless given) set for ``decision`` (None: left
    alone): what the agent's decisions and the release's uninstall write."""
    from dsagent.kube import apiclient
    from dsagent.nodeagent.hardware import CONDITION, status_patch
    from dsplatform.kubetime import format_time

    if labels_patch:
        with apiclient.translated(f"label node {name}"):
            core.patch_node(name, labels_patch, _request_timeout=10)
    if decision is None:
        return
    with apiclient.translated(f"set the condition of node {name}"):
        # strategic merge: the conditions merge by type (a merge patch would replace the kubelet's)
        core.patch_node_status(
            name, status_patch(decision, format_time(time.time()), condition or CONDITION),
            _content_type="application/strategic-merge-patch+json", _request_timeout=10,
        )  # fmt: skip


def release_nodes(label: str) -> list[str]:
    """Hand every node this agent's device plugin served (``<label>`` set) back to NVIDIA's,
    as the release is uninstalled (the chart's pre-delete hook runs ``dsagent release-nodes``):
    the labels by :func:`dsagent.nodeagent.hardware.release_patch`, the condition False with
    reason ``Uninstalled``; the names of the nodes changed. Without it a node would keep
    ``nvidia.com/gpu.deploy.device-plugin=false`` and no device plugin at all."""
    from kubernetes import client

    from dsagent.kube import apiclient
    from dsagent.nodeagent.hardware import CONDITION, RELEASED, release_patch

    api = apiclient.load()
    released: list[str] = []
    try:
        core = client.CoreV1Api(api)
        with apiclient.translated("list nodes"):
            nodes = core.list_node(label_selector=label, _request_timeout=30).items
        for node in nodes:
            if node.metadata is None or not node.metadata.name:
                continue
            name = str(node.metadata.name)
            patch = release_patch(dict(node.metadata.labels or {}), label)
            if not patch:
                continue
            said = any(c.type == CONDITION for c in (node.status.conditions if node.status else None) or [])
            _write_on_node(core, name, patch, RELEASED if said else None)  # a condition only where one was
            released.append(name)
    finally:
        api.close()
    return released


def free_gpu_source(settings: Settings) -> Any:
    """Free GPUs from the kubelet's pod-resources API, for the ClusterAgent's annotation."""
    from dsagent.nodeplugins.deviceplugin.podresources import GPU_RESOURCE_PREFIXES, PodResourcesClient

    client = PodResourcesClient(settings.pod_resources_socket)
    prefixes = GPU_RESOURCE_PREFIXES + (f"{settings.resource_prefix}/gpu-",)

    async def free_gpus(topology: Any) -> list[int] | None:
        return await client.free_gpus(topology, prefixes)

    return free_gpus


async def start_device_plugin(settings: Settings, *, topology: Any = None, sysfs_root: Path = Path("/")) -> Any:
    """Discover GPUs and VFs, then serve and register the device plugin (docs/design.md#roce-allocation)."""
    from dsagent.nodeplugins.deviceplugin.allocation import NodeDevices
    from dsagent.nodeplugins.deviceplugin.plugin import DevicePlugin
    from dsagent.nodeplugins.deviceplugin.podresources import PodResourcesClient
    from gpu_topology import TopologyError, discover
    from gpu_topology.discovery.sriov import discover_vfs

    try:
        if topology is None:
            topology = await asyncio.to_thread(partial(discover, options=settings.discovery_options))
        vfs = await asyncio.to_thread(discover_vfs, sysfs_root)
        if settings.vf_setup != "off" or settings.vf_addresses is not None:
            from dsagent.nodeplugins.deviceplugin.vfsetup import set_up_vfs

            setup = partial(set_up_vfs, topology, vfs, sysfs_root, settings.vf_setup, settings.vf_addresses)
            vfs = await asyncio.to_thread(setup)
    except TopologyError as exc:
        raise SettingsError(
            f"GPU discovery failed: {exc}", hint="run the device plugin on a GPU node, or turn it off"
        ) from exc
    client = PodResourcesClient(settings.pod_resources_socket)
    others = _others_devices(settings, client)
    foreign: set[str] = set()
    try:
        foreign = await others()
    except DsagentError as exc:  # the kubelet not answering yet: the next reconcile asks again
        logging.getLogger("dsagent").info("other device plugins' devices not read yet: %s", exc)
    from dsagent.nodeplugins.deviceplugin.allocation import without_vfs

    kept = without_vfs(vfs, foreign)  # never paired with, nor chosen for, a container
    for nic, pf in vfs.items():
        if len(kept[nic].vfs) < len(pf.vfs):
            logging.getLogger("dsagent").info(
                "%d VF(s) of %s are another device plugin's (pod-resources): not handed out here",
                len(pf.vfs) - len(kept[nic].vfs), nic,
            )  # fmt: skip
    vfs = kept
    try:
        node = NodeDevices(
            topology,
            vfs,
            settings.resource_prefix,
            settings.roce_classes,
            plain=settings.device_plugin_gpu_resource,
            pairs=settings.device_plugin_devices == "pairs",
        )
    except TopologyError as exc:  # subnet mode and a GPU-affine NIC without an address
        raise SettingsError(
            f"RoCE classes by DSAGENT_ROCE_CLASSES={settings.roce_classes}: {exc}",
            hint="the agent publishes this node without classes too; give the NICs their addresses or use numa",
        ) from exc
    if not node.resources:
        raise SettingsError(
            "this node has no RoCE class: nothing to advertise",
            hint="turn the device plugin off on this node, or let it serve DSAGENT_DEVICE_PLUGIN_GPU_RESOURCE",
        )
    host_root = settings.host_root if settings.host_root is not None else settings.root
    addresses = None
    if settings.vf_addresses is not None:
        from dsagent.nodeplugins.deviceplugin.vfsetup import AddressAtAllocation

        netdevs = [vf.netdev for pf in vfs.values() for vf in pf.vfs if vf.netdev]
        addresses = AddressAtAllocation(settings.vf_addresses, netdevs, netns=settings.node_netns)
    plugin = DevicePlugin(
        node,
        others=others,
        state_dir=settings.root / "kubelet",
        host_state_dir=host_root / "kubelet",
        plugin_dir=settings.device_plugin_dir,
        listed=client.listed,
        vf_addresses=addresses,
        foreign=foreign,
    )
    await plugin.start()
    return plugin
