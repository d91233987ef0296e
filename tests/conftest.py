"""Shared pytest configuration; fixtures specific to one package live beside its tests."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tools.support.fake_apiserver import FakeApiServer
from tools.support.s3server import S3Server

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"


#: Fixtures that start a real process per test (an agent) or per worker (the S3 server): a
#: test using one is ``slow`` whether or not it says so, and ``make check`` leaves it out.
PROCESS_FIXTURES = frozenset({"agent_factory", "s3_server"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


# ``make check`` (``-m "not slow"``) says how many tests it left out. pytest does so itself
# without pytest-xdist; with it, each worker counts what it deselected and the controller,
# which collects nothing, prints the count from their reports.
_DESELECTED = pytest.StashKey[int]()


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        config = items[0].config
        config.stash[_DESELECTED] = config.stash.get(_DESELECTED, 0) + len(items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)  # set in an xdist worker only
    if output is not None:
        output["deselected"] = session.config.stash.get(_DESELECTED, 0)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    deselected = getattr(node, "workeroutput", {}).get("deselected", 0)
    node.config.stash[_DESELECTED] = max(node.config.stash.get(_DESELECTED, 0), deselected)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    deselected = config.stash.get(_DESELECTED, 0)
    expression = config.getoption("markexpr") or ""
    if deselected and expression and getattr(config, "workerinput", None) is None:
        terminalreporter.write_line(f"{deselected} tests deselected (-m {expression!r}); make test runs every test")


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """``tests/fixtures``: real outputs of real machines, each beside a ``.src`` provenance file."""
    return FIXTURES_DIR


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path under /tmp: unix socket paths (the kubelet's device
    plugin and pod-resources sockets) are limited to 107 bytes, and pytest's tmp_path is long."""
    path = Path(tempfile.mkdtemp(prefix="sock-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3 server (moto in server mode) on 127.0.0.1, shared by the session."""
    server = S3Server(tmp_path_factory.mktemp("s3") / "moto.log")
    yield server
    server.close()


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The S3 server emptied, with its credentials in this process's environment (as a pod
    gets them from a Secret) and no other AWS configuration."""
    s3_server.reset()
    isolate_aws(monkeypatch)
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    return s3_server


def isolate_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS credentials or configuration from the machine running the tests."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/dsplatform-tests")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/dsplatform-tests")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # instances keep the credentials they found


#: Tests cache from fsspec's process-local ``memory://`` filesystem, which no agent allows
#: by default (DSAGENT_PROTOCOLS); agents started by tests allow it too.
TEST_PROTOCOLS = ("s3", "gs", "az", "http", "https", "file", "memory")


#: The suite's servers listen on loopback, which no agent fetches from for a request by
#: default (dsagent.format.egress): the suite allows it as an operator would
#: (DSAGENT_EGRESS_ALLOW), for agents built in-process and for agent processes alike.
TEST_EGRESS_ALLOW = ("127.0.0.0/8", "::1")


@pytest.fixture(autouse=True)
def _memory_sources_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    from dsagent.format import egress, sources

    monkeypatch.setattr(sources, "DEFAULT_PROTOCOLS", TEST_PROTOCOLS)
    monkeypatch.setattr(egress, "DEFAULT_ALLOWED", TEST_EGRESS_ALLOW)


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """A process main run in-process (a settings test) calls dsplatform.logs.configure, which
    replaces the root logger's handlers with one on that test's captured stderr and sets its
    level: give the root and uvicorn's loggers back as they were, so later tests neither
    write to a closed capture nor get INFO lines in their stderr."""
    import logging

    from dsplatform.logs import UVICORN_LOGGERS, ProcessHandler

    root, level = logging.getLogger(), logging.getLogger().level
    uvicorn = [(logging.getLogger(n), list(logging.getLogger(n).handlers), logging.getLogger(n).propagate,
                logging.getLogger(n).level) for n in UVICORN_LOGGERS]  # fmt: skip
    yield
    for handler in [h for h in root.handlers if isinstance(h, ProcessHandler)]:
        root.removeHandler(handler)  # pytest's own capture handlers are left to pytest
    root.setLevel(level)
    for logger, handlers, propagate, uvicorn_level in uvicorn:
        logger.handlers, logger.propagate = handlers, propagate
        logger.setLevel(uvicorn_level)


def _sanitized_native_loops() -> None:
    """``DSPLATFORM_TEST_NATIVE=<path of a _native*.so>``: the native loops of that build run
    instead of the installed ones (``tools/ci/native-asan.sh``'s, built with the sanitizers);
    a build that does not load, or speaks another interface, fails the session."""
    path = os.environ.get("DSPLATFORM_TEST_NATIVE")
    if not path:
        return
    import importlib.util

    from dsagent.format import native

    spec = importlib.util.spec_from_file_location("dsagent.format._native", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.INTERFACE == native.INTERFACE, f"{path} speaks interface {module.INTERFACE}"
    native._native = module  # type: ignore[attr-defined]
    native.LOADED = native.AVAILABLE = True
    native.OFF_REASON = None


_sanitized_native_loops()


def pytest_report_header() -> str:
    from dsagent.format import native

    where = f" ({native._native.__file__})" if native.LOADED else ""  # type: ignore[attr-defined]
    return f"native loops: {native.describe()}{where}"


@pytest.fixture(autouse=True)
def _private_digest_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """``dsctl`` run in-process keeps its digest cache in the test's own folder, not in the
    home of whoever runs the suite (``$DSAGENT_DIGEST_CACHE``, which a test may set again)."""
    monkeypatch.setenv("DSAGENT_DIGEST_CACHE", str(tmp_path_factory.mktemp("digest-cache") / "digests.sqlite"))


@pytest.fixture(autouse=True)
def _native_switch_restored() -> Iterator[None]:
    """A process edge run in-process (``dsctl``'s main, the agent's ``run``) switches the
    native loops for the process (:func:`dsagent.format.native.use_native`): later tests get
    them back as they were."""
    from dsagent.format import native

    before = native.AVAILABLE, native.OFF_REASON
    yield
    native.AVAILABLE, native.OFF_REASON = before


@pytest.fixture(params=["native", "pure"])
def native_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test of a module that uses it runs twice: with the native loops (skipped, saying
    why, where the extension is not built) and with the pure-Python ones. The format,
    extraction and fault-injection modules use it (``pytestmark``)."""
    from dsagent.format import native

    if request.param == "native" and not native.LOADED:
        pytest.skip(f"the native loops are not here: {native.OFF_REASON}")
    monkeypatch.setattr(native, "AVAILABLE", request.param == "native")
    return str(request.param)


os.environ.setdefault("DSAGENT_PROTOCOLS", ",".join(TEST_PROTOCOLS))  # agents the tests start as processes
os.environ.setdefault("DSAGENT_EGRESS_ALLOW", ",".join(TEST_EGRESS_ALLOW))


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    """A fake Kubernetes API server on 127.0.0.1, stopped after the test."""
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def api_client(apiserver: FakeApiServer) -> Iterator[Any]:
    """An unmodified ``kubernetes.client.ApiClient`` talking to :func:`apiserver`."""
    client = apiserver.api_client()
    try:
        yield client
    finally:
        client.close()
