"""The CLI edge turns deliberate errors into one line and their exit code."""

from __future__ import annotations

import click
import pytest

from dsagent import errors
from dsagent.cli import cli, main


@pytest.mark.parametrize(
    ("error", "exit_code"),
    [
        (errors.InvalidInput("bad size '12XB'"), 2),
        (errors.NotFound("no dataset 'x'"), 3),
        (errors.IntegrityError("digest mismatch"), 5),
        (errors.AgentUnreachable("no agent at /run/dsagent.sock"), 8),
    ],
)
def test_deliberate_errors_become_one_line_and_their_exit_code(
    error: errors.DsagentError, exit_code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    @cli.command("explode-for-test")
    def explode() -> None:
        raise error

    try:
        with pytest.raises(SystemExit) as excinfo:
            main(["explode-for-test"])
    finally:
        cli.commands.pop("explode-for-test")
    assert excinfo.value.code == exit_code
    err = capsys.readouterr().err
    assert err.strip() == f"dsctl: error: {error}"


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        main(["no-such-command"])
    assert excinfo.value.code == click.UsageError.exit_code
    assert "No such command" in capsys.readouterr().err


def test_errors_render_their_hint() -> None:
    error = errors.AgentUnreachable("no agent at /run/dsagent.sock", hint="start it with 'dsagent serve'")
    assert str(error) == "no agent at /run/dsagent.sock (start it with 'dsagent serve')"
    assert error.to_dict() == {
        "code": "agent_unreachable",
        "message": "no agent at /run/dsagent.sock",
        "hint": "start it with 'dsagent serve'",
    }
