"""The native unpack fuzzer's harness (``tools/fuzz/native_unpack.py``) runs, and reports a difference.

The coverage-guided campaign needs atheris and clang and is run by a person; the suite runs
the same harness on its seeds and random damage (``--replay``), with the extension built as
for ``tests/dsagent/format/test_native.py``, so that the harness cannot rot.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dsagent.errors import IntegrityError
from dsagent.format import native
from tests.dsagent.format import test_native
from tools.fuzz import native_unpack

extension = test_native.extension  # the fixtures that build or find the extension
with_native = test_native.with_native

pytestmark = pytest.mark.slow  # builds the extension with the C compiler where it is not built


def test_both_loops_agree_on_the_seeds_and_their_damage(with_native: ModuleType, tmp_path: Path) -> None:
    harness = native_unpack.Harness(tmp_path)
    assert native_unpack.replay(harness, 300, seed=7) == len(native_unpack.seeds()) + 300
    assert list(tmp_path.glob("t*")) == []  # every target removed


def test_a_difference_between_the_loops_is_reported(
    with_native: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuses(*args: Any, **kwargs: Any) -> None:
        raise IntegrityError("a native loop that refuses a good bundle")

    monkeypatch.setattr(native, "extract_members", refuses)
    with pytest.raises(native_unpack.Mismatch, match="refuses a good bundle"):
        native_unpack.Harness(tmp_path).one_input(native_unpack.seeds()[0])
    assert native_unpack.main(["--replay", "0"]) == 1
    assert "the loops differ" in capsys.readouterr().err


def test_replay_from_the_command_line(with_native: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert native_unpack.main(["--replay", "20", "--seed", "3"]) == 0
    assert capsys.readouterr().out.strip() == f"{len(native_unpack.seeds()) + 20} inputs, no difference"


def test_replay_without_the_extension_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(native, "AVAILABLE", False)
    assert native_unpack.main(["--replay", "1"]) == 2
    assert "not built" in capsys.readouterr().err
