"""One timeout rule for object stores. The seconds come from the settings
(``DSAGENT_STORAGE_CONNECT_TIMEOUT`` / ``..._READ_TIMEOUT`` win over ``DSAGENT_SOURCE_TIMEOUT``,
which wins over 10 s / 60 s) and are handed down as a value inside the storage options
(``dsagent.format.storageconfig``); the format layer reads no environment and holds no
process-wide setting.

Before, the agent added ``DSAGENT_SOURCE_TIMEOUT`` (60 s) to a request's options first and
the format layer's ``DSAGENT_STORAGE_*`` only filled what was unset, so a configured 10 s S3
connect timeout became 60 s.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dsagent.cache.service import CacheService, DatasetRequest
from dsagent.cache.settings import Settings
from dsagent.cli.bundlework import options_for_stores, settings_storage_config
from dsagent.errors import SettingsError
from dsagent.format import storage
from dsagent.format.storageconfig import DEFAULT, StorageConfig, StoreOptions, store_options, user_options, with_config
from dsagent.format.storagesettings import StorageSettings


class Built(Exception):
    """Raised by the recording filesystem class once it has seen its options."""


def test_the_specific_timeout_wins_over_the_general_one_which_wins_over_the_default() -> None:
    def bounds(env: dict[str, str]) -> StorageConfig:
        return StorageSettings.read(env).storage_config

    assert bounds({}) == StorageConfig(10.0, 60.0)
    assert bounds({"DSAGENT_SOURCE_TIMEOUT": "5s"}) == StorageConfig(5.0, 5.0)
    assert bounds({"DSAGENT_SOURCE_TIMEOUT": "60s", "DSAGENT_STORAGE_CONNECT_TIMEOUT": "10s"}) == StorageConfig(
        10.0, 60.0
    )
    assert bounds({"DSAGENT_SOURCE_TIMEOUT": "1h", "DSAGENT_STORAGE_READ_TIMEOUT": "30s"}) == StorageConfig(
        3600.0, 30.0
    )
    with pytest.raises(SettingsError, match="DSAGENT_STORAGE_CONNECT_TIMEOUT='0': a timeout must be positive"):
        Settings.from_env({"DSAGENT_STORAGE_CONNECT_TIMEOUT": "0"})


def test_a_configured_10s_s3_connect_timeout_stays_10s_in_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hung store, through the agent's own path: a task's S3 source is opened by
    :func:`dsagent.format.storage.resolve` with the options s3fs is built from."""
    import s3fs

    seen: list[dict[str, Any]] = []

    def recording(self: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(kwargs)
        raise Built

    monkeypatch.setattr(s3fs.S3FileSystem, "__init__", recording)
    settings = Settings.from_env(
        {
            "DSAGENT_ROOT": str(tmp_path),
            "DSAGENT_SOURCE_TIMEOUT": "60s",
            "DSAGENT_STORAGE_CONNECT_TIMEOUT": "10s",
            "DSAGENT_SWEEP_INTERVAL": "1h",
        }
    )

    async def run() -> None:
        service = CacheService(settings)
        await service.start()
        try:
            request = DatasetRequest(
                "d", "s3://bucket/data", storage_options={"anon": True, "endpoint_url": "http://127.0.0.1:9"}
            )
            await service.submit_task("t", [request], wait=30)
        finally:
            await service.stop()

    asyncio.run(run())
    assert seen, "the agent never built an S3 filesystem"
    config = seen[0]["config_kwargs"]
    assert (config["connect_timeout"], config["read_timeout"]) == (10.0, 60.0)


def test_dsctl_hands_the_configured_timeouts_to_every_filesystem_it_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    import aiohttp

    def config(env: dict[str, str]) -> Any:
        return lambda: settings_storage_config(env)

    options = with_config({}, config({"DSAGENT_STORAGE_CONNECT_TIMEOUT": "3s", "DSAGENT_SOURCE_TIMEOUT": "20s"}))
    fs, _ = storage.resolve("https://example.invalid/x", options)
    timeout = fs.client_kwargs["timeout"]
    assert isinstance(timeout, aiohttp.ClientTimeout)
    assert (timeout.sock_connect, timeout.sock_read) == (3.0, 20.0)
    with pytest.raises(SettingsError, match="DSAGENT_STORAGE_READ_TIMEOUT='soon'"):
        storage.resolve("s3://bucket/x", with_config({"anon": True}, config({"DSAGENT_STORAGE_READ_TIMEOUT": "soon"})))


def test_dsctl_reads_the_settings_from_its_environment_only_for_a_remote_filesystem(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DSAGENT_STORAGE_READ_TIMEOUT", "7s")
    options = options_for_stores({"anon": True})
    assert options.values == {"anon": True} and callable(options.config)
    fs, _ = storage.resolve("s3://bucket/x", options)
    assert fs.config_kwargs["read_timeout"] == 7.0
    monkeypatch.setenv("DSAGENT_STORAGE_READ_TIMEOUT", "never")  # not read for a local path
    local = options_for_stores({})
    assert storage.local_path(str(tmp_path), local) == str(tmp_path)
    assert storage.resolve(str(tmp_path), local)[1] == str(tmp_path)


def test_the_bounds_travel_beside_the_options_never_inside_them() -> None:
    bounded = with_config({"anon": True}, StorageConfig(2.0, 3.0))
    assert isinstance(bounded, StoreOptions) and bounded.values == {"anon": True}
    assert user_options(bounded) == {"anon": True}
    assert bounded.with_values({"anon": False}).config == StorageConfig(2.0, 3.0)
    assert store_options({"anon": True}).config is DEFAULT  # a library caller's plain options
    # a key in the options sets no bound: only the typed value does
    fs, _ = storage.resolve("s3://bucket/x", {"anon": True, "storage_config": StorageConfig(1.0, 1.0)})
    assert fs.config_kwargs["read_timeout"] == DEFAULT.read
    fs, _ = storage.resolve("s3://bucket/x", bounded)
    assert (fs.config_kwargs["connect_timeout"], fs.config_kwargs["read_timeout"]) == (2.0, 3.0)


def test_a_timeout_in_the_callers_options_wins() -> None:
    options = StorageConfig(10.0, 60.0).bounded("s3", {"config_kwargs": {"connect_timeout": 1}})
    assert options["config_kwargs"]["connect_timeout"] == 1
    assert options["config_kwargs"]["read_timeout"] == 60.0
    assert options["config_kwargs"]["retries"] == {"max_attempts": 3, "mode": "standard"}
    assert StorageConfig(1.0, 1.0).bounded("file", {}) == {}
