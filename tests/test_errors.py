"""One error base, every public error drawn in its tree, exit codes set only at the process edges."""

from __future__ import annotations

import ast
import importlib
import inspect
import re

import pytest

from dsagent.errors import InvalidInput as AgentInvalidInput
from dsagent.errors import TransientError
from dsplatform.errors import InvalidInput, PlatformError, Unavailable, VocabularyError
from gpu_topology.errors import DiscoveryError, InvalidTopology
from scheduler_plugin.errors import InvalidRequest, ViewUnavailable
from tests.conftest import REPO_ROOT
from tests.test_exit_codes import PACKAGES, all_modules

#: public exception classes that are not platform errors on purpose, and why
NOT_PLATFORM_ERRORS = {
    # the kernel's write error with its errno: an OSError so that the callers' OSError handling
    # sees it; cache.fetch and format.extract translate it into the tree where it enters
    "dsagent.format.durable.WritebackError",
    # raised inside json.loads' object_pairs_hook (a ValueError, as json's own errors are) and
    # turned into the refusal of whoever parses: JsonRefused, the extender's BodyNotJson
    "dsplatform.boundedjson.DuplicateKey",
}

#: the only files that turn an error into an exit code: the process edge every entry point
#: runs under, and dsctl's (click's usage errors in the click group's run, Ctrl-C and bugs in
#: the edge both ways into dsctl share)
EXIT_EDGES = {"dsplatform/errors.py", "dsagent/cli/group.py", "dsagent/cli/edge.py"}


def public_exception_classes() -> list[type[BaseException]]:
    found = []
    for name in all_modules():
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional dependency (e.g. NVML) is missing
            continue
        for attr, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == name
                and not attr.startswith("_")
            ):
                found.append(value)
    return found


def test_the_walk_finds_the_errors_beside_their_code() -> None:
    names = {f"{c.__module__}.{c.__qualname__}" for c in public_exception_classes()}
    assert {
        "dsagent.errors.Conflict",
        "dsagent.kube.apiclient.KubeForbidden",
        "dsagent.nodeplugins.deviceplugin.allocation.NoFreeVf",
        "gpu_topology.errors.ParseError",
        "scheduling.timemodel.AnnotationError",
        "dsplatform.units.UnitError",
    } <= names


def test_every_public_error_derives_from_the_one_base() -> None:
    strays = [
        f"{c.__module__}.{c.__qualname__}"
        for c in public_exception_classes()
        if not issubclass(c, PlatformError) and f"{c.__module__}.{c.__qualname__}" not in NOT_PLATFORM_ERRORS
    ]
    assert strays == []


def test_every_public_error_is_drawn_in_its_packages_tree() -> None:
    for cls in public_exception_classes():
        package = cls.__module__.split(".")[0]
        drawing = importlib.import_module(f"{package}.errors").__doc__ or ""
        assert re.search(rf"\b{cls.__name__}\b", drawing), f"{cls.__module__}.{cls.__name__} is not in {package}.errors"


def test_the_three_trees_share_the_families_and_their_facts() -> None:
    for cls in (AgentInvalidInput, InvalidTopology, InvalidRequest, VocabularyError):
        assert issubclass(cls, InvalidInput)
        assert (cls.http_status, cls.exit_code, cls.grpc_status) == (400, 2, "INVALID_ARGUMENT")
    for cls in (TransientError, DiscoveryError, ViewUnavailable):
        assert issubclass(cls, Unavailable)
        assert (cls.http_status, cls.exit_code, cls.grpc_status) == (503, 7, "UNAVAILABLE")
    # each tree keeps its own code
    assert [c.code for c in (AgentInvalidInput, InvalidTopology, InvalidRequest)] == [
        "invalid_input",
        "invalid_topology",
        "invalid_request",
    ]


def test_every_error_names_a_grpc_status() -> None:
    grpc = pytest.importorskip("grpc")
    for cls in public_exception_classes():
        if issubclass(cls, PlatformError):
            assert cls.grpc_status in grpc.StatusCode.__members__, f"{cls.__name__}: {cls.grpc_status!r}"


def _exit_setters(path: str, tree: ast.AST) -> list[str]:
    """Calls that exit with a literal code, and every read of an error's ``exit_code``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "exit_code" and isinstance(node.ctx, ast.Load):
            found.append(f"{path}:{node.lineno} reads .exit_code")
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            callee = ast.unparse(node.func)
            if callee in ("sys.exit", "SystemExit", "os._exit", "ctx.exit") and isinstance(node.args[0].value, int):
                found.append(f"{path}:{node.lineno} {callee}({node.args[0].value})")
    return sorted(found)


def test_only_the_process_edges_turn_errors_into_exit_codes() -> None:
    setters = []
    for package in PACKAGES:
        for file in sorted((REPO_ROOT / package).rglob("*.py")):
            path = file.relative_to(REPO_ROOT).as_posix()
            if path not in EXIT_EDGES:
                setters += _exit_setters(path, ast.parse(file.read_text(encoding="utf-8")))
    assert setters == []


def test_the_exit_check_sees_what_it_forbids() -> None:
    source = "import sys\ndef f(exc):\n    sys.exit(7)\n    return exc.exit_code\n"
    assert _exit_setters("x.py", ast.parse(source)) == ["x.py:3 sys.exit(7)", "x.py:4 reads .exit_code"]
