"""The controller's and the webhook's settings are pydantic-settings classes like
every other process's (dsplatform.settings): same variables and defaults as the
hand-written readers they replace, every bad variable named in one line (exit 2)
instead of a traceback, and the platform's one boolean syntax and secret-file rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsagent.controller import process
from dsagent.controller.controllersettings import ControllerSettings
from dsagent.errors import SettingsError
from dsagent.policy.preparation import Thresholds
from dsagent.webhook import server
from dsagent.webhook.gpurequest import GpuClassSettings
from dsplatform.gpus import GPU_RESOURCE
from dsplatform.jobs import DEFAULT_JOB_LABELS
from dsplatform.wire import copycounts


def test_the_controllers_defaults_are_the_old_readers() -> None:
    s = ControllerSettings.from_env({})
    assert (s.namespace, s.lease_name, s.resync_s, s.pack_image, s.pack_service_account) == (
        "default",
        "dsplatform-dataset-controller",
        30.0,
        "ghcr.io/dsplatform/dsplatform:0.1.0",
        None,
    )
    assert (s.agent_selector, s.agent_port, s.admin_token, s.metrics_port, s.copies_configmap) == (
        "app.kubernetes.io/component=agent",
        7420,
        None,
        None,
        copycounts.CONFIGMAP,
    )
    assert (s.prepare_enabled, s.replicas_window_s, s.replicas_max) == ("auto", 3600.0, 16)
    assert s.prepare == Thresholds()  # the named follow-ups only, at the presets' defaults
    assert s.identity  # the host name


def test_the_controller_reads_every_variable_and_an_empty_one_means_its_default(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("0123456789abcdef\n")
    env = {
        "DSAGENT_CONTROLLER_NAMESPACE": "dsp",
        "DSAGENT_CONTROLLER_LEASE": "ctl",
        "DSAGENT_CONTROLLER_IDENTITY": "ctl-0",
        "DSAGENT_CONTROLLER_RESYNC": "1m",
        "DSAGENT_CONTROLLER_PACK_IMAGE": "",
        "DSAGENT_CONTROLLER_AGENT_PORT": "7421",
        "DSAGENT_CONTROLLER_METRICS_PORT": "0",
        "DSAGENT_CONTROLLER_COPIES_CONFIGMAP": "None",
        "DSAGENT_CONTROLLER_PREPARE": "on",
        "DSAGENT_CONTROLLER_PREPARE_WINDOW": "1h",
        "DSAGENT_CONTROLLER_PREPARE_FILL_FRACTION": "0.8",
        "DSAGENT_CONTROLLER_PREPARE_SUBTASKS_REMAINING": "3",
        "DSAGENT_CONTROLLER_REPLICAS_WINDOW": "2h",
        "DSAGENT_CONTROLLER_REPLICAS_MAX": "4",
        "DSAGENT_ADMIN_TOKEN_FILE": str(tmp_path / "token"),
    }
    s = ControllerSettings.from_env(env)
    assert (s.namespace, s.lease_name, s.identity, s.resync_s, s.pack_image) == (
        "dsp",
        "ctl",
        "ctl-0",
        60.0,
        "ghcr.io/dsplatform/dsplatform:0.1.0",
    )
    assert (s.agent_port, s.metrics_port, s.copies_configmap, s.admin_token) == (7421, None, None, "0123456789abcdef")
    assert s.prepare == Thresholds(
        window_s=3600, fetch_lead_s=600, reserve_fraction=0.3, fill_fraction=0.8, subtasks_remaining=3
    )
    assert (s.replicas_window_s, s.replicas_max) == (7200.0, 4)
    # code (tests, the simulator) may still hand the presets over directly
    presets = Thresholds(window_s=5, fetch_lead_s=1, reserve_fraction=0.5, fill_fraction=0.9)
    assert ControllerSettings(prepare=presets).prepare is presets


def test_bad_controller_variables_are_all_named_in_one_settings_error() -> None:
    """The old reader raised a bare ValueError (a traceback) on the first bad number."""
    env = {
        "DSAGENT_CONTROLLER_AGENT_PORT": "http",
        "DSAGENT_CONTROLLER_RESYNC": "soon",
        "DSAGENT_CONTROLLER_PREPARE_FILL_FRACTION": "1.5",
    }
    with pytest.raises(SettingsError) as caught:
        ControllerSettings.from_env(env)
    message = caught.value.message
    assert "\n" not in message and caught.value.exit_code == 2
    for name in env:
        assert f"{name}={env[name]!r}" in message, message


@pytest.mark.parametrize(
    ("value", "mode"),
    [("on", "on"), ("yes", "on"), ("1", "on"), ("off", "off"), ("0", "off"), ("auto", "auto"), ("", "auto")],
)
def test_prepare_takes_the_platforms_switch_syntax(value: str, mode: str) -> None:
    """Which rule won: dsplatform.settings.Switch's (the flag syntax, or auto; empty: the
    default, auto). The old reader took only on/true/1 and read anything else, "yes" and
    typos included, as off."""
    s = ControllerSettings.from_env({"DSAGENT_CONTROLLER_PREPARE": value})
    assert s.prepare_enabled == mode
    assert (s.prepare is not None) is (mode != "off")
    assert s.prepare_named_only is (mode == "auto")


def test_a_typo_in_prepare_is_refused_not_read_as_off() -> None:
    with pytest.raises(SettingsError, match="DSAGENT_CONTROLLER_PREPARE='of': 'of' is not a boolean"):
        ControllerSettings.from_env({"DSAGENT_CONTROLLER_PREPARE": "of"})


def test_a_configured_admin_token_file_that_cannot_be_read_is_an_error(tmp_path: Path) -> None:
    """Which rule won: the agent's (a named secret that is missing is an error). The old
    controller reader went on without a token and every agent call failed later."""
    with pytest.raises(SettingsError, match="DSAGENT_ADMIN_TOKEN_FILE: cannot read"):
        ControllerSettings.from_env({"DSAGENT_ADMIN_TOKEN_FILE": str(tmp_path / "missing")})


def test_the_controller_process_names_a_bad_variable_in_one_line_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DSAGENT_PROTOCOLS", raising=False)  # the suite's agents' settings, not this process's
    monkeypatch.delenv("DSAGENT_EGRESS_ALLOW", raising=False)
    monkeypatch.setenv("DSAGENT_CONTROLLER_AGENT_PORT", "http")
    with pytest.raises(SystemExit) as caught:
        process.main()
    assert caught.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "DSAGENT_CONTROLLER_AGENT_PORT='http'" in err, err


@pytest.fixture
def injection_file(tmp_path: Path) -> Path:
    path = tmp_path / "injection.json"
    path.write_text(json.dumps({"image": "registry.example/dsp:1"}))
    return path


def test_the_webhooks_defaults_and_its_gpu_classes_from_the_same_variables(injection_file: Path) -> None:
    s = server.WebhookSettings.from_env(
        {
            "DSAGENT_WEBHOOK_INJECTION_FILE": str(injection_file),
            "DSAGENT_WEBHOOK_LISTEN": "",
            "DSAGENT_WEBHOOK_GPU_CLASSES": "true",
            "DSAGENT_WEBHOOK_GPU_RESOURCE": "",
        }
    )
    assert (s.host, s.port, s.cert_file, s.key_file, s.kubeconfig) == ("0.0.0.0", 8443, None, None, None)
    assert s.injection is not None and s.injection.image == "registry.example/dsp:1"
    assert (s.gpu_classes.enabled, s.gpu_classes.gpu_resource) == (True, GPU_RESOURCE)


def test_the_webhook_names_every_bad_variable_of_both_classes_in_one_line(injection_file: Path) -> None:
    env = {
        "DSAGENT_WEBHOOK_INJECTION_FILE": str(injection_file),
        "DSAGENT_WEBHOOK_LISTEN": "8443",
        "DSAGENT_WEBHOOK_JOB_TTL": "soon",
    }
    with pytest.raises(SettingsError) as caught:
        server.WebhookSettings.from_env(env)
    assert "DSAGENT_WEBHOOK_LISTEN='8443': invalid listen address" in caught.value.message
    assert "DSAGENT_WEBHOOK_JOB_TTL='soon': invalid duration" in caught.value.message


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "^DSAGENT_WEBHOOK_INJECTION_FILE is not set"),
        ({"DSAGENT_WEBHOOK_CERT_FILE": "/tls.crt"}, "^set both DSAGENT_WEBHOOK_CERT_FILE and DSAGENT_WEBHOOK_KEY_FILE"),
        ({"DSAGENT_WEBHOOK_INJECTION_FILE": "/nonexistent.json"}, "^DSAGENT_WEBHOOK_INJECTION_FILE: cannot read"),
    ],
)
def test_the_webhooks_whole_settings_rules_keep_their_messages(
    env: dict[str, str], message: str, injection_file: Path
) -> None:
    if "DSAGENT_WEBHOOK_CERT_FILE" in env:
        env = {**env, "DSAGENT_WEBHOOK_INJECTION_FILE": str(injection_file)}
    with pytest.raises(SettingsError, match=message):
        server.WebhookSettings.from_env(env)


def test_gpu_class_settings_keep_the_old_readers_rules() -> None:
    assert GpuClassSettings.from_env({}) == GpuClassSettings()
    assert GpuClassSettings().job_labels == DEFAULT_JOB_LABELS
    assert GpuClassSettings.from_env({"DSAGENT_WEBHOOK_JOB_LABELS": " , "}).job_labels == DEFAULT_JOB_LABELS
    assert GpuClassSettings.from_env({"DSAGENT_WEBHOOK_JOB_TTL": "0.5s"}).lease_ttl_s == 1  # whole seconds, >= 1
    assert GpuClassSettings.from_env({"DSAGENT_WEBHOOK_NETWORKS": " dsp/n-{class} "}).networks == "dsp/n-{class}"
    # the vote cache's lifetime is no variable
    assert "DSAGENT_WEBHOOK_NODES_TTL_S" not in GpuClassSettings.env_names()
    assert GpuClassSettings.from_env({"DSAGENT_WEBHOOK_NODES_TTL_S": "60"}).nodes_ttl_s == 5.0
