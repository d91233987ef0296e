"""Settings objects read once from one environment prefix: the base of every component's settings.

Who calls it: :class:`dsagent.cache.settings.Settings` (``DSAGENT_*``), the settings of the
cluster-side processes (the node agent's ``ClusterSettings``, the Dataset controller's
``ControllerSettings``, the webhook's ``WebhookSettings`` and ``GpuClassSettings``) and
:class:`scheduler_plugin.settings.Settings` (``DSEXT_*``): one mechanism for every component.
What it owns: the pydantic-settings wiring those share, so each component only declares
typed fields (with :data:`dsplatform.units.Size` / :data:`~dsplatform.units.Duration` for
sizes and durations):

- the environment is read only by :meth:`EnvSettings.read`, from ``os.environ`` or a
  mapping the caller passes (tests, and ``dsctl`` reading a pod's environment); building a
  settings object directly reads nothing, so tests are not steered by the machine's env;
- keyword overrides (command-line flags) win over the environment; ``None`` means "not given";
- every invalid variable is listed in one :class:`InvalidSettings`, each as
  ``VARIABLE='value': what is wrong (what a good one looks like)``, so a misconfigured
  DaemonSet fails at start-up with one line naming all of its mistakes;
- a field made with :func:`not_from_env` is never read from the environment and is not
  one of :meth:`EnvSettings.env_names` (a value only code passes, or one built from other
  fields), so its name cannot collide with a variable;
- with ``env_ignore_empty=True`` in a class's config, an empty variable means "unset"
  (the default), as the hand-written readers it replaced had it;
- :func:`read_secret_file` is the one way a ``*_FILE`` setting (a mounted Secret) is read.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, AliasChoices, BeforeValidator, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from typing_extensions import Self

from dsplatform.errors import VocabularyError
from dsplatform.flags import parse_flag
from dsplatform.names import is_resource_name, resource_prefix_problem

# (the class being read, its environment): only that class reads it, so a settings object
# built while another is read (a default, a nested one) is not steered by that environment
_ENVIRON: ContextVar[tuple[type[BaseSettings], Mapping[str, str]] | None] = ContextVar(
    "dsplatform_environ", default=None
)


class InvalidSettings(VocabularyError):
    """One or more settings are invalid; ``problems`` lists ``(variable, message)`` pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{where}: {what}" if where else what for where, what in problems))


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        environ = {k: v for k, v in self._environ.items() if not (self.env_ignore_empty and v == "")}
        if self.case_sensitive:
            return environ
        return {key.lower(): value for key, value in environ.items()}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if not _from_env(field):
            return None, field_name, False
        return super().get_field_value(field, field_name)


_NOT_FROM_ENV = "dsplatform_not_from_env"


def not_from_env(default: Any = None, **kwargs: Any) -> Any:
    """A field no variable sets (see the module docstring); ``kwargs`` go to ``Field``
    (``default_factory`` instead of ``default``)."""
    if "default_factory" in kwargs:
        return Field(json_schema_extra={_NOT_FROM_ENV: True}, **kwargs)
    return Field(default, json_schema_extra={_NOT_FROM_ENV: True}, **kwargs)


def _from_env(field: FieldInfo) -> bool:
    extra = field.json_schema_extra
    return not (isinstance(extra, dict) and extra.get(_NOT_FROM_ENV))


def read_secret_file(path: Path, variable: str) -> str:
    """The stripped text of a mounted secret named by ``variable``; a ValueError naming the
    variable when it cannot be read (a configured secret that is missing is an error, not
    "no secret")."""
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"{variable}: cannot read {str(path)!r}: {exc.strerror}") from None


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
        reading = _ENVIRON.get()
        if reading is None or reading[0] is not settings_cls:
            return (init_settings,)
        return (init_settings, _MappingEnvSource(settings_cls, reading[1]))

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None, /, **overrides: Any) -> Self:
        """Settings from the environment (``os.environ`` unless given), flags in ``overrides`` winning."""
        env = os.environ if environ is None else environ
        given = {key: value for key, value in overrides.items() if value is not None}
        token = _ENVIRON.set((cls, env))
        try:
            return cls(**given)
        except ValidationError as exc:
            raise InvalidSettings([cls._problem(error, env, given) for error in exc.errors()]) from None
        finally:
            _ENVIRON.reset(token)

    #: what :meth:`from_env` raises with the problems' one line: the process's own settings
    #: error (its exit code, its error tree); None: :class:`InvalidSettings` itself
    settings_error: ClassVar[type[Exception] | None] = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Self:
        """:meth:`read`, a refusal raised as :attr:`settings_error`: one error lists every bad value."""
        try:
            return cls.read(environ, **overrides)
        except InvalidSettings as exc:
            if cls.settings_error is None:
                raise
            raise cls.settings_error(exc.message) from None

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
        return frozenset(cls.env_name(name) for name, field in cls.model_fields.items() if _from_env(field))

    @classmethod
    def _problem(cls, error: Any, env: Mapping[str, str], given: Mapping[str, Any]) -> tuple[str, str]:
        field = str(error["loc"][0]) if error.get("loc") else ""
        message = str(error.get("msg", "invalid"))
        message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if not field:  # a rule over several fields: its message names the variables
            return ("", message)
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
        super().__init__("; ".join(parts), hint="remove it or correct its name; the settings reference lists every one")


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


#: A boolean setting, in :func:`parse_flag`'s syntax.
Flag = Annotated[bool, BeforeValidator(parse_flag)]


def parse_switch(value: Any) -> str:
    """``on``, ``off`` or ``auto`` (decided where the hardware or cluster carries it); a
    boolean in the flag syntax is ``on`` or ``off``."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return "on" if parse_flag(value) else "off"
    except ValueError:
        raise ValueError(
            f"{value!r} is not a boolean nor auto (expected on, off or auto; true/false, yes/no and 1/0 mean on/off)"
        ) from None


#: A mechanism's switch: on, off, or auto (:func:`parse_switch`).
Switch = Annotated[Literal["on", "off", "auto"], BeforeValidator(parse_switch)]


def check_resource_prefix(value: str) -> str:
    """``value`` if it can prefix an extended resource (:func:`dsplatform.names.resource_prefix_problem`)."""
    problem = resource_prefix_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


#: The prefix of the GPU class resources (``dsagent.io``), one rule for every setting of it.
ResourcePrefix = Annotated[str, AfterValidator(check_resource_prefix)]


def check_gpu_resource(value: str) -> str:
    """``value`` if it is an extended resource name (``nvidia.com/gpu``)."""
    if not is_resource_name(value):
        raise ValueError(f"GPU resource {value!r} is not an extended resource name (e.g. nvidia.com/gpu)")
    return value


#: The plain GPU resource pods ask for (``nvidia.com/gpu``), one rule for every setting of it.
GpuResource = Annotated[str, AfterValidator(check_gpu_resource)]
#: The same, or "" for none.
OptionalGpuResource = Annotated[str, AfterValidator(lambda value: value and check_gpu_resource(value))]


def check_share(value: float) -> float:
    """``value`` if it is a share of a whole within (0, 1] (1: all of it)."""
    if not 0 < value <= 1:
        raise ValueError(f"{value!r} is not a share within (0, 1]")
    return value


#: A share of a whole within (0, 1], e.g. the part of a node's cache one namespace may pin.
UnitShare = Annotated[float, AfterValidator(check_share)]

__all__ = [
    "EnvSettings",
    "Flag",
    "GpuResource",
    "OptionalGpuResource",
    "Switch",
    "UnitShare",
    "InvalidSettings",
    "ResourcePrefix",
    "UnknownSettings",
    "check_gpu_resource",
    "check_resource_prefix",
    "not_from_env",
    "parse_flag",
    "parse_switch",
    "read_secret_file",
    "refuse_unknown",
]
