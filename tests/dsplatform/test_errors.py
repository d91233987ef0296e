"""The platform's one error base, its families, and the process edge every entry point runs under."""

from __future__ import annotations

import pytest

from dsplatform.errors import PlatformError, Unavailable, exit_on_error
from dsplatform.units import UnitError, parse_size


def test_vocabulary_errors_are_value_errors_with_their_hint() -> None:
    with pytest.raises(UnitError) as caught:
        parse_size("12XB")
    error = caught.value
    assert isinstance(error, ValueError) and isinstance(error, PlatformError)
    assert error.hint and str(error) == f"{error.message} ({error.hint})"
    assert error.to_dict() == {"code": "invalid_input", "message": error.message, "hint": error.hint}


def test_the_process_edge_prints_one_line_and_exits_with_the_errors_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited, exit_on_error("prog"):
        raise Unavailable("the cluster view is not synced", hint="wait for the watch")
    assert exited.value.code == 7
    assert capsys.readouterr().err == "prog: error: the cluster view is not synced (wait for the watch)\n"


def test_the_process_edge_lets_a_bug_keep_its_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(KeyError), exit_on_error("prog"):
        raise KeyError("bug")
    assert capsys.readouterr().err == ""
