"""The agent's Prometheus metrics, kept by ``prometheus_client``.

Who calls it: :mod:`dsagent.cache.service` (every cache request's outcome, by error code),
:mod:`dsagent.cache.versions` (hits, misses, fetch results, durations and sizes) and
:mod:`dsagent.cache.space` (evictions by reason) record events as they happen;
``GET /metrics`` (:mod:`dsagent.api.routes`) calls :meth:`Metrics.render`, which also
sets the gauges the service reports (free, used and capacity bytes, dataset versions by
state, tasks by state).

Each service instance has a registry of its own, never the process-global one (tests run
several agents in one process, and each must show only its own counts): the platform's
:class:`dsplatform.metrics.MetricSet`, which also names the metrics and writes the
exposition text (``prometheus_client``'s, which shows a labelled series from the start,
so failures by a code not yet seen are visible).

The metrics (all prefixed ``dsplatform_agent_``, docs/design.md#metrics):

- ``dataset_requests_total{code}``: every dataset a task asked for, once it settled: ``ok`` or
  the error code the API answers with (``not_found``, ``source_unavailable``...). A
  request refused before any work (bad input, unknown task) counts too.
- ``cache_hits_total`` / ``cache_misses_total``: the hit ratio's inputs.
- ``fetches_total{result}``: finished fetches, ``ok`` or the error code.
- ``fetch_duration_seconds`` and ``fetch_size_bytes``: histograms of successful fetches;
  ``fetched_bytes_total``: every byte written into the cache.
- ``evictions_total{reason}`` and ``evicted_bytes_total{reason}``.
- ``link_bytes_total{link,source}`` and ``link_failures_total{link}``: what each link of
  ``DSAGENT_FETCH_LINKS`` carried (from a ``peer`` or the ``store``), and the links set aside
  mid-fetch (docs/design.md#links); ``link_ranges_total{link}`` and
  ``link_range_bytes_total{link}``: the byte ranges of one bundle fetched from the store over
  several links (:mod:`dsagent.cache.fetchranges`) each link finished, and their compressed bytes.
- ``catalog_rebuilds_total`` and ``catalog_rebuild_versions_total{result}`` (``kept`` /
  ``discarded``): a damaged catalog kept aside and rebuilt from the cache directory
  (docs/design.md#catalog-rebuild).
- gauges ``free_bytes``, ``used_bytes``, ``capacity_bytes``, ``datasets{state}`` and
  ``tasks{state}`` (``active``: still working or ready; ``failed``: a dataset failed and no
  work remains; failed tasks are not active).
- ``http_request_duration_seconds{method,route,status}``: every API request, by its route's
  template (``/v1/tasks/{task_id}``, ``unmatched`` for none: a bounded label), timed by
  :class:`dsagent.api.timing.RouteTiming`; a ``PUT /v1/tasks`` with ``wait`` includes the wait.
- ``store_request_duration_seconds{protocol}`` and ``store_errors_total{protocol,code}``:
  each object the agent opens in a source or bundle store (a manifest, a bundle, a file of a
  per-file copy), heard through :func:`dsagent.format.storage.add_store_observer`; the
  duration is the open (up to the first byte or the object's metadata), the code the error
  the open failed with (``not_found``, ``storage_credentials``, ``source_unavailable``...).
- ``operator_requests_total{action,namespace,status}``: every admin-token request that pins
  (``pin``), releases (``release``) or evicts (``evict``), by the namespace of the Dataset it
  names (``-``: none, an operator by hand) and the status answered (docs/operator-guide/tenancy.md); the
  same request is the agent's ``audit`` log line. ``namespace_refusals_total{namespace}``:
  pins refused because the namespace holds its share of the cache. The namespace label is
  bounded by the cluster's namespaces, and only the controller (the admin token) sets it.
- ``stripe_reader_bytes_total{source}``: bytes of the striped bundles this node's readers
  opened (the reader's streams, :meth:`dsagent.cache.striped.stripes.StripeShares.open_bundle`),
  by where each was: ``share`` (this node's own disk) or ``window`` (another member's bundle,
  fetched for the reader). Their ratio is what a striped Dataset reads locally on the node
  (a whole copy is read from local disk by the pod's mount, and not counted here).
- ``native_loops``: 1 when the native digest, pack and unpack loops run (built, and not
  switched off by ``DSAGENT_NATIVE``; docs/design-native.md), 0 when the pure-Python loops run.
- ``build_info{version}`` = 1.

Series an alert or a ratio reads exist (at 0) before their first event: the ``ok`` codes,
evictions by reason, peer bytes by direction, dataset and task states, and the store
series of every protocol the agent allows (``DSAGENT_PROTOCOLS``). The HTTP histogram's
``status`` cannot be known ahead, so its series appear with each route's first request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from dsagent import __version__
from dsagent.errors import DsagentError
from dsagent.format import native as native_loops
from dsplatform.metrics import CONTENT_TYPE, MetricSet

# 1 ms .. ~4.5 h: a small file from a local disk to a multi-terabyte bundle set
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600)
# 1 KiB .. 10 TiB by factors of ~10
SIZE_BUCKETS = tuple(float(1024 * 10**i) for i in range(11))
# 1 ms .. 15 min: a /healthz to a task request that waits for its datasets
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
# 1 ms .. 2 min: one object opened in a store (connect timeouts are 10-60 s)
STORE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

_GAUGE_STATES = ("ready", "fetching", "failed")
#: where a striped bundle a reader opened was (``stripe_reader_bytes_total{source}``)
STRIPE_READ_SOURCES = ("share", "window")
#: Reasons :mod:`dsagent.cache.space` evicts for (``operator``: ``dsctl evict`` by name).
EVICTION_REASONS = ("space", "superseded", "idle", "operator")


def error_code(exc: BaseException) -> str:
    """The label an exception is counted under: the API's error code, ``cancelled`` for a
    cancelled fetch, ``internal`` for anything not raised on purpose."""
    if isinstance(exc, DsagentError):
        return exc.code
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    return "internal"


class Metrics(MetricSet):
    """The metrics of one agent, in a registry of their own."""

    def __init__(self, *, version: str = __version__, protocols: Iterable[str] = ()) -> None:
        super().__init__("agent", version)
        self.requests = self.counter(
            "dataset_requests", "Dataset requests settled, by outcome: ok or the error code.", "code"
        )
        self.hits = self.counter("cache_hits", "Dataset requests served by a ready, digest-matching cached copy.")
        self.misses = self.counter("cache_misses", "Dataset requests that needed a fetch.")
        self.fetches = self.counter("fetches", "Finished fetches, by result: ok or the error code.", "result")
        self.fetch_seconds = self.histogram(
            "fetch_duration_seconds", "Seconds a successful fetch took.", buckets=DURATION_BUCKETS
        )
        self.fetch_size = self.histogram("fetch_size_bytes", "Bytes of each successful fetch.", buckets=SIZE_BUCKETS)
        self.fetched_bytes = self.counter("fetched_bytes", "Bytes written into the cache by fetches.")
        self.evictions = self.counter("evictions", "Dataset versions evicted, by reason.", "reason")
        self.evicted_bytes = self.counter("evicted_bytes", "Bytes freed by evictions, by reason.", "reason")
        self.peer_bytes = self.counter(
            "peer_bytes", "Bundle bytes (compressed) served to and fetched from peer agents, by direction.", "direction"
        )
        self.link_bytes = self.counter(
            "link_bytes",
            "Bundle bytes (unpacked) fetched over each link of DSAGENT_FETCH_LINKS, by link address and source.",
            "link",
            "source",
        )
        self.link_ranges = self.counter(
            "link_ranges",
            "Byte ranges of one bundle read from the store over each link of DSAGENT_FETCH_LINKS, by link address.",
            "link",
        )
        self.link_range_bytes = self.counter(
            "link_range_bytes",
            "Bundle bytes (compressed) of byte ranges read from the store over each link, by link address.",
            "link",
        )
        self.link_failures = self.counter(
            "link_failures",
            "Links set aside for the rest of a version's fetch: one failed where another delivered.",
            "link",
        )
        self.catalog_rebuilds = self.counter(
            "catalog_rebuilds", "Times the catalog was found damaged, kept aside and rebuilt from the cache directory."
        )
        self.rebuilt_versions = self.counter(
            "catalog_rebuild_versions",
            "Ready versions found on disk by a catalog rebuild, by result: kept (verified) or discarded.",
            "result",
        )
        self.free_bytes = self.gauge(
            "free_bytes", "Bytes free for the cache (after reservations and the capacity limit)."
        )
        self.used_bytes = self.gauge("used_bytes", "Bytes held by cached dataset versions.")
        self.capacity_bytes = self.gauge("capacity_bytes", "Bytes the cache may use.")
        self.native_loops = self.gauge(
            "native_loops", "1 when the native digest, pack and unpack loops are loaded, 0 for the pure-Python ones."
        )
        self.native_loops.set(1 if native_loops.AVAILABLE else 0)
        self.datasets = self.gauge("datasets", "Cached dataset versions, by state.", "state")
        self.tasks = self.gauge(
            "tasks", "Tasks held, by state (active: working or ready; failed: no work left, a dataset failed).", "state"
        )
        self.http_seconds = self.histogram(
            "http_request_duration_seconds",
            "Seconds an API request took, by method, route template and status.",
            "method",
            "route",
            "status",
            buckets=HTTP_BUCKETS,
        )
        self.store_seconds = self.histogram(
            "store_request_duration_seconds",
            "Seconds opening one object in a source or bundle store took, by protocol.",
            "protocol",
            buckets=STORE_BUCKETS,
        )
        self.store_errors = self.counter(
            "store_errors",
            "Objects a source or bundle store failed to open, by protocol and error code.",
            "protocol",
            "code",
        )
        self.operator_requests = self.counter(
            "operator_requests",
            "Admin-token requests that pin, release or evict, by action, the Dataset's namespace and status.",
            "action",
            "namespace",
            "status",
        )
        self.stripe_reader_bytes = self.counter(
            "stripe_reader_bytes",
            "Bytes of striped bundles this node's readers opened, by where each was: share (this node's disk) "
            "or window (another member's, fetched for the reader).",
            "source",
        )
        self.namespace_refusals = self.counter(
            "namespace_refusals",
            "Pins refused because the namespace holds its share of this node's cache.",
            "namespace",
        )
        for state in _GAUGE_STATES:
            self.datasets.labels(state=state)
        for state in ("active", "failed"):
            self.tasks.labels(state=state)
        self.requests.labels(code="ok")
        self.fetches.labels(result="ok")
        for direction in ("served", "fetched"):  # visible (0) before the first transfer
            self.peer_bytes.labels(direction=direction)
        for source in STRIPE_READ_SOURCES:  # a local-read ratio has both terms from the start
            self.stripe_reader_bytes.labels(source=source)
        for protocol in protocols:  # per-protocol panels and alerts see every allowed store at 0
            self.store_seconds.labels(protocol=protocol)
            self.store_errors.labels(protocol=protocol, code="source_unavailable")
        for reason in EVICTION_REASONS:  # the cache-full alert reads reason="space"
            self.evictions.labels(reason=reason)
            self.evicted_bytes.labels(reason=reason)

    # -- events ---------------------------------------------------------------------

    def request_settled(self, code: str) -> None:
        self.requests.labels(code=code).inc()

    def hit(self) -> None:
        self.hits.inc()

    def miss(self) -> None:
        self.misses.inc()

    def fetch_failed(self, code: str) -> None:
        self.fetches.labels(result=code).inc()

    def fetch_succeeded(self, seconds: float, size_bytes: int) -> None:
        self.fetches.labels(result="ok").inc()
        self.fetch_seconds.observe(seconds)
        self.fetch_size.observe(size_bytes)

    def bytes_fetched(self, size_bytes: int) -> None:
        self.fetched_bytes.inc(size_bytes)

    def peer_transfer(self, direction: str, size_bytes: int) -> None:
        """``direction``: ``served`` (to another agent) or ``fetched`` (from one)."""
        self.peer_bytes.labels(direction=direction).inc(size_bytes)

    def stripe_read(self, source: str, size_bytes: int) -> None:
        """A striped bundle a reader opened: ``source`` ``share`` (this node's) or ``window``."""
        self.stripe_reader_bytes.labels(source=source).inc(size_bytes)

    def link_transfer(self, link: str, source: str, size_bytes: int) -> None:
        """A bundle fetched over ``link`` (a local address) from a ``peer`` or the ``store``."""
        self.link_bytes.labels(link=link, source=source).inc(size_bytes)

    def link_range(self, link: str, compressed_bytes: int, ranges: int) -> None:
        """Byte ranges of a bundle read over ``link``: ``compressed_bytes`` carried, ``ranges`` finished."""
        self.link_range_bytes.labels(link=link).inc(compressed_bytes)
        if ranges:
            self.link_ranges.labels(link=link).inc(ranges)

    def http_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.http_seconds.labels(method=method, route=route, status=str(status)).observe(seconds)

    def store_request(self, protocol: str, seconds: float, code: str | None) -> None:
        """A :data:`dsagent.format.storage.StoreObserver`: one object opened, or failed to."""
        self.store_seconds.labels(protocol=protocol).observe(seconds)
        if code is not None:
            self.store_errors.labels(protocol=protocol, code=code).inc()

    def catalog_rebuilt(self, kept: int, discarded: int) -> None:
        self.catalog_rebuilds.inc()
        self.rebuilt_versions.labels(result="kept").inc(kept)
        self.rebuilt_versions.labels(result="discarded").inc(discarded)

    def operator_request(self, action: str, namespace: str, status: int) -> None:
        self.operator_requests.labels(action=action, namespace=namespace, status=str(status)).inc()

    def namespace_refusal(self, namespace: str) -> None:
        self.namespace_refusals.labels(namespace=namespace).inc()

    def evicted(self, reason: str, size_bytes: int) -> None:
        self.evictions.labels(reason=reason).inc()
        self.evicted_bytes.labels(reason=reason).inc(size_bytes)

    # -- reading --------------------------------------------------------------------

    def set_gauges(self, space: dict[str, int], dataset_states: Iterable[str], tasks_by_state: dict[str, int]) -> None:
        self.free_bytes.set(space["freeBytes"])
        self.used_bytes.set(space["usedBytes"])
        self.capacity_bytes.set(space["capacityBytes"])
        states = list(dataset_states)
        for state in _GAUGE_STATES:
            self.datasets.labels(state=state).set(sum(1 for s in states if s == state))
        for state, count in tasks_by_state.items():
            self.tasks.labels(state=state).set(count)

    def render(self) -> str:  # type: ignore[override]  # the API answers text
        return super().render().decode()


__all__ = ["CONTENT_TYPE", "Metrics", "error_code"]
