"""How long a store may take and how often one request is tried: a value, passed down.

Who calls it: the edges that read the settings build a :class:`StorageConfig`
(:attr:`dsagent.format.storagesettings.StorageSettings.storage_config`: ``DSAGENT_STORAGE_*``, then
``DSAGENT_SOURCE_TIMEOUT``, then 10 s / 60 s) and put it into the storage options they pass
down (:func:`with_config`): the agent into every dataset's source options
(:meth:`dsagent.cache.service.CacheService._serve`), ``dsctl`` into the options of its
storage commands (:func:`dsagent.cli.options.options_for_stores`). It travels with the
options through every function that takes them (manifest reads, digests, packing,
unpacking, per-file copies) to :func:`dsagent.format.storage.resolve`, which takes it out
(:func:`split_config`) and gives the filesystem its bounds (:meth:`StorageConfig.bounded`):
for S3 botocore's ``connect_timeout``, ``read_timeout`` and ``retries``; for GCS
``requests_timeout``; for Azure ``connection_timeout`` and ``read_timeout``; for HTTP(S)
aiohttp's ``ClientTimeout``. Options the caller gives win. Nothing here reads the
environment, and there is no process-wide setting: a filesystem built without a config
gets :data:`DEFAULT`.

Decision: retries of a single request stay with the backend (botocore's standard retry
mode), capped at :attr:`StorageConfig.attempts`; whole-dataset retries are the caller's,
by type (:class:`~dsagent.errors.TransientError`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dsagent.errors import InvalidInput

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_READ_TIMEOUT = 60.0
DEFAULT_ATTEMPTS = 3

#: The storage-options key that carries the :class:`StorageConfig` (never a user's key:
#: the agent's key allowlist refuses it from a pod, and :func:`split_config` refuses any
#: value that is not a config).
CONFIG_KEY = "storage_config"

_BOUNDED = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "az", "abfss", "http", "https"})


@dataclass(frozen=True)
class StorageConfig:
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


def with_config(options: Mapping[str, Any] | None, config: ConfigSource) -> dict[str, Any]:
    """``options`` carrying ``config`` down to :func:`dsagent.format.storage.resolve`."""
    return {**dict(options or {}), CONFIG_KEY: config}


def user_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` without the config: what the user or the pod gave."""
    return {k: v for k, v in (options or {}).items() if k != CONFIG_KEY}


def split_config(options: Mapping[str, Any] | None) -> tuple[StorageConfig, dict[str, Any]]:
    """The config ``options`` carry (:data:`DEFAULT` if none) and the rest of them."""
    carried = (options or {}).get(CONFIG_KEY, DEFAULT)
    if callable(carried) and not isinstance(carried, StorageConfig):
        carried = carried()
    if not isinstance(carried, StorageConfig):
        raise InvalidInput(
            f"storage option {CONFIG_KEY!r} is set by dsplatform, not given",
            hint="set timeouts with DSAGENT_STORAGE_CONNECT_TIMEOUT / DSAGENT_STORAGE_READ_TIMEOUT",
        )
    return carried, user_options(options)


__all__ = [
    "CONFIG_KEY",
    "DEFAULT",
    "ConfigSource",
    "StorageConfig",
    "split_config",
    "user_options",
    "with_config",
]
