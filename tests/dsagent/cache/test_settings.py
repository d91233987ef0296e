"""Settings are read once from DSAGENT_* and every bad value is one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsagent.cache.settings import Settings
from dsagent.envsettings import parse_listen
from dsagent.errors import SettingsError
from dsplatform.units import parse_duration


def test_settings_come_from_the_environment(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {
            "DSAGENT_ROOT": str(tmp_path),
            "DSAGENT_CAPACITY": "2GB",
            "DSAGENT_EVICT_RATIO": "1.5",
            "DSAGENT_IDLE_TTL": "2d",
            "DSAGENT_LISTEN": "127.0.0.1:7420",
            "DSAGENT_MAX_FETCHES": "3",
            "DSAGENT_LOCAL_SOURCES": f"{tmp_path}/a:{tmp_path}/b",
            "DSAGENT_KUBERNETES": "true",
        }
    )
    assert settings.root == tmp_path
    assert settings.capacity_bytes == 2_000_000_000
    assert settings.evict_ratio == 1.5
    assert settings.idle_ttl == 2 * 86400
    assert settings.listen == ("127.0.0.1", 7420)
    assert settings.max_fetches == 3
    assert settings.local_sources == (tmp_path / "a", tmp_path / "b")
    assert settings.kubernetes is True
    assert settings.socket == tmp_path / "dsagent.sock"


@pytest.mark.parametrize(
    ("var", "value", "says"),
    [
        ("CAPACITY", "lots", "DSAGENT_CAPACITY='lots'"),
        ("EVICT_RATIO", "0.9", ">= 1.0"),
        ("EVICT_RATIO", "nan", ">= 1.0"),
        ("IDLE_TTL", "forever", "invalid duration"),
        ("LISTEN", "7420", "HOST:PORT"),
        ("LISTEN", "host:99999", "invalid listen"),
        ("MAX_FETCHES", "0", ">= 1"),
        ("FETCH_WORKERS", "many", "whole number"),
        ("KUBERNETES", "maybe", "boolean"),
        ("ADMIN_TOKEN", "short", "at least 16"),
        ("LOG_LEVEL", "loud", "unknown log level"),
    ],
)
def test_every_bad_value_is_a_settings_error_naming_it(var: str, value: str, says: str, tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as excinfo:
        Settings.from_env({"DSAGENT_ROOT": str(tmp_path), f"DSAGENT_{var}": value})
    assert says in str(excinfo.value)


def test_the_admin_token_can_come_from_a_file_and_is_never_in_the_repr(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-0123456789\n")
    settings = Settings.from_env({"DSAGENT_ROOT": str(tmp_path), "DSAGENT_ADMIN_TOKEN_FILE": str(token_file)})
    assert settings.admin_token == "s3cret-token-0123456789"
    assert "s3cret" not in repr(settings)


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("30s", 30), ("5m", 300), ("2h", 7200), ("7d", 604800), ("250ms", 0.25), (3, 3)]
)
def test_durations_accept_units(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_ipv6_listen_addresses_use_brackets() -> None:
    assert parse_listen("[::1]:80") == ("::1", 80)
