"""The node agent in cluster mode: :class:`ClusterAgent`, the glue between Kubernetes and
the :class:`~dsagent.cache.service.CacheService`.

``dsagent serve --kubernetes`` creates ``hooks = ClusterHooks(settings, cluster)``, then
``CacheService(settings, hooks=hooks.for_service())`` and ``ClusterAgent(service, settings,
hooks=hooks)``, and awaits
:meth:`ClusterAgent.start` at start-up and :meth:`ClusterAgent.stop` at shutdown. It

1. publishes the node's inventory and topology in its ``NodeCache`` (named after the node,
   owned by its Node; created when missing, then merge-patched) and its free GPUs as the
   Node annotation ``dsagent.io/free-gpus`` (from the kubelet's pod-resources API when
   ``free_gpus`` is given and answers, else only while no pod requests GPUs)
   (``DSAGENT_NODE_NAME``, from the downward API), each written only on change and at most
   once per ``DSAGENT_PUBLISH_INTERVAL`` (:class:`~dsagent.nodeagent.statewrites.Coalescer`,
   counted in ``dsplatform_agent_state_writes_total``), the ``NodeCache`` with the time it
   was written (``status.publishedAt``, rewritten at least every ``DSAGENT_PUBLISH_HEARTBEAT``
   so a stale inventory can be told); the inventory, topology and published-at annotations
   an agent of the release before left on the Node are removed with the first Node write
   (docs/operator-guide/upgrade.md#nodecache); a graceful stop empties the ``NodeCache`` and
   removes the annotation within ``DSAGENT_STOP_TIMEOUT``, even while the API server hangs
   (docs/operator-guide/tenancy.md);
2. watches the pods bound to its node (:class:`~dsagent.nodeagent.podwatch.PodWatch`) and, as
   soon as one that names datasets is bound, submits its task (the pod UID) to the
   service, so caching runs while the kubelet pulls the images (docs/design.md#rule-3); the
   task is the very request its init-container will repeat, so that repeat is a no-op;
3. keeps a running pod's datasets in use by renewing the task's lease (and the stripe
   shares held for the Datasets it names, which it reads from local disk), and releases the
   task when the pod ends or is deleted (also when that happened while the watch was
   broken: a relist after ``410 Gone`` reports it);
4. connects the :class:`~dsagent.nodeagent.clusterhooks.ClusterHooks` the service was built
   with (the task guard: a task id shaped like a pod UID must be a pod on this node; the
   peer list) to its pod watch and API client (``dsagent serve`` wires both);
5. with ``DSAGENT_COPIES_CONFIGMAP`` (``namespace/name``, set by the chart), reads the
   Dataset controller's per-version copy counts every ``DSAGENT_COPIES_INTERVAL`` into the
   service's :class:`~dsagent.policy.copies.ClusterCopies`, so eviction keeps the cluster's
   last copies (docs/design.md#cluster-eviction); a failed or hostile read keeps the last
   counts, which stop counting once stale.

Pods whose datasets need storage credentials from Secrets are left to their
init-container (the agent never reads Secrets); the agent does not block on the API
server: if it is unreachable, caching through the socket keeps working and the watch and
publisher retry in the background.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dsagent.cache.settings import Settings
from dsagent.cache.task import DatasetRequest
from dsagent.errors import DsagentError, InvalidInput, NotFound
from dsagent.kube.apiclient import in_daemon_thread, translated
from dsagent.kube.datasets import DatasetClient
from dsagent.kube.events import EventRecorder
from dsagent.kube.podenv import STRIPE_WAIT_CONTAINER
from dsagent.nodeagent import publisher
from dsagent.nodeagent.clusterhooks import ClusterHooks
from dsagent.nodeagent.clustersettings import ClusterSettings
from dsagent.nodeagent.nodestateapi import NodeStateApi
from dsagent.nodeagent.podevents import EVENTS_CONTROLLER, PodEvents
from dsagent.nodeagent.podrequests import (
    datasets_read,
    has_ended,
    init_container,
    pod_name,
    pod_uid,
    requests_from_init_container,
    wants_datasets,
)
from dsagent.nodeagent.podwatch import PodWatch
from dsagent.nodeagent.statewrites import Coalescer, StateWriteMetrics
from dsplatform import errors as platform_errors
from dsplatform.gpus import GpuResources
from dsplatform.kubetime import format_time
from dsplatform.names import is_pod_uid
from dsplatform.wire import nodecache, podannotations

if TYPE_CHECKING:  # the service is handed in; importing it here would make envnames (start-up of every process) heavy
    from dsagent.cache.service import CacheService

log = logging.getLogger("dsagent.nodeagent")
#: How long a stopping agent waits for its pod watch once the annotations are handled (seconds).
WATCH_STOP_GRACE = 2.0
# The node's free GPU indices from the kubelet (dsagent.nodeplugins.deviceplugin.podresources, wired by the
# CLI: kube never imports kubelet), or None when it cannot tell.
FreeGpuSource = Callable[[Any], Awaitable[Sequence[int] | None]]


class ClusterAgent:
    """Cluster mode for one node; see the module docstring. ``service`` must have been built
    with ``hooks.for_service()`` (the agent's :class:`ClusterHooks`)."""

    def __init__(
        self,
        service: CacheService,
        settings: Settings,
        *,
        api_client: Any = None,
        topology: Any = "discover",
        cluster: ClusterSettings | None = None,
        environ: Mapping[str, str] | None = None,
        free_gpus: FreeGpuSource | None = None,
        hooks: ClusterHooks | None = None,
    ) -> None:
        import os

        self.service = service
        self.settings = settings
        self.node_name = settings.node_name
        self.cluster = cluster or ClusterSettings.from_env(os.environ if environ is None else environ)
        self.hooks = hooks or ClusterHooks(settings, self.cluster)
        self._api_client = api_client
        self._topology_source = topology
        self._topology_json: str | None = None
        self._gpu_count: int | None = None
        self._topology: Any = None
        self._free_gpu_source = free_gpus
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._tasks: dict[str, list[DatasetRequest]] = {}  # pod UID -> what the agent submitted
        # Pods left to their init-container for good (Secrets, malformed data): a pod's
        # spec does not change, so its many status updates need not resolve it again.
        self._left_to_init: set[str] = set()
        self._reading: dict[str, frozenset[tuple[str, str]]] = {}  # pod UID -> Datasets it names
        self._background: list[asyncio.Task[Any]] = []
        self._watch: PodWatch | None = None
        self._annotations: dict[str, str] | None = None  # what the Node carries, as last seen
        interval = self.cluster.publish_interval
        self._cache_writes: Coalescer[dict[str, str]] = Coalescer(interval, self.cluster.publish_heartbeat)
        self._node_writes: Coalescer[dict[str, str]] = Coalescer(interval)
        self._cache_status: dict[str, Any] | None = None  # the NodeCache's status as last written
        self.write_metrics = StateWriteMetrics(getattr(service, "metrics", None))
        self.clock = time.monotonic  # the coalescers' clock (tests move it)
        self.patches = 0  # writes of the NodeCache and the Node together
        self.released: list[str] = []  # pod UIDs whose tasks were released, oldest first
        self.pod_events: PodEvents | None = None  # the pods' Events, once the API client is there

    # -- life cycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Start watching and publishing in the background; never blocks on the API server."""
        if not self.node_name:
            raise InvalidInput(
                "cluster mode needs the node's name", hint="set DSAGENT_NODE_NAME (downward API: spec.nodeName)"
            )
        from kubernetes import client

        from dsagent.kube import apiclient

        if self.service.hooks != self.hooks.for_service():
            raise InvalidInput(
                "cluster mode: the cache service was built without the cluster agent's hooks"
                " (pod task ids would not be checked)",
                hint="CacheService(settings, hooks=cluster_hooks.for_service()), the same ClusterHooks as the agent's",
            )
        self._loop = asyncio.get_running_loop()
        if self._api_client is None:
            self._api_client = await asyncio.to_thread(apiclient.load)
        self._core = client.CoreV1Api(self._api_client)
        self._custom = client.CustomObjectsApi(self._api_client)
        self._state = NodeStateApi(self._core, self._custom, self.node_name)
        self._datasets = DatasetClient(self._api_client)
        self.pod_events = PodEvents(
            EventRecorder(self._api_client, controller=EVENTS_CONTROLLER, instance=self.node_name), self.node_name
        )
        await self._check_node()
        self._watch = PodWatch(
            self._api_client, self.node_name, self._from_thread, timeout_seconds=self.cluster.watch_timeout
        )
        self.hooks.connect(self._watch, self._core, self._tasks)
        self._watch.start()
        self._background = [
            asyncio.create_task(self._consume(), name="dsagent-kube-pods"),
            asyncio.create_task(self._publish_forever(), name="dsagent-kube-publish"),
            asyncio.create_task(self._renew_forever(), name="dsagent-kube-renew"),
            asyncio.create_task(self._release_stale_tasks(), name="dsagent-kube-stale"),
            asyncio.create_task(self.pod_events.run_forever(self.service.get_task), name="dsagent-kube-pod-events"),
        ]
        if self.cluster.copies_configmap is not None:
            self._background.append(asyncio.create_task(self._copies_forever(), name="dsagent-kube-copies"))
        log.info(
            "cluster mode on node %s: watching its pods, publishing every %.0fs",
            self.node_name,
            self.cluster.publish_interval,
        )

    async def _check_node(self) -> None:
        """Fail fast on a wrong node name; an unreachable API server is retried later."""
        try:
            self._annotations = await asyncio.to_thread(self._state.read_annotations)
        except NotFound:
            raise InvalidInput(
                f"cluster mode: there is no node {self.node_name!r}",
                hint="set DSAGENT_NODE_NAME from the downward API (fieldRef spec.nodeName); "
                "the pod's hostname is not the node's name",
            ) from None
        except DsagentError as exc:
            log.warning("cannot read node %s yet (%s); retrying in the background", self.node_name, exc)

    async def stop(self) -> None:
        """Stop publishing and watching, and empty the ``NodeCache`` and remove the Node
        annotation, all within ``stop_timeout``: each is one merge patch that needs no read,
        retried while the API server hangs or fails, and never waited on past the bound;
        the blocking calls run in daemon threads, so a hung request cannot hold up the
        process's exit either."""
        deadline = time.monotonic() + self.cluster.stop_timeout
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        watch = self._watch
        stopping = (
            asyncio.ensure_future(in_daemon_thread(lambda: watch.stop(timeout=self.cluster.stop_timeout)))
            if watch is not None
            else None
        )
        if not await self._clear_annotations(deadline):
            log.warning(
                "could not clear the annotations of node %s within %.0f s; the controller stops using"
                " its inventory once it is older than its bound",
                self.node_name,
                self.cluster.stop_timeout,
            )
        if stopping is not None:
            # The annotations are what must not outlive the agent; the watch only reads, on a
            # daemon thread. A watch stuck in a request that has no response yet (a hung list
            # or reconnect) cannot be interrupted, so it gets a short grace, not the rest of
            # the bound: a stop must not take the whole bound when only reads hang.
            grace = min(WATCH_STOP_GRACE, max(0.0, deadline - time.monotonic()))
            try:
                await asyncio.wait_for(stopping, grace)
            except asyncio.TimeoutError:
                log.warning("the pod watch of node %s did not stop in time; leaving it behind", self.node_name)
        self.hooks.disconnect()

    # -- pods -------------------------------------------------------------------------

    def _from_thread(self, kind: str, pod: dict[str, Any]) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._events.put_nowait, (kind, pod))

    async def _consume(self) -> None:
        while True:
            kind, pod = await self._events.get()
            try:
                await self.handle_pod(kind, pod)
            except Exception:  # one bad pod must not stop the loop
                log.exception("handling %s of pod %s failed", kind, (pod.get("metadata") or {}).get("name"))

    async def handle_pod(self, kind: str, pod: dict[str, Any]) -> None:
        """React to one pod event: cache at bind time, release at the end."""
        uid = pod_uid(pod)
        if not uid or not wants_datasets(pod):
            return
        self._tell_reading(uid, frozenset() if kind == "DELETED" else datasets_read(pod))
        if kind == "DELETED" or has_ended(pod):
            await self._release(uid, pod_name(pod))
            return
        if uid in self._tasks or uid in self._left_to_init:
            return
        requests = await self._requests_for(pod)
        if requests is None:
            return
        name = pod_name(pod)
        try:
            record = await self.service.submit_task(uid, requests)
        except DsagentError as exc:
            log.warning("could not start caching for pod %s: %s", name, exc)
            return
        self._tasks[uid] = list(requests)
        if self.pod_events is not None:
            self.pod_events.watch(uid, pod)
        log.info(
            "pod %s bound to %s: caching %s (%s)",
            name,
            self.node_name,
            ", ".join(r.name for r in requests),
            record.state,
        )
        if self.pod_events is not None:
            await self.pod_events.tell(uid, record)

    def _tell_reading(self, uid: str, names: frozenset[tuple[str, str]]) -> None:
        """The stripe shares the node's running pods read from local disk are in use: an
        eviction leaves them, and they age for its LRU order only once those pods end."""
        if self._note_reading(uid, names):
            self.service.stripes.read_by(frozenset().union(*self._reading.values()))

    def _note_reading(self, uid: str, names: frozenset[tuple[str, str]]) -> bool:
        """Record the Datasets pod ``uid`` reads (none: it reads nothing); True when that changed."""
        if self._reading.get(uid, frozenset()) == names:
            return False
        if names:
            self._reading[uid] = names
        else:
            self._reading.pop(uid, None)
        return True

    async def _requests_for(self, pod: Mapping[str, Any]) -> list[DatasetRequest] | None:
        init = init_container(pod)
        if init is None and init_container(pod, STRIPE_WAIT_CONTAINER) is not None:
            # every dataset it names is striped and read from the node's shares, which the
            # controller holds (docs/design-striping.md#start): no whole copy, no task
            log.info("pod %s reads striped versions only: no task", pod_name(pod))
            self._left_to_init.add(pod_uid(pod))
            return None
        if init is not None:
            try:
                requests = requests_from_init_container(init)
            except (InvalidInput, ValueError, KeyError, TypeError):
                log.warning("pod %s: its init-container's DSAGENT_DATASETS is malformed", pod_name(pod))
                self._left_to_init.add(pod_uid(pod))
                return None
            if requests is None:
                log.info(
                    "pod %s needs storage credentials from Secrets: its init-container starts the caching",
                    pod_name(pod),
                )
                self._left_to_init.add(pod_uid(pod))
                return None
            return requests
        try:
            refs = podannotations.datasets_of(pod)
        except platform_errors.InvalidInput as exc:  # the agent's and the wire contract's
            log.warning("pod %s: %s", pod_name(pod), exc)
            self._left_to_init.add(pod_uid(pod))
            return None
        namespace = (pod.get("metadata") or {}).get("namespace") or "default"
        requests = []
        shares = []
        for ref in refs:
            if ref.source is not None:
                requests.append(
                    DatasetRequest(ref.name, ref.source, ref.bundles, ref.storage_options, allow_per_file=True)
                )
                continue
            try:
                dataset = await asyncio.to_thread(self._datasets.get, namespace, ref.name)
            except DsagentError as exc:
                log.warning("pod %s: cannot resolve dataset %s: %s", pod_name(pod), ref.name, exc)
                return None
            if dataset.share_read(ref.digest) is not None:
                # read from the node's stripe share, which the controller holds (a CSI
                # volume shows it): never a whole copy (docs/design-striping.md#csi)
                shares.append(ref.name)
                continue
            if dataset.storage_secret is not None:
                log.info(
                    "pod %s: dataset %s needs its Secret; the init-container starts the caching",
                    pod_name(pod),
                    ref.name,
                )
                self._left_to_init.add(pod_uid(pod))
                return None
            requests.append(
                DatasetRequest(
                    ref.name, dataset.source, ref.bundles or dataset.bundles, ref.storage_options, allow_per_file=True
                )
            )
        if shares and not requests:
            log.info("pod %s reads striped versions only (%s): no task", pod_name(pod), ", ".join(shares))
            self._left_to_init.add(pod_uid(pod))
        return requests or None

    async def _release(self, uid: str, name: str) -> None:
        self._tasks.pop(uid, None)  # first, so the renewal loop stops renewing it
        if self.pod_events is not None:
            self.pod_events.forget(uid)
        self._left_to_init.discard(uid)
        self.released.append(uid)
        try:
            await self.service.release_task(uid)
        except NotFound:
            return  # never submitted (or already released)
        log.info("pod %s ended: released its datasets", name)

    async def _release_stale_tasks(self) -> None:
        """Once the first pod list is in, tell the stripe shares which Datasets the node's
        pods name, and release pod tasks whose pods are gone.

        Pods deleted while the agent itself was down send no DELETED event to this
        process; without this their datasets would stay in use until the lease lapses.
        """
        watch = self._watch
        assert watch is not None
        while not watch.synced.is_set():  # polled, not waited on a thread: stop() cancels it
            await asyncio.sleep(0.1)
        for uid, pod in watch.pods().items():  # told once for all of them, not once a pod
            self._note_reading(uid, datasets_read(pod))
        self.service.stripes.read_by(frozenset().union(*self._reading.values()))
        for task_id in await self.service.task_ids():
            if is_pod_uid(task_id) and not watch.has_pod(task_id):
                await self._release(task_id, f"with UID {task_id} (gone while the agent was down)")

    async def _renew_forever(self) -> None:
        """Keep running pods' datasets in use: repeating a request renews its lease."""
        interval = self.cluster.renew_interval or max(1.0, self.settings.lease_ttl / 3)
        while True:
            await asyncio.sleep(interval)
            for uid, requests in list(self._tasks.items()):
                if uid not in self._tasks:  # released meanwhile: never bring it back
                    continue
                try:
                    await self.service.submit_task(uid, requests)
                except DsagentError as exc:
                    log.warning("renewing task %s failed: %s", uid, exc)

    # -- the Node's annotations -------------------------------------------------------

    async def _publish_forever(self) -> None:
        await self._load_topology()
        while True:
            try:
                await self.publish_once()
            except DsagentError as exc:
                log.warning("publishing to node %s failed: %s", self.node_name, exc)
                self._forget_published()
            except Exception:
                log.exception("publishing to node %s failed", self.node_name)
                self._forget_published()
            await asyncio.sleep(self._next_publish_s())

    def _forget_published(self) -> None:
        self._annotations = None  # read the Node again next time
        self._cache_writes.forget()
        self._node_writes.forget()

    def _next_publish_s(self) -> float:
        """The poll interval, or sooner when a state held back by its interval is due."""
        now = self.clock()
        waits = [w for w in (self._cache_writes.wait_s(now), self._node_writes.wait_s(now)) if w is not None]
        return min([self.cluster.publish_interval, *waits]) if waits else self.cluster.publish_interval

    async def publish_once(self) -> bool:
        """Write what changed (the ``NodeCache``, the Node's free-GPU and follow-up annotations), each at most
        once per publish interval (docs/design.md#node-state); True when it wrote."""
        state = publisher.node_state(await self.service.inventory(), self._topology_json)
        desired = publisher.node_annotations(await self._current_free_gpus(), self._follow_ups())
        if self._annotations is None:
            self._annotations = await asyncio.to_thread(self._state.read_annotations)
        wrote = False
        now = self.clock()
        if self._cache_writes.due(state, now):
            status = nodecache.status(state.get("inventory"), state.get("topology"), format_time(time.time()))
            size = await asyncio.to_thread(self._state.write_nodecache, status, self._cache_status)
            self._cache_writes.wrote(state, now)
            self._cache_status = status
            self.write_metrics.wrote("nodecache", size)
            wrote = True
        patch = publisher.annotation_patch(self._annotations, desired)
        if patch is not None and self._node_writes.due(desired, now):
            await asyncio.to_thread(self._state.patch_annotations, patch)
            self._node_writes.wrote(desired, now)
            self._annotations = publisher.applied(self._annotations, patch)
            self.write_metrics.wrote("node", len(json.dumps({"metadata": {"annotations": patch}})))
            wrote = True
        self.patches += wrote
        return wrote

    async def _current_free_gpus(self) -> list[int] | None:
        """The kubelet's answer (pod-resources) when there is one, else the estimate."""
        if self._free_gpu_source is not None and self._topology is not None:
            try:
                found = await self._free_gpu_source(self._topology)
            except DsagentError as exc:
                log.debug("pod-resources gave no free GPUs (%s); estimating from pods", exc)
            else:
                if found is not None:
                    return sorted(found)
        return self._free_gpus()

    def _follow_ups(self) -> list[str]:
        """The namespaces of the node's running pods that name their follow-up job (none
        until the pods are listed)."""
        if self._watch is None or not self._watch.synced.is_set():
            return []
        return publisher.follow_ups(p for p in self._watch.pods().values() if not has_ended(p))

    def _free_gpus(self) -> list[int] | None:
        pods = self._watch.pods().values() if self._watch is not None and self._watch.synced.is_set() else None
        if pods is None:
            return None
        gpu_names = GpuResources(prefix=self.settings.resource_prefix)
        gpu_pods = sum(1 for p in pods if not has_ended(p) and publisher.gpu_request(p, gpu_names) > 0)
        return publisher.free_gpus(self._gpu_count, gpu_pods)

    # -- the cluster's copy counts (docs/design.md#cluster-eviction) ------------------

    async def _copies_forever(self) -> None:
        while True:
            try:
                await self.read_copies()
            except DsagentError as exc:
                log.debug("reading the copy counts failed: %s", exc)
            except Exception:
                log.exception("reading the copy counts failed")
            await asyncio.sleep(self.cluster.copies_interval)

    async def read_copies(self) -> bool:
        """Read the controller's counts into the service; True when they were taken."""
        from dsplatform.wire.copycounts import DATA_KEY, parse_copies

        assert self.cluster.copies_configmap is not None
        namespace, _, name = self.cluster.copies_configmap.partition("/")

        def read() -> Any:
            with translated(f"read configmap {namespace}/{name}"):
                return self._core.read_namespaced_config_map(name, namespace, _request_timeout=10)

        configmap = await asyncio.to_thread(read)
        parsed = parse_copies((configmap.data or {}).get(DATA_KEY))
        if parsed is None:
            log.warning("ConfigMap %s/%s holds no copy counts this agent can read", namespace, name)
            return False
        self.service.node.copies.update(parsed.counts, parsed.at, parsed.keepers, self.node_name)
        return True

    async def _clear_annotations(self, deadline: float) -> bool:
        """Empty this agent's ``NodeCache`` and remove what it published on its Node, retrying
        until ``deadline`` (``time.monotonic()``); True once both are done."""
        patch = publisher.blind_clearing_patch()
        pause = 0.1
        cache_cleared = False
        while (left := deadline - time.monotonic()) > 0:
            try:
                if not cache_cleared:
                    clear = functools.partial(self._state.clear_nodecache, timeout=min(left, 3.0))
                    await asyncio.wait_for(in_daemon_thread(clear), left)
                    cache_cleared = True
                    left = deadline - time.monotonic()
                call = functools.partial(self._state.patch_annotations, patch, timeout=min(max(left, 0.1), 3.0))
                await asyncio.wait_for(in_daemon_thread(call), max(left, 0.1))
                self._annotations = publisher.applied(self._annotations, patch)
                return True
            except (asyncio.TimeoutError, DsagentError) as exc:
                log.info("clearing the annotations of node %s: %s; retrying", self.node_name, exc or "timed out")
            await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 1.0)
        return False

    async def _load_topology(self) -> None:
        source = self._topology_source
        if source is None:
            return
        try:
            topology = (
                await asyncio.to_thread(_discover, self.settings.discovery_options) if source == "discover" else source
            )
        except Exception as exc:  # no GPU, no nvidia-smi: publish without topology
            log.info("no GPU topology on node %s (%s); publishing the inventory only", self.node_name, exc)
            return
        self._topology_json = publisher.topology_json(topology, self.settings.roce_classes, self.node_name)
        self._topology = topology
        self._gpu_count = len(topology.gpus)


def _discover(options: dict[str, Any] | None = None) -> Any:
    from gpu_topology import discover

    return discover(options=options)


__all__ = ["ClusterAgent", "ClusterSettings"]
