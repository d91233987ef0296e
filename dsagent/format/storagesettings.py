"""How long object stores and HTTP(S) sources may take, as ``DSAGENT_*`` variables.

Who calls it: ``dsctl``'s storage commands (through :mod:`dsagent.cli.options`) and the node
agent (its :class:`dsagent.cache.settings.Settings` builds on :class:`StorageSettings`).
What it owns: the one rule that turns the timeout variables into a
:class:`dsagent.format.storageconfig.StorageConfig`, the value passed down to every filesystem.
It lives beside that value, not in the node cache, so ``dsctl`` imports no cache to read it;
apart from :mod:`dsagent.format.storageconfig` so that a pack, which takes the value, does not
import pydantic-settings.
"""

from __future__ import annotations

from pydantic import field_validator
from pydantic_settings import SettingsConfigDict

from dsagent.envsettings import ENV_PREFIX
from dsagent.format.storageconfig import DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT, StorageConfig
from dsplatform.settings import EnvSettings
from dsplatform.units import Duration


class StorageSettings(EnvSettings):
    """How long object stores and HTTP(S) sources may take: read by ``dsctl``'s storage
    commands and, as part of :class:`Settings`, by the agent.

    One rule (:attr:`storage_config`), for every protocol and both programs: a specific
    timeout that is configured (``DSAGENT_STORAGE_CONNECT_TIMEOUT``, ``..._READ_TIMEOUT``)
    wins over the general one (``DSAGENT_SOURCE_TIMEOUT``, both), which wins over the
    defaults 10 s to connect, 60 s per read.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX)

    source_timeout: Duration | None = None  # connect and read timeout of every remote source operation
    storage_connect_timeout: Duration | None = None
    storage_read_timeout: Duration | None = None

    @field_validator("source_timeout", "storage_connect_timeout", "storage_read_timeout")
    @classmethod
    def _positive(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError(f"a timeout must be positive, got {value!r}")
        return value

    @property
    def storage_config(self) -> StorageConfig:
        """The connect and read timeouts: the specific setting, else the general, else the
        default; passed down to every filesystem (:mod:`dsagent.format.storageconfig`)."""

        def pick(specific: float | None, default: float) -> float:
            if specific is not None:
                return specific
            return self.source_timeout if self.source_timeout is not None else default

        return StorageConfig(
            connect=pick(self.storage_connect_timeout, DEFAULT_CONNECT_TIMEOUT),
            read=pick(self.storage_read_timeout, DEFAULT_READ_TIMEOUT),
        )


__all__ = ["StorageSettings"]
