"""The node agent's cluster-mode settings (``dsagent serve --kubernetes``), from ``DSAGENT_*``.

Who reads it: :func:`dsagent.nodeagent.nodeparts.load_cluster_agent` builds it at start-up and hands it to
:class:`dsagent.nodeagent.clusteragent.ClusterAgent`; :mod:`dsagent.kube.envnames` lists its
fields among the names every process accepts. Apart from the agent so that reading the
names loads no agent code.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from dsagent.errors import SettingsError
from dsplatform.names import is_dns_label, is_dns_subdomain
from dsplatform.settings import EnvSettings
from dsplatform.units import Duration


class ClusterSettings(EnvSettings):
    """Cluster-mode settings, from ``DSAGENT_*`` (validated once at start-up)."""

    model_config = SettingsConfigDict(env_prefix="DSAGENT_", extra="ignore")
    settings_error: ClassVar[type[Exception] | None] = SettingsError

    publish_interval: Duration = 10.0
    watch_timeout: int = Field(300, exclude=True)  # not configurable: the watch's server-side timeout
    renew_interval: Duration | None = None  # None: a third of the service's lease TTL
    guard_wait: Duration = 5.0  # how long a task id may wait for its pod to reach the watch
    copies_configmap: str | None = None  # "namespace/name" of the controller's copy counts
    copies_interval: Duration = 30.0  # how often they are read
    # the Node's dsagent.io/published-at is rewritten at least this often, so the controller
    # can tell a live inventory from a stale one (docs/operator-guide/tenancy.md)
    publish_heartbeat: Duration = 120.0
    # how long a stopping agent tries to remove its Node annotations (an API server that hangs
    # or fails is retried within it, never waited on past it)
    stop_timeout: Duration = 10.0

    @field_validator("copies_configmap")
    @classmethod
    def _namespaced(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        namespace, _, name = str(value).partition("/")
        if not (is_dns_label(namespace) and is_dns_subdomain(name)):
            raise ValueError("must be NAMESPACE/NAME of a ConfigMap")
        return str(value)

    @field_validator("publish_interval", "copies_interval", "publish_heartbeat", "stop_timeout")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be positive")
        return value


__all__ = ["ClusterSettings"]
