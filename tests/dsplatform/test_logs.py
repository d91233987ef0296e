"""One log handler and one format per process: text or JSON lines, uvicorn's
loggers through the same handler, and the access log only when asked for."""

from __future__ import annotations

import io
import json
import logging

import pytest

from dsplatform import logs


def test_a_json_line_has_time_level_logger_message_the_extras_and_the_traceback() -> None:
    out = io.StringIO()
    logs.configure("info", "json", stream=out)
    log = logging.getLogger("dsagent.test")
    log.warning("dataset failed: %s", "gone", extra={"code": "not_found", "task": "t-1"})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("it broke")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["level"] == "warning" and first["logger"] == "dsagent.test"
    assert first["message"] == "dataset failed: gone"
    assert (first["code"], first["task"]) == ("not_found", "t-1")
    assert first["time"].endswith("Z") and first["time"][10] == "T"
    assert second["level"] == "error" and "ValueError: boom" in second["exception"]


def test_uvicorn_loggers_go_through_the_one_handler_even_after_uvicorn_set_its_own() -> None:
    logging.getLogger("uvicorn.error").addHandler(logging.StreamHandler(io.StringIO()))  # as uvicorn's dictConfig does
    logging.getLogger("uvicorn.error").propagate = False
    logging.getLogger("uvicorn.error").setLevel("WARNING")  # a test server's log_level="warning" left this
    out = io.StringIO()
    logs.configure("info", "json", stream=out)
    logging.getLogger("uvicorn.error").info("Application startup complete.")
    logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", "/healthz", "1.1", 200)
    startup, access = (json.loads(line) for line in out.getvalue().splitlines())
    assert startup["logger"] == "uvicorn.error"
    assert {k: access[k] for k in ("client", "method", "path", "http_version", "status")} == {
        "client": "127.0.0.1:5",
        "method": "GET",
        "path": "/healthz",
        "http_version": "1.1",
        "status": 200,
    }


def test_configuring_twice_leaves_one_handler_and_text_is_the_default_shape() -> None:
    logs.configure("info", "json", stream=io.StringIO())
    out = io.StringIO()
    logs.configure("warning", "text", stream=out)
    assert len(logging.getLogger().handlers) == 1
    logging.getLogger("x").info("dropped: below warning")
    logging.getLogger("x").warning("kept")
    (line,) = out.getvalue().splitlines()
    assert line.endswith(" WARNING x: kept")


@pytest.mark.parametrize("bad", ["xml", "JSONL", ""])
def test_an_unknown_format_is_refused_in_one_line(bad: str) -> None:
    from dsagent.envsettings import AgentLogSettings
    from dsagent.errors import SettingsError
    from scheduler_plugin.errors import SettingsError as ExtenderSettingsError
    from scheduler_plugin.settings import Settings as ExtenderSettings

    with pytest.raises(SettingsError, match=r"DSAGENT_LOG_FORMAT=.*unknown log format .*use one of text, json"):
        AgentLogSettings.from_env({"DSAGENT_LOG_FORMAT": bad})
    with pytest.raises(ExtenderSettingsError, match=r"DSEXT_LOG_FORMAT=.*unknown log format"):
        ExtenderSettings.from_env({"DSEXT_LOG_FORMAT": bad})


def test_the_settings_read_format_and_access_log_for_every_process_family() -> None:
    from dsagent.cache.settings import Settings
    from dsagent.envsettings import AgentLogSettings
    from scheduler_plugin.settings import Settings as ExtenderSettings

    env = {"DSAGENT_LOG_FORMAT": "JSON", "DSAGENT_ACCESS_LOG": "yes", "DSAGENT_LOG_LEVEL": "DEBUG"}
    for got in (AgentLogSettings.from_env(env), Settings.from_env(env)):
        assert (got.log_level, got.log_format, got.access_log) == ("debug", "json", True)
    ext = ExtenderSettings.from_env({"DSEXT_LOG_FORMAT": "json", "DSEXT_ACCESS_LOG": "1"})
    assert (ext.log_format, ext.access_log) == ("json", True)
    assert logs.uvicorn_options(ext) == {"log_config": None, "log_level": "info", "access_log": True}
    assert AgentLogSettings.from_env({}).access_log is False
