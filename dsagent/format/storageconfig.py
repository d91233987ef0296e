"""How long a store may take and how often one request is tried: a value, passed down.

Who calls it: the edges that read the settings build a :class:`StorageConfig`
(:attr:`dsagent.format.storagesettings.StorageSettings.storage_config`: ``DSAGENT_STORAGE_*``, then
``DSAGENT_SOURCE_TIMEOUT``, then 10 s / 60 s) and pass it down beside the fsspec options, as
one typed value, :class:`StoreOptions` (:func:`with_config`): the agent for every dataset
(:meth:`dsagent.cache.taskwork.TaskWork.serve`), ``dsctl`` for its storage commands
(:func:`dsagent.cli.bundlework.options_for_stores`). It travels through every function that
takes storage options (manifest reads, digests, packing, unpacking, per-file copies) to
:func:`dsagent.format.storage.resolve`, which gives the filesystem its bounds
(:meth:`StorageConfig.bounded`):
for S3 botocore's ``connect_timeout``, ``read_timeout`` and ``retries``; for GCS
``requests_timeout``; for Azure ``connection_timeout`` and ``read_timeout``; for HTTP(S)
aiohttp's ``ClientTimeout``. Options the caller gives win. Nothing here reads the
environment, and there is no process-wide setting: a filesystem built without a config
gets :data:`DEFAULT`.

Decision: retries of a single request stay with the backend (botocore's standard retry
mode), capped at :attr:`StorageConfig.attempts`; whole-dataset retries are the caller's,
by type (:class:`~dsagent.errors.TransientError`).

Decision: both values are named tuples, not frozen dataclasses: every ``dsctl`` command
imports this module, and ``dataclasses`` (which imports ``inspect``, ``ast``, ``dis`` and
``tokenize``) with its per-class code generation cost each command about 10 ms of start-up
on the project's 2-core benchmark machine, a fifth of what ``dsctl unpack`` spends before
its first byte (docs/design-native.md#start-up).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from dsagent.format.egress import EgressPolicy

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_READ_TIMEOUT = 60.0
DEFAULT_ATTEMPTS = 3

_BOUNDED = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "az", "abfss", "http", "https"})


class StorageConfig(NamedTuple):
    """Seconds an object-store or HTTP(S) client waits to connect and for each read, and
    how many times one request is tried."""

    connect: float = DEFAULT_CONNECT_TIMEOUT
    read: float = DEFAULT_READ_TIMEOUT
    attempts: int = DEFAULT_ATTEMPTS

    def bounded(self, protocol: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` with this config's bounds for ``protocol``'s filesystem added; a
        bound the options set already wins. Local and other protocols: unchanged."""
        merged = dict(options)
        if protocol not in _BOUNDED:
            return merged
        if protocol in {"s3", "s3a"}:
            config = dict(merged.get("config_kwargs") or {})
            config.setdefault("connect_timeout", self.connect)
            config.setdefault("read_timeout", self.read)
            config.setdefault("retries", {"max_attempts": self.attempts, "mode": "standard"})
            merged["config_kwargs"] = config
        elif protocol in {"gs", "gcs"}:
            merged.setdefault("requests_timeout", self.connect + self.read)
        elif protocol in {"abfs", "az", "abfss"}:
            merged.setdefault("connection_timeout", int(self.connect))
            merged.setdefault("read_timeout", int(self.read))
        else:  # http(s): aiohttp's timeouts, only when aiohttp (the http extra) is there
            try:
                import aiohttp
            except ImportError:
                return merged
            client = dict(merged.get("client_kwargs") or {})
            client.setdefault(
                "timeout", aiohttp.ClientTimeout(total=None, sock_connect=self.connect, sock_read=self.read)
            )
            merged["client_kwargs"] = client
        return merged


#: The bounds of a filesystem built with no config in its options.
DEFAULT = StorageConfig()

#: A config, or a function that builds it when the first remote filesystem is built
#: (``dsctl``'s local-only commands never import the settings library).
ConfigSource = StorageConfig | Callable[[], StorageConfig]


class StoreOptions(NamedTuple):
    """What a filesystem is built from: the fsspec options a user or a pod gave (``values``)
    and, beside them, the bounds the edge decided (``config``: a :class:`StorageConfig`, or a
    function that builds it when the first remote filesystem is built)."""

    values: Mapping[str, Any] = MappingProxyType({})
    config: ConfigSource = DEFAULT
    #: where the filesystem may connect (the agent's rule for a request's stores:
    #: :mod:`dsagent.format.egress`); None: anywhere (dsctl, the user's own rights)
    egress: EgressPolicy | None = None

    def with_values(self, values: Mapping[str, Any]) -> StoreOptions:
        """The same bounds with other fsspec options."""
        return StoreOptions(dict(values), self.config, self.egress)

    def resolved_config(self) -> StorageConfig:
        """The bounds, built now if they were given as a function."""
        return self.config if isinstance(self.config, StorageConfig) else self.config()


#: What a function of the format layer takes as storage options: the typed value, or plain
#: fsspec options (a library caller's; they get :data:`DEFAULT`).
Options = StoreOptions | Mapping[str, Any] | None


def store_options(options: Options) -> StoreOptions:
    """``options`` as the typed value: plain fsspec options get the :data:`DEFAULT` bounds."""
    if isinstance(options, StoreOptions):
        return options
    return StoreOptions(dict(options or {}))


def with_config(options: Options, config: ConfigSource, egress: EgressPolicy | None = None) -> StoreOptions:
    """``options`` with ``config`` (and the agent's ``egress`` rule) beside them, carried down
    to :func:`dsagent.format.storage.resolve`."""
    return StoreOptions(dict(store_options(options).values), config, egress)


def user_options(options: Options) -> dict[str, Any]:
    """The fsspec options alone: what the user or the pod gave."""
    return dict(store_options(options).values)


__all__ = [
    "DEFAULT",
    "ConfigSource",
    "Options",
    "StorageConfig",
    "StoreOptions",
    "store_options",
    "user_options",
    "with_config",
]
