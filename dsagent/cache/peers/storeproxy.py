"""The cluster's own P2P engine: bundle downloads through the proxy configured for a store.

Who calls it: :mod:`dsagent.cache.versions`, for the storage options it reads a version's
bundles with (``DSAGENT_STORE_PROXIES``, :attr:`dsagent.cache.settings.Settings.store_proxies`).
What it owns: which store a proxy applies to and how each kind of store is told about it
(docs/design.md#peers, "The cluster's own P2P engine"). Manifests never go through it.
"""

from __future__ import annotations

import logging

from dsagent.cache.settings import Settings
from dsagent.format.storageconfig import Options, store_options

log = logging.getLogger("dsagent.peers")


def bundle_options(settings: Settings, store: str, options: Options) -> Options:
    """``options`` for reading bundles from ``store``, through its configured proxy if any.

    Only bundle downloads use the proxy: bundles are immutable and named by digest, what
    a P2P engine's proxy (Dragonfly's dfdaemon, Kraken's agent) caches best; manifests,
    which change under the same name, are read from the store directly.
    """
    proxy = next(
        (
            p
            for prefix, p in settings.store_proxies.items()
            if store == prefix or store.startswith(prefix.rstrip("/") + "/")
        ),
        None,
    )
    if proxy is None:
        return options
    given = store_options(options)
    merged = dict(given.values)
    if store.startswith(("http://", "https://")):
        merged["proxy"] = proxy  # fsspec's HTTP filesystem passes it to every aiohttp request
    elif store.startswith(("s3://", "s3a://")):
        config = dict(merged.get("config_kwargs") or {})
        config["proxies"] = {"http": proxy, "https": proxy}
        merged["config_kwargs"] = config
    else:
        log.warning("a proxy is configured for %s, but only http(s):// and s3:// stores can use one", store)
    return given.with_values(merged)


__all__ = ["bundle_options"]
