"""The C layout checks (native/layout.c) give the pure-Python rule's answers, path for path.

The extension is found or privately built as in test_native.py (skipped without a compiler).
"""

from __future__ import annotations

from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsagent.errors import InvalidInput
from dsagent.format import entries
from tests.dsagent.format import test_native

extension = test_native.extension  # the fixtures that build or find the extension
with_native = test_native.with_native

pytestmark = pytest.mark.slow  # builds the extension with the C compiler where it is not built

# components a path is made of: plain names, the refused ones, NULs, wide and surrogate
# characters (a file name that is not UTF-8 reads back with surrogates)
_COMPONENTS = st.sampled_from(["a", "b.c", "", ".", "..", "...", ".a", "a\x00", "é", "\U0001f600", "\udcff", "x" * 70])
_PATHS = st.lists(_COMPONENTS, min_size=1, max_size=4).map("/".join)


def _python_first_unsafe(paths: list[str]) -> int:
    return next((i for i, p in enumerate(paths) if not entries.is_safe_path(p)), -1)


@given(st.lists(_PATHS, max_size=12))
def test_the_c_path_check_finds_the_python_rules_first_unsafe_path(extension: ModuleType, paths: list[str]) -> None:
    assert extension.first_unsafe(paths) == _python_first_unsafe(paths)
    assert extension.first_unsafe(tuple(paths)) == _python_first_unsafe(paths)  # any sequence


@given(st.lists(_PATHS, max_size=12))
def test_the_c_parents_are_the_python_parents(extension: ModuleType, paths: list[str]) -> None:
    for ordered in (paths, sorted(paths)):
        assert extension.parents(ordered) == {p.rpartition("/")[0] for p in ordered}


@pytest.mark.parametrize(
    "path", ["", "/a", "a/", "a//b", "./a", "a/.", "a/../b", "..", "a\x00b", "é/../x", "\udcff/./y"]
)
def test_the_c_path_check_refuses_what_the_rule_refuses(extension: ModuleType, path: str) -> None:
    assert not entries.is_safe_path(path)
    assert extension.first_unsafe(["ok", "fine/too", path, "/later"]) == 2


def test_the_c_checks_take_only_paths(extension: ModuleType) -> None:
    with pytest.raises(TypeError):
        extension.first_unsafe(["a", b"b"])
    with pytest.raises(TypeError):
        extension.parents(["a/b", 3])
    with pytest.raises(TypeError):
        extension.first_unsafe(5)


@pytest.mark.parametrize(
    ("paths", "directories", "message"),
    [
        (["a", "b/../c"], [], "unsafe path"),
        (["a", "a"], [], "duplicate path"),
        (["a", "a/b"], [], "both a file and a directory"),
        (["a/b", "c"], ["a"], "is not empty"),
    ],
)
def test_a_layout_check_with_the_c_loops_refuses_as_the_python_one(
    with_native: ModuleType, monkeypatch: pytest.MonkeyPatch, paths: list[str], directories: list[str], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        entries.check_layout(paths, directories)
    monkeypatch.setattr(entries.native, "AVAILABLE", False)
    with pytest.raises(InvalidInput, match=message):
        entries.check_layout(paths, directories)
