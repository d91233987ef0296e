"""What cluster mode lends the cache service: the task guard and the peer list.

Who calls it: ``dsagent serve --kubernetes`` (:mod:`dsagent.nodeagent.nodeparts`) builds
:class:`ClusterHooks` before the :class:`~dsagent.cache.service.CacheService`, which takes
:meth:`ClusterHooks.for_service` in its constructor; the node agent
(:class:`dsagent.nodeagent.clusteragent.ClusterAgent`) connects it to its pod watch and API
client when it starts. What it owns: which task ids a pod may use (a pod UID only for a
pod bound to this node, :class:`TaskNotOnNode` otherwise), a pod's namespace and the
datasets its annotation names (what it may read of a striped version), and which agents
hold a version (from the nodes' inventories) for the peer fetch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Container
from typing import Any

from dsagent.cache.servicehooks import NamedDataset, PeerHolder, PodWiring, ServiceHooks
from dsagent.cache.settings import Settings
from dsagent.errors import DsagentError
from dsagent.kube.apiclient import in_daemon_thread, translated
from dsagent.nodeagent.clustersettings import ClusterSettings
from dsagent.nodeagent.podwatch import PodWatch
from dsplatform import errors as platform_errors
from dsplatform.names import is_pod_uid
from dsplatform.wire import nodecache, podannotations

log = logging.getLogger("dsagent.nodeagent")


class TaskNotOnNode(DsagentError):
    """A pod-UID task id that is no pod on this node (403 over the API, exit 2 in dsctl)."""

    http_status = 403
    exit_code = 2
    code = "task_not_on_node"
    grpc_status = "PERMISSION_DENIED"  # the CSI node plugin's answer for a pod not on this node


class ClusterHooks:
    """What cluster mode lends the cache service (:class:`~dsagent.cache.servicehooks.ServiceHooks`):
    the task guard and the peer list from the node
    inventories. Built before the service, which takes :meth:`for_service` in its
    constructor; they need the agent's pod watch and API client, not the service, and get
    them when the agent starts (:meth:`connect`) until it stops (:meth:`disconnect`).
    Unconnected, every task id is admitted and no cluster peer is listed, as without
    cluster mode (the agent cannot tell which pods are on its node yet)."""

    def __init__(self, settings: Settings, cluster: ClusterSettings) -> None:
        self.node_name = settings.node_name
        self.guard_wait = cluster.guard_wait
        port = settings.peer_port or (settings.listen[1] if settings.listen else 0)
        self.peer_port = port if settings.peer_token is not None else 0  # 0: peers off
        self._watch: PodWatch | None = None
        self._core: Any = None
        self._submitted: Container[str] = frozenset()

    def for_service(self) -> ServiceHooks:
        """The hooks for ``CacheService(settings, hooks=...)``; peers only with a token and a port."""
        return ServiceHooks(
            admit_task=self.check_task,
            peer_holders=self.peer_holders if self.peer_port else None,
            pod_datasets=self.pod_datasets,
            pod_wiring=self.pod_wiring,
            node_leaving=self.node_leaving,
            reports_pods=True,  # ClusterAgent: once its first pod list is in, then at each change
        )

    def connect(self, watch: PodWatch, core: Any, submitted: Container[str]) -> None:
        """The agent's pod watch, its CoreV1Api and the pod UIDs it submitted itself."""
        self._watch, self._core, self._submitted = watch, core, submitted

    def disconnect(self) -> None:
        self._watch, self._core, self._submitted = None, None, frozenset()

    async def check_task(self, task_id: str) -> None:
        """Accept a pod-UID task id only for a pod bound to this node (other ids pass)."""
        watch = self._watch
        if not is_pod_uid(task_id) or watch is None or task_id in self._submitted:
            return
        if not watch.synced.is_set():
            log.warning("accepting task %s unchecked: the pod watch has not synced yet", task_id)
            return
        deadline = time.monotonic() + self.guard_wait
        while not watch.has_pod(task_id):  # the init-container may be faster than the watch
            if time.monotonic() >= deadline:
                raise TaskNotOnNode(
                    f"task {task_id} is not a pod on node {self.node_name}",
                    hint="init-containers send their own pod's UID (DSAGENT_TASK_ID from metadata.uid)",
                )
            await asyncio.sleep(0.05)

    async def pod_datasets(self, uid: str) -> frozenset[str] | None:
        """The dataset names the annotation of pod ``uid`` on this node asks for (None: no
        such pod seen, or an unreadable annotation): what the pod may read through
        ``/v1/stripes`` besides its task (docs/design-striping.md#agent)."""
        watch = self._watch
        pod = watch.pods().get(uid) if watch is not None else None
        if pod is None:
            return None
        try:
            return frozenset(ref.name for ref in podannotations.datasets_of(pod))
        except platform_errors.InvalidInput:
            return None

    async def pod_wiring(self, uid: str) -> PodWiring | None:
        """The namespace of pod ``uid`` on this node and the datasets its annotation names,
        each with the bundle store it names (None: its namespace's Dataset) and the version it
        pins; None when no such pod was seen. An unreadable annotation names nothing. Whom a
        striped version's bundles are served to (:mod:`dsagent.cache.striped.stripereaders`)."""
        watch = self._watch
        pod = watch.pods().get(uid) if watch is not None else None
        if pod is None:
            return None
        namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
        try:
            refs = podannotations.datasets_of(pod)
        except platform_errors.InvalidInput:
            refs = ()
        return PodWiring(namespace, tuple(NamedDataset(r.name, r.bundles or r.source, r.digest) for r in refs))

    async def node_leaving(self) -> bool | None:
        """Whether this node is cordoned or tainted for a drain (:func:`dsagent.kube.leaving.node_leaving`),
        read from the API now; None when it cannot be read within its timeout."""
        from dsagent.kube.leaving import node_leaving

        core = self._core
        if core is None:
            return None

        def read() -> Any:
            with translated(f"read node {self.node_name}"):
                node = core.read_node(self.node_name, _request_timeout=5)
            return core.api_client.sanitize_for_serialization(node)

        try:
            return node_leaving(await asyncio.wait_for(in_daemon_thread(read), 10))
        except (DsagentError, asyncio.TimeoutError) as exc:  # unknown: the hand-off goes on (bounded)
            log.warning("cannot read node %s to see whether it is leaving: %s", self.node_name, exc or "timed out")
            return None

    async def peer_holders(self, name: str, digest: str, *, shares: bool = True) -> list[PeerHolder]:
        """Agents whose node inventory lists ``name@digest`` ready, then fetching, then (unless
        ``shares=False``) holding a share of its stripe group (docs/design.md#peers)."""
        from dsagent.nodeagent.peerlist import holders_from_nodes

        core = self._core
        if core is None:
            return []

        def nodes() -> list[Any]:
            with translated("list nodes"):
                return list(core.list_node(_request_timeout=10).items or [])

        def caches() -> dict[str, nodecache.NodeState] | None:
            from kubernetes.client import CustomObjectsApi

            try:
                with translated("list nodecaches"):
                    listed = CustomObjectsApi(core.api_client).list_cluster_custom_object(
                        nodecache.GROUP, nodecache.API_VERSION, nodecache.PLURAL, _request_timeout=10
                    )
            except DsagentError as exc:  # no CRD yet (an upgrade under way): the Nodes' annotations alone
                log.debug("cannot list the NodeCaches (%s); reading the Node annotations only", exc)
                return None
            return nodecache.by_node(listed.get("items") or ()) if isinstance(listed, dict) else None

        listed_nodes, published = await asyncio.gather(asyncio.to_thread(nodes), asyncio.to_thread(caches))
        return holders_from_nodes(
            listed_nodes, self.node_name, name, digest, self.peer_port, shares=shares, published=published
        )
