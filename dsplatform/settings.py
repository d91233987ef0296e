"""Settings objects read once from one environment prefix: the base of every component's settings.

Who calls it: :class:`dsagent.cache.settings.Settings` (``DSAGENT_*``), the cluster agent's
settings, and :class:`scheduler_plugin.settings.Settings` (``DSEXT_*``).
What it owns: the pydantic-settings wiring those share, so each component only declares
typed fields (with :data:`dsplatform.units.Size` / :data:`~dsplatform.units.Duration` for
sizes and durations):

- the environment is read only by :meth:`EnvSettings.read`, from ``os.environ`` or a
  mapping the caller passes (tests, and ``dsctl`` reading a pod's environment); building a
  settings object directly reads nothing, so tests are not steered by the machine's env;
- keyword overrides (command-line flags) win over the environment; ``None`` means "not given";
- every invalid variable is listed in one :class:`InvalidSettings`, each as
  ``VARIABLE='value': what is wrong (what a good one looks like)``, so a misconfigured
  DaemonSet fails at start-up with one line naming all of its mistakes.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import Annotated, Any

from pydantic import AliasChoices, BeforeValidator, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from typing_extensions import Self

from dsplatform.errors import VocabularyError

_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("dsplatform_environ", default=None)


class InvalidSettings(VocabularyError):
    """One or more settings are invalid; ``problems`` lists ``(variable, message)`` pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{where}: {what}" for where, what in problems))


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        if self.case_sensitive:
            return dict(self._environ)
        return {key.lower(): value for key, value in self._environ.items()}


class EnvSettings(BaseSettings):
    """Frozen, typed settings; subclasses set ``env_prefix`` in their ``model_config``."""

    model_config = SettingsConfigDict(frozen=True, populate_by_name=True, extra="forbid", validate_default=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        environ = _ENVIRON.get()
        if environ is None:
            return (init_settings,)
        return (init_settings, _MappingEnvSource(settings_cls, environ))

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None, /, **overrides: Any) -> Self:
        """Settings from the environment (``os.environ`` unless given), flags in ``overrides`` winning."""
        env = os.environ if environ is None else environ
        given = {key: value for key, value in overrides.items() if value is not None}
        token = _ENVIRON.set(env)
        try:
            return cls(**given)
        except ValidationError as exc:
            raise InvalidSettings([cls._problem(error, env, given) for error in exc.errors()]) from None
        finally:
            _ENVIRON.reset(token)

    @classmethod
    def env_name(cls, field: str) -> str:
        """The environment variable that sets ``field``."""
        info: FieldInfo | None = cls.model_fields.get(field)
        alias = info.validation_alias if info is not None else None
        if isinstance(alias, str):
            return alias
        if isinstance(alias, AliasChoices):  # (field name, VARIABLE): the variable is the last string
            names = [choice for choice in alias.choices if isinstance(choice, str)]
            return names[-1] if names else field.upper()
        return str(cls.model_config.get("env_prefix", "")) + field.upper()

    @classmethod
    def env_names(cls) -> frozenset[str]:
        """Every environment variable this class reads."""
        return frozenset(cls.env_name(field) for field in cls.model_fields)

    @classmethod
    def _problem(cls, error: Any, env: Mapping[str, str], given: Mapping[str, Any]) -> tuple[str, str]:
        field = str(error["loc"][0]) if error.get("loc") else ""
        message = str(error.get("msg", "invalid"))
        message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if not field:
            return ("settings", message)
        variable = cls.env_name(field)
        if field in given:  # a flag: --name after the variable's name
            flag = "--" + variable.removeprefix(str(cls.model_config.get("env_prefix", ""))).lower().replace("_", "-")
            return (f"{flag}={given[field]!r}", message)
        if variable not in env:
            return (f"{field}={error.get('input')!r}", message)
        return (f"{variable}={env[variable]!r}", message)


class UnknownSettings(VocabularyError):
    """Variables with a component's prefix that none of its settings declares (a typo, or a
    setting that no longer exists): refused at start-up instead of silently ignored."""

    def __init__(self, unknown: list[tuple[str, list[str]]]) -> None:
        self.unknown = unknown
        parts = [
            f"unknown setting {name}" + (f"; did you mean {' or '.join(close)}?" if close else "")
            for name, close in unknown
        ]
        super().__init__("; ".join(parts), hint="remove it or correct its name; the README lists every setting")


def refuse_unknown(
    environ: Mapping[str, str], prefix: str, known: Iterable[str], *, known_prefixes: Iterable[str] = ()
) -> None:
    """Raise :class:`UnknownSettings` naming each ``prefix*`` variable of ``environ`` that is
    not in ``known`` and starts with none of ``known_prefixes``, with its close matches."""
    names = sorted(set(known))
    starts = tuple(known_prefixes)
    unknown = [
        (name, difflib.get_close_matches(name, names, n=2, cutoff=0.8))
        for name in sorted(environ)
        if name.startswith(prefix) and name not in names and not (starts and name.startswith(starts))
    ]
    if unknown:
        raise UnknownSettings(unknown)


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def parse_flag(value: Any) -> bool:
    """The one boolean syntax of every setting: 1/0, true/false, yes/no, on/off (empty: false)."""
    if isinstance(value, bool):
        return value
    lowered = str(value).strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{value!r} is not a boolean (expected 1/0, true/false, yes/no or on/off)")


#: A boolean setting, in :func:`parse_flag`'s syntax.
Flag = Annotated[bool, BeforeValidator(parse_flag)]

__all__ = ["EnvSettings", "Flag", "InvalidSettings", "UnknownSettings", "parse_flag", "refuse_unknown"]
