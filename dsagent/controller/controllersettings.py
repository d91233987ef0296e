"""The Dataset controller's settings: ``DSAGENT_CONTROLLER_*`` (and the agents' admin token).

Who reads it: :func:`dsagent.controller.process.main` at start-up (``from_env``); tests
build it with keywords. Every feature's switch and presets live here, passed down as values.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import AliasChoices, BeforeValidator, Field, InstanceOf, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from dsagent.envsettings import AgentLogSettings
from dsagent.errors import SettingsError
from dsagent.policy.preparation import Thresholds
from dsplatform.gpus import GPU_RESOURCE, RESOURCE_PREFIX
from dsplatform.settings import EnvSettings, Flag, Switch, UnitShare, not_from_env, read_secret_file
from dsplatform.units import Duration, Size
from dsplatform.wire import copycounts
from scheduling.timemodel import DEFAULT_FORMULA, check_formula

CONTROLLER_PREFIX = "DSAGENT_CONTROLLER_"
_PRESETS = Thresholds()  # next-job preparation's default presets


def _controller_env(name: str, field: str) -> Any:
    """The field's variable is ``DSAGENT_CONTROLLER_<name>``; its own name still works as a keyword."""
    return AliasChoices(field, CONTROLLER_PREFIX + name)


def _off_is_none(value: Any) -> Any:
    """``off``, ``none`` or ``0`` (any case): the feature is off."""
    return None if isinstance(value, str) and value.strip().lower() in ("off", "none", "0") else value


def _copies_configmap(value: Any) -> Any:
    """``off`` or ``none`` (any case): the controller publishes no copy counts."""
    return None if isinstance(value, str) and value.strip().lower() in ("off", "none") else value


class ControllerSettings(EnvSettings):
    """``DSAGENT_CONTROLLER_*`` (and the agents' admin token, ``DSAGENT_ADMIN_TOKEN[_FILE]``);
    an empty variable means its default."""

    model_config = SettingsConfigDict(env_prefix=CONTROLLER_PREFIX, env_ignore_empty=True)
    settings_error: ClassVar[type[Exception] | None] = SettingsError

    namespace: str = "default"  # where the Lease and the pack Jobs live
    lease_name: str = Field("dsplatform-dataset-controller", validation_alias=_controller_env("LEASE", "lease_name"))
    identity: str = Field(default_factory=socket.gethostname)
    resync_s: Duration = Field(30.0, validation_alias=_controller_env("RESYNC", "resync_s"))
    pack_image: str = "ghcr.io/dsplatform/dsplatform:0.1.0"
    pack_service_account: str | None = None
    agent_selector: str = "app.kubernetes.io/component=agent"
    agent_port: int = 7420
    admin_token: str | None = Field(
        None, repr=False, validation_alias=AliasChoices("admin_token", "DSAGENT_ADMIN_TOKEN")
    )
    admin_token_file: Path | None = Field(
        None, repr=False, validation_alias=AliasChoices("admin_token_file", "DSAGENT_ADMIN_TOKEN_FILE")
    )
    metrics_port: int | None = None  # serve /metrics (and /healthz) here; 0 or unset: not served
    # where agents read copy counts; None ("off"): not published
    copies_configmap: Annotated[str | None, BeforeValidator(_copies_configmap)] = copycounts.CONFIGMAP
    # next-job preparation (docs/design.md#next-job-preparation): auto (the default), only the
    # pods a running pod names as its follow-up (dsagent.io/next-job); on, every waiting pod
    # (Kueue's or Volcano's order, else the replay's prediction); off, none. With these
    # presets; ``prepare`` is what the controller uses (None: off), built from them
    prepare_enabled: Switch = Field("auto", validation_alias=_controller_env("PREPARE", "prepare_enabled"))
    prepare_window: Duration = _PRESETS.window_s
    prepare_fetch_lead: Duration = _PRESETS.fetch_lead_s
    prepare_reserve_fraction: float = _PRESETS.reserve_fraction
    prepare_fill_fraction: float = _PRESETS.fill_fraction
    prepare_subtasks_remaining: int = Field(_PRESETS.subtasks_remaining, ge=0)
    prepare: InstanceOf[Thresholds] | None = not_from_env(None)
    # replication: pods started this recently count as demand; "auto" asks for at most this many copies
    replicas_window_s: Duration = Field(
        3600.0, validation_alias=_controller_env("REPLICAS_WINDOW", "replicas_window_s")
    )
    replicas_max: int = 16  # copies one Dataset may hold: "auto" and a number alike (docs/operator-guide/tenancy.md)
    # tenancy bounds (docs/operator-guide/tenancy.md, the chart's tenancy.*)
    warm_nodes_max: int = Field(8, ge=1)
    namespace_share: UnitShare = 0.5  # of any node's cache, through warm-up, replicas and preparation
    namespace_bytes: Size | None = None  # pinned across the cluster; None: no bound beyond the share
    namespace_tasks: int = Field(64, ge=1)
    inventory_max_age: Duration = 300.0  # an older node inventory is used for nothing
    # a draining stripe member's share is held for its new owners at most this long (docs/design-striping.md#churn)
    stripe_drain_timeout_s: Duration = Field(
        600.0, validation_alias=_controller_env("STRIPE_DRAIN_TIMEOUT", "stripe_drain_timeout_s")
    )
    api_timeout_s: Duration = Field(30.0, validation_alias=_controller_env("API_TIMEOUT", "api_timeout_s"))
    # Nodes and NodeCaches kept by list+watch (dsagent/kube/nodewatch.py) rather than listed each pass
    watch_nodes: Flag = Field(True, validation_alias=_controller_env("WATCH_NODES", "watch_nodes"))
    # every pod kept by list+watch (dsagent/kube/podswatch.py), started by the first pass that
    # reads them all, rather than listed at each such pass
    watch_pods: Flag = Field(True, validation_alias=_controller_env("WATCH_PODS", "watch_pods"))
    # store gc Jobs (dsagent/controller/storegc.py) this often; None ("off", "none", "0"): not run
    store_gc_s: Annotated[Duration | None, BeforeValidator(_off_is_none)] = Field(
        None, validation_alias=_controller_env("STORE_GC", "store_gc_s")
    )
    store_gc_grace_s: Duration = Field(  # never delete a bundle younger than this
        7 * 86400.0, validation_alias=_controller_env("STORE_GC_GRACE", "store_gc_grace_s")
    )

    # migration, step 5 of the deadline design: move jobs that opted in (evictions); the GPU
    # resource and the class resources' prefix as the webhook writes them (chart: gpuClasses.*)
    migrate: Flag = Field(False, validation_alias=_controller_env("MIGRATE", "migrate"))
    gpu_resource: str = GPU_RESOURCE
    class_prefix: str = RESOURCE_PREFIX
    # the plan loop (docs/design.md#deadline-plans): plans the gated workers of multi-worker jobs
    # that opt in across nodes and lifts their gate (the webhook gates them: chart controller.planGates);
    # it acts only on pods carrying that gate, which nothing else would lift
    plan_gates: Flag = Field(True, validation_alias=_controller_env("PLAN_GATES", "plan_gates"))
    plan_formula: str = DEFAULT_FORMULA  # (12)'s stand-in the loop ranks plans by (chart: the webhook's)
    # a job still missing workers this long after its first was created is released unplanned
    plan_gates_wait_s: Duration = Field(600.0, validation_alias=_controller_env("PLAN_GATES_WAIT", "plan_gates_wait_s"))

    @field_validator("metrics_port")
    @classmethod
    def _metrics_port(cls, value: int | None) -> int | None:
        return value or None

    @field_validator("plan_formula")
    @classmethod
    def _plan_formula(cls, value: str) -> str:
        return check_formula(value)

    @field_validator("prepare_reserve_fraction", "prepare_fill_fraction")
    @classmethod
    def _fraction(cls, value: float) -> float:
        if not 0 <= value <= 1:
            raise ValueError(f"{value!r} is not a fraction within [0, 1]")
        return value

    @property
    def prepare_named_only(self) -> bool:
        """Preparation of the named follow-ups only (``auto``): no queue read, no prediction."""
        return self.prepare_enabled == "auto"

    @model_validator(mode="after")
    def _whole_settings(self) -> ControllerSettings:
        if self.admin_token is None and self.admin_token_file is not None:
            object.__setattr__(self, "admin_token", read_secret_file(self.admin_token_file, "DSAGENT_ADMIN_TOKEN_FILE"))
        if self.prepare is None and self.prepare_enabled != "off":
            thresholds = Thresholds(
                window_s=self.prepare_window,
                fetch_lead_s=self.prepare_fetch_lead,
                reserve_fraction=self.prepare_reserve_fraction,
                fill_fraction=self.prepare_fill_fraction,
                subtasks_remaining=self.prepare_subtasks_remaining,
            )
            object.__setattr__(self, "prepare", thresholds)
        return self


#: every settings class the controller reads: what its start-up check accepts (dsagent.kube.envnames)
SETTINGS = (ControllerSettings, AgentLogSettings)


__all__ = ["CONTROLLER_PREFIX", "SETTINGS", "ControllerSettings"]
