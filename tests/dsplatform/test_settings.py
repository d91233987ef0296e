"""The one settings mechanism (dsplatform.settings): environment read once, by the class
being read only; fields no variable sets; empty variables as unset where a class says so."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import InstanceOf
from pydantic_settings import SettingsConfigDict

from dsplatform.settings import EnvSettings, InvalidSettings, not_from_env, read_secret_file


class Inner(EnvSettings):
    model_config = SettingsConfigDict(env_prefix="T_")

    mode: str = "inner-default"


class Outer(EnvSettings):
    model_config = SettingsConfigDict(env_prefix="T_", env_ignore_empty=True)

    port: int = 80
    # its name makes the variable T_MODE, the inner class's: it must not be read from there
    mode: InstanceOf[Inner] = not_from_env(default_factory=Inner)


def test_a_settings_object_built_while_another_is_read_does_not_read_that_environment() -> None:
    outer = Outer.read({"T_MODE": "from-env", "T_PORT": "81"})
    assert outer.port == 81
    assert outer.mode.mode == "inner-default"  # neither parsed as the field nor read by Inner()
    assert Inner.read({"T_MODE": "from-env"}).mode == "from-env"


def test_a_field_not_from_env_is_no_variable() -> None:
    assert Outer.env_names() == {"T_PORT"}
    given = Inner(mode="given")
    assert Outer.read({}, mode=given).mode is given


def test_an_empty_variable_is_unset_only_where_the_class_says_so() -> None:
    assert Outer.read({"T_PORT": ""}).port == 80
    assert Inner.read({"T_MODE": ""}).mode == ""


def test_a_rule_over_several_fields_is_reported_by_its_own_message() -> None:
    problems = InvalidSettings([("", "set both T_A and T_B, or neither"), ("T_PORT='x'", "not a number")])
    assert problems.message == "set both T_A and T_B, or neither; T_PORT='x': not a number"


def test_a_secret_file_is_read_stripped_and_a_missing_one_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cret\n")
    assert read_secret_file(tmp_path / "token", "T_TOKEN_FILE") == "s3cret"
    with pytest.raises(ValueError, match=r"^T_TOKEN_FILE: cannot read '.*missing': No such file"):
        read_secret_file(tmp_path / "missing", "T_TOKEN_FILE")
