"""The agent's settings: read once at start-up from ``DSAGENT_*`` variables and flags.

Who calls it: ``dsagent serve`` (flags override the environment), ``dsctl`` (only to find
the agent's socket and token), and tests (which build :class:`Settings` directly; building
one reads no environment).
What it owns: the one typed, validated view of configuration, a pydantic-settings object
(:class:`dsplatform.settings.EnvSettings`). Sizes and durations use the platform's one
syntax (:mod:`dsplatform.units`). Every bad value is reported at once: :meth:`Settings.from_env`
raises one :class:`SettingsError` naming each bad variable, its value and what a good one
looks like, so a misconfigured DaemonSet fails at start-up with one clear line, never later.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BeforeValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import NoDecode, SettingsConfigDict

from dsagent.envsettings import ENV_PREFIX, AgentLogSettings, check_token, default_root, parse_listen
from dsagent.errors import InvalidInput
from dsagent.format import egress, sources
from dsagent.format.egress import EgressPolicy, check_headers
from dsagent.format.sources import ALIASES, SourcePolicy
from dsagent.format.storagesettings import StorageSettings
from dsagent.policy.eviction import EVICT_RATIO
from dsplatform.gpus import RESOURCE_PREFIX
from dsplatform.settings import Flag, OptionalGpuResource, ResourcePrefix, Switch, UnitShare, read_secret_file
from dsplatform.units import Duration, Size, parse_size


def _paths(text: str | tuple[Path, ...] | list[Any]) -> tuple[Path, ...]:
    if isinstance(text, str):
        return tuple(Path(p) for p in text.split(os.pathsep) if p)
    return tuple(Path(p) for p in text)


def _whole(text: str | int) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ValueError(f"expected a whole number, got {text!r}") from None


def _env(name: str, field: str) -> Any:
    """The field's variable is ``DSAGENT_<name>``; its own name still works as a keyword."""
    return AliasChoices(field, ENV_PREFIX + name)


Listen = Annotated[
    tuple[str, int] | None, NoDecode, BeforeValidator(lambda v: parse_listen(v) if v not in (None, "") else None)
]
Paths = Annotated[tuple[Path, ...], NoDecode, BeforeValidator(_paths)]
Protocols = Annotated[
    tuple[str, ...],
    NoDecode,
    BeforeValidator(
        lambda v: tuple(p.strip().lower() for p in v.split(",") if p.strip()) if isinstance(v, str) else tuple(v)
    ),
]
Whole = Annotated[int, BeforeValidator(_whole)]
#: comma-separated words (ranges, addresses, host names), kept as given
Words = Annotated[
    tuple[str, ...],
    NoDecode,
    BeforeValidator(lambda v: tuple(w.strip() for w in v.split(",") if w.strip()) if isinstance(v, str) else tuple(v)),
]


def parse_share(text: str | int | float) -> float | int:
    """A share of the disk: ``"15%"`` -> 0.15 (a fraction), else a size (``"100Gi"`` -> bytes)."""
    if isinstance(text, float) and 0 <= text < 1:  # already a fraction (the default, or a copy)
        return text
    value = str(text).strip()
    if value.endswith("%"):
        try:
            fraction = float(value[:-1]) / 100
        except ValueError:
            fraction = math.nan
        if not 0 <= fraction < 1:
            raise ValueError(f"a percentage must be between 0% and 99%, got {text!r}")
        return fraction
    return parse_size(value)


Share = Annotated[float | int, NoDecode, BeforeValidator(parse_share)]

#: The kubelet's default hard eviction threshold ``nodefs.available<10%``.
KUBELET_NODEFS_AVAILABLE = "10%"
#: Headroom kept above the kubelet's threshold in cluster mode unless DSAGENT_RESERVE says otherwise.
DEFAULT_RESERVE = "15%"


def _urls(text: str | tuple[str, ...] | list[Any]) -> tuple[str, ...]:
    items = [p.strip() for p in text.split(",")] if isinstance(text, str) else [str(p).strip() for p in text]
    urls = tuple(u.rstrip("/") for u in items if u)
    for url in urls:
        if not re.fullmatch(r"https?://[^/\s]+", url):
            raise ValueError(f"invalid peer {url!r} (use http://HOST:PORT, comma-separated)")
    return urls


def _proxies(text: str | dict[str, str]) -> dict[str, str]:
    """``STORE=PROXY`` pairs, comma-separated: bundle downloads from a store whose URL starts
    with STORE go through the HTTP proxy PROXY (docs/design.md#peers)."""
    if isinstance(text, dict):
        pairs = list(text.items())
    else:
        pairs = []
        for item in (p.strip() for p in text.split(",")):
            if not item:
                continue
            store, sep, proxy = item.partition("=")
            if not sep:
                raise ValueError(f"invalid store proxy {item!r} (use STORE_URL=PROXY_URL)")
            pairs.append((store.strip(), proxy.strip()))
    for store, proxy in pairs:
        if not store or not re.fullmatch(r"https?://[^/\s]+/?", proxy):
            raise ValueError(f"invalid store proxy {store!r}={proxy!r} (the proxy is http://HOST:PORT)")
    return {store.rstrip("/"): proxy.rstrip("/") for store, proxy in pairs}


def _links(text: str | tuple[str, ...] | list[Any]) -> tuple[str, ...]:
    """``auto``, or local IP addresses, comma-separated: the links a fetch spreads over
    (docs/design.md#links); empty: the default route only."""
    items = [p.strip() for p in text.split(",")] if isinstance(text, str) else [str(p).strip() for p in text]
    links = tuple(dict.fromkeys(i for i in items if i))
    if "auto" in links:
        if len(links) > 1:
            raise ValueError("fetch links are either auto or a list of addresses, not both")
        return links
    for link in links:
        try:
            ipaddress.ip_address(link)
        except ValueError:
            raise ValueError(
                f"invalid fetch link {link!r} (use auto, or this node's NIC addresses, comma-separated)"
            ) from None
    return links


def _netns(text: str | None) -> str | None:
    """An absolute path (a network namespace's file), or empty for none."""
    if text is None or not str(text).strip():
        return None
    path = str(text).strip()
    if not path.startswith("/") or "\0" in path:
        raise ValueError(f"invalid network namespace {path!r} (an absolute path, e.g. /proc/1/ns/net)")
    return path


Peers = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_urls)]
NetnsPath = Annotated[str | None, NoDecode, BeforeValidator(_netns)]
FetchLinks = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_links)]
Proxies = Annotated[dict[str, str], NoDecode, BeforeValidator(_proxies)]


class Settings(StorageSettings, AgentLogSettings):
    """Everything the agent is configured with; build it with :meth:`from_env` or directly.

    Space: ``capacity_bytes`` caps the cache below the disk's own size (None: the disk), in
    disk use (a version's bytes plus its files' blocks and inodes, not logical bytes);
    ``evict_ratio`` is the eviction rule's ratio (:data:`dsagent.policy.eviction.EVICT_RATIO`,
    docs/design.md#eviction). Concurrency (docs/design.md#rule-6): ``max_fetches`` datasets cache at once, each with
    ``fetch_workers`` threads. Leases: a task's datasets stay in use for ``lease_ttl``
    seconds after its last request (repeat the request to renew).
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX)

    root: Path = Field(default_factory=default_root)
    socket_path: Path | None = Field(None, validation_alias=_env("SOCKET", "socket_path"))  # None: <root>/dsagent.sock
    listen: Listen = None
    admin_token: str | None = Field(None, repr=False)
    admin_token_file: Path | None = Field(None, repr=False)
    node_name: str = Field(default_factory=socket.gethostname)
    capacity_bytes: Size | None = Field(None, validation_alias=_env("CAPACITY", "capacity_bytes"))
    # Disk kept free, never filled by the cache: ``reserve`` + the kubelet's ``nodefs.available``
    # threshold (see :meth:`disk_floor`). None: 15% in cluster mode, nothing standalone.
    reserve: Share | None = None
    nodefs_available: Share = Field(0.10, validation_alias=_env("NODEFS_AVAILABLE", "nodefs_available"))
    evict_ratio: float = EVICT_RATIO
    # the most of this node's cache one namespace's controller pins (warm-up, replicas,
    # preparation: tasks whose request names their Dataset) may hold; 1: no limit (docs/operator-guide/tenancy.md)
    namespace_share: UnitShare = 1.0
    # what a namespace's new pin reserves of that share while its size is unknown (no version
    # from its source here, no manifest in its bundle store), at most the whole share, until
    # its version resolves and its real size takes the reservation's place
    namespace_unknown_bytes: Size = 10 << 30
    idle_ttl: Duration = 7 * 86400.0
    lease_ttl: Duration = 6 * 3600.0
    sweep_interval: Duration = 60.0
    max_fetches: Whole = 4
    # the most files a packed dataset's manifest may list: what one request can make the
    # agent hold is ~130 bytes a file; 2,000,000 is ~260 MB per fetch
    max_dataset_files: Whole = 2_000_000
    fetch_workers: Whole = 8
    max_body_bytes: Size = Field(1 << 20, validation_alias=_env("MAX_BODY", "max_body_bytes"))
    local_sources: Paths = ()  # local directories requests may name as sources
    # the source allowlist (dsagent.format.sources): protocols requests may name, and for
    # each the storage-option keys it accepts; decided before any filesystem is built
    protocols: Protocols = Field(default_factory=lambda: sources.DEFAULT_PROTOCOLS)
    storage_option_keys: dict[str, tuple[str, ...]] = Field(default_factory=lambda: dict(sources.DEFAULT_OPTION_KEYS))
    # where the agent may connect for a request (dsagent.format.egress): besides loopback,
    # link-local and the metadata servers, never these ranges (the cluster's pods and
    # services) unless allowed here (CIDRs, addresses or host names)
    egress_deny: Words = Field(default_factory=lambda: egress.DEFAULT_DENIED)
    egress_allow: Words = Field(default_factory=lambda: egress.DEFAULT_ALLOWED)
    proc_root: Path = Path("/proc")  # where callers' cgroups are read (pod identity); tests point it elsewhere
    stall_timeout: Duration = 120.0  # readiness fails when queued blocking work waits longer than this
    # the native digest, pack and unpack loops where they are built (docs/design-native.md#switch);
    # off: the pure-Python ones
    native: Flag = True
    kubernetes: Flag = False
    # the kubelet GPU+VF device plugin (docs/design.md#roce-allocation): on, off, or auto (cluster
    # mode: on where the node's RoCE NICs sit in two or more NUMA groups, dsagent.nodeagent.hardware)
    device_plugin: Switch = "off"
    resource_prefix: ResourcePrefix = RESOURCE_PREFIX  # resources <prefix>/gpu-roce<N> and <prefix>/gpu-all
    # how GPUs are cut into RoCE classes (numa, subnet, none; docs/design.md#roce-classes): one
    # field read by both the published topology (dsagent.nodeagent) and the device plugin (dsagent.nodeplugins)
    roce_classes: str = "numa"
    device_plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    device_plugin_node_label: str = ""  # cluster mode: serve only on nodes with <label>=true ("": every node)
    # the plain GPU resource the device plugin also serves, in NVIDIA's plugin's place, for the
    # pods no class was given ("": class resources only; the chart: gpuClasses.gpuResource)
    device_plugin_gpu_resource: OptionalGpuResource = ""
    # how long the device plugin waits for NVIDIA's to leave a node it takes over (the label
    # nvidia.com/gpu.deploy.device-plugin=false) before it gives up and stays off there
    device_plugin_handover: Duration = 120.0
    # what the device plugin advertises: gpus (by UUID; the container's one VF chosen at
    # Allocate) or pairs (the design's GPU/VF pairs, <uuid>_<VF PCI address>; the one VF is
    # its first pair's; docs/design.md#roce-allocation)
    device_plugin_devices: Literal["gpus", "pairs"] = "gpus"
    host_root: Path | None = None  # the cache root as the host (the kubelet) sees it; None: same as root
    sysfs_root: Path = Path("/")  # where the host's /sys and /dev/infiniband are seen (the chart: /host)
    # the node's side of the VFs (docs/design.md#roce-allocation), both off by default:
    # sriov_numvfs of each SR-IOV RoCE NIC = its affine GPUs, and the VF netdevs' addresses
    # from a JSON file on the node ({"<vf netdev>": "a.b.c.d/len"}, the netlink extra)
    vf_setup: Switch = "off"  # on; auto: only NICs with SR-IOV and no VF yet (vfsetup.auto_counts)
    vf_addresses: Path | None = None
    # peer-to-peer bundles (docs/design.md#peers)
    peer_token: str | None = Field(None, repr=False)  # agents serve and fetch bundles only with it
    peer_token_file: Path | None = Field(None, repr=False)
    peers: Peers = ()  # base URLs of other agents' TCP listeners
    peer_port: Whole = 0  # cluster mode: the port peers listen on (0: this agent's --listen port)
    peer_timeout: Duration = 10.0  # connect and per-read timeout of a peer download
    peer_wait: Duration = 30.0  # how long a bundle another agent is downloading is waited for before the store
    peer_min_rate: Size = Field(
        1 << 20, validation_alias=_env("PEER_MIN_RATE", "peer_min_rate")
    )  # bytes/s, else too slow
    peer_max_uploads: Whole = 8  # bundles served at once, all peers together (else 503)
    peer_max_uploads_per_peer: Whole = 4  # bundles served at once to one peer (else 429)
    peer_upload_rate: Size = Field(
        0, validation_alias=_env("PEER_UPLOAD_RATE", "peer_upload_rate")
    )  # bytes/s per peer, 0: no cap
    # striped versions (docs/design-striping.md): the disk (bytes, blocks and inodes) of bundles
    # owned elsewhere this node keeps for its readers at once (never its own share)
    stripe_window_bytes: Size = Field(2 << 30, validation_alias=_env("STRIPE_WINDOW", "stripe_window_bytes"))
    # what one caller (a pod; the operators together) may hold of the striped bundle streams
    # to this node's readers (dsagent.cache.striped.readerstreams): streams open at once
    stripe_caller_streams: Whole = 16
    # the share of DSAGENT_STRIPE_WINDOW one caller's streams may pin (one bundle always may be)
    stripe_caller_window: UnitShare = 0.5
    # a bundle stream whose reader took nothing for this long is closed and its bundle let go
    stripe_stream_idle: Duration = 60.0
    stripe_handover: Duration = 600.0  # a share's bundles another member now owns stay served this long
    # a share held storeOnDemand asks the peers again after this for the bundles it misses,
    # twice as long after each pass that brought nothing, up to 8x (never the store: that
    # waits for a reader; docs/design-striping.md#agent)
    stripe_on_demand_retry: Duration = 30.0
    # the links peer and store fetches spread over, each connection bound to one NIC's address
    # (docs/design.md#links): () the default route, ("auto",) the RDMA NICs near the node's GPUs
    fetch_links: FetchLinks = ()
    # the node's network namespace, for an agent on the pod network (/proc/1/ns/net with the
    # host's pids; needs CAP_SYS_ADMIN): its NICs' addresses are read there (topology
    # discovery), and the fetch links' sockets made there, while the agent's own port stays
    # on the pod network (docs/design.md#links). Empty: the agent's own namespace
    node_netns: NetnsPath = None
    # the smallest byte range a bundle from the store is split into over the fetch links when
    # its version has fewer bundles than links (docs/design.md#links); a bundle under twice this
    # is read in one stream
    fetch_range_min: Size = 64 << 20
    stripe_lease: Duration = 3600.0  # a share not held again (PUT /v1/stripes) nor used within this long is dropped
    # On SIGTERM, the longest an agent serving stripe share bundles keeps serving them to their
    # new owners before it stops (docs/design-striping.md#churn); 0 (the default): it stops at
    # once, as one without shares does. Only the Dataset controller moves shares, so the chart
    # turns it on (agent.stripeHandoffSeconds, 570 s: plus the 30 s the stop itself may take,
    # the cluster autoscaler's default --max-graceful-termination-sec of 600 s).
    stripe_handoff_grace: Duration = 0.0
    # The hand-off ends sooner once no peer asked for a bundle this long, after the first-contact
    # window: the Dataset controller's pass interval (30 s, its resync), because the new owners
    # of a leaving node's share are asked at a pass, and one whose fill failed at the next one.
    stripe_handoff_idle: Duration = 30.0
    # No idle end of the hand-off before this long since the signal (unset: twice the idle
    # window): peers start asking only once the controller's next pass has seen the drain, up
    # to one whole pass after the node is cordoned, plus the pass itself.
    stripe_handoff_first_contact: Duration | None = None
    store_proxies: Proxies = Field(
        default_factory=dict
    )  # bundle store URL prefix -> HTTP proxy (e.g. Dragonfly's dfdaemon)

    # --- CSI ---
    csi_socket: Path | None = None  # None: no CSI node plugin (docs/design.md#csi)
    csi_driver_name: str = "datasets.dsagent.io"
    csi_kubelet_pods_dir: Path = Path("/var/lib/kubelet/pods")  # NodePublish targets must lie under it
    # ---

    def disk_floor(self, disk_total: int) -> int:
        """Bytes of the cache's disk the cache never fills: the reserve plus the kubelet's
        ``nodefs.available`` eviction threshold, so a cache on the root disk can never get the
        node's pods evicted. Standalone (not ``--kubernetes``) with no reserve set: 0."""
        if self.reserve is None and not self.kubernetes:
            return 0
        reserve = self.reserve if self.reserve is not None else parse_share(DEFAULT_RESERVE)
        return sum(int(s * disk_total) if isinstance(s, float) else int(s) for s in (reserve, self.nodefs_available))

    @property
    def source_policy(self) -> SourcePolicy:
        return SourcePolicy(self.protocols, self.storage_option_keys, self.local_sources, self.egress_policy)

    @property
    def egress_policy(self) -> EgressPolicy:
        """Where the agent may connect for a request (:mod:`dsagent.format.egress`)."""
        return EgressPolicy.of(self.egress_deny, self.egress_allow)

    @field_validator("egress_deny")
    @classmethod
    def _egress_deny(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        egress.parse_networks(value)  # a range that is not one is an error at start-up
        return value

    @field_validator("storage_option_keys")
    @classmethod
    def _no_metadata_headers(cls, value: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        for keys in value.values():
            try:
                check_headers([k.split(".", 1)[1] for k in keys if k.startswith("headers.") and k != "headers.*"])
            except InvalidInput as exc:
                raise ValueError(exc.message) from None
        return value

    @field_validator("protocols")
    @classmethod
    def _protocols(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(ALIASES.get(p, p) for p in value))

    @field_validator("storage_option_keys", mode="before")
    @classmethod
    def _option_keys(cls, value: Any) -> Any:
        """The operator's lists replace the defaults protocol by protocol."""
        return {**sources.DEFAULT_OPTION_KEYS, **value} if isinstance(value, Mapping) else value

    @property
    def discovery_options(self) -> dict[str, Any] | None:
        """``gpu_topology.discover``'s options: read the host's sysfs at :attr:`sysfs_root`
        (the chart mounts it at ``/host/sys``) and the NICs' addresses in :attr:`node_netns`;
        None where both are this container's own."""
        sysfs: dict[str, Any] = {"root": self.sysfs_root} if self.sysfs_root != Path("/") else {}
        if self.node_netns is not None:
            from gpu_topology.discovery.sysfs import ip_addresses_in

            sysfs["addresses"] = functools.partial(ip_addresses_in, self.node_netns)
        return {"sysfs": sysfs} if sysfs else None

    @property
    def socket(self) -> Path:
        return self.socket_path if self.socket_path is not None else self.root / "dsagent.sock"

    @field_validator("root", mode="before")
    @classmethod
    def _root(cls, value: Any) -> Path:
        if not str(value):
            raise ValueError("the cache root must not be empty")
        return Path(value).expanduser().absolute()

    @field_validator("capacity_bytes")
    @classmethod
    def _capacity(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError("a capacity limit must be positive")
        return value

    @field_validator("capacity_bytes", mode="before")
    @classmethod
    def _no_capacity(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("evict_ratio", mode="before")
    @classmethod
    def _ratio(cls, value: Any) -> float:
        try:
            ratio = float(value)
        except (TypeError, ValueError):
            ratio = math.nan
        if not math.isfinite(ratio) or ratio < 1.0:
            raise ValueError(f"the eviction ratio must be a number >= 1.0, got {value!r}")
        return ratio

    @field_validator(
        "max_fetches", "fetch_workers", "max_dataset_files", "peer_max_uploads", "peer_max_uploads_per_peer",
        "stripe_caller_streams",
    )  # fmt: skip
    @classmethod
    def _at_least_one(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"expected a number >= 1, got {value!r}")
        return value

    @field_validator("fetch_range_min")
    @classmethod
    def _range_min(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"the smallest byte range must be positive, got {value!r}")
        return value

    @field_validator("stripe_handoff_idle", "stripe_stream_idle", "stripe_on_demand_retry")
    @classmethod
    def _idle_window(cls, value: float, info: ValidationInfo) -> float:
        if value <= 0:
            what = "the retry interval" if info.field_name == "stripe_on_demand_retry" else "the idle window"
            raise ValueError(f"{what} must be positive, got {value!r}")
        return value

    @field_validator("peer_token", "admin_token")
    @classmethod
    def _token(cls, value: str | None, info: ValidationInfo) -> str | None:
        return check_token(value, str(info.field_name).replace("_", " "))  # "peer token", "admin token"

    @field_validator("roce_classes")
    @classmethod
    def _roce_classes(cls, value: str) -> str:
        from gpu_topology import ClassMode, TopologyError

        try:
            return ClassMode.parse(value).value
        except TopologyError as exc:
            raise ValueError(f"{exc.message} (use numa, subnet or none)") from None

    @model_validator(mode="after")
    def _whole_settings(self) -> Settings:
        if self.admin_token is None and self.admin_token_file is not None:
            token = read_secret_file(self.admin_token_file, f"{ENV_PREFIX}ADMIN_TOKEN_FILE")
            object.__setattr__(self, "admin_token", check_token(token, "admin token"))
        if self.peer_token is None and self.peer_token_file is not None:
            token = read_secret_file(self.peer_token_file, f"{ENV_PREFIX}PEER_TOKEN_FILE")
            object.__setattr__(self, "peer_token", check_token(token, "peer token"))
        unlisted = [p for p in self.protocols if p not in self.storage_option_keys]
        if unlisted:
            raise ValueError(
                f"{ENV_PREFIX}PROTOCOLS: {unlisted} have no storage-option key allowlist"
                f" (add them to {ENV_PREFIX}STORAGE_OPTION_KEYS, a JSON object)"
            )
        if len(str(self.socket).encode()) > 107:
            raise ValueError(f"socket path {str(self.socket)!r} is too long for a unix socket (max 107 bytes)")
        return self


__all__ = ["Settings"]
