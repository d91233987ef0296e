"""2 and 8: what a pod's request may make the privileged agent read
is decided from the request's text, before any filesystem is built or any path touched.

A real ``dsagent serve`` over TCP (admin token), real host directories and FIFOs, a real
HTTP server on ``[::1]``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from dsagent.errors import InvalidInput
from dsagent.format.bundles.bundle import pack, verify_tree
from tools.support.harness import ADMIN_TOKEN, AgentProcess, LoopbackServer

pytestmark = pytest.mark.slow  # the tests ask one agent process, started per module


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("trust")
    (base / "allowed").mkdir()
    (base / "allowed" / "ok.txt").write_text("fine")
    host = base / "host-secrets"
    host.mkdir()
    (host / "shadow").write_text("root:the-host-secret:19000:0:99999:7:::\n")
    os.mkfifo(base / "allowed" / "pipe")
    os.mkfifo(base / "host-fifo")
    return base


@pytest.fixture(scope="module")
def agent(base: Path) -> Any:
    process = AgentProcess(base / "agent", tcp=True, local_sources=(base / "allowed",)).start()
    yield process
    process.stop()


@pytest.fixture
def http(agent: AgentProcess) -> Any:
    # a request that hangs the agent fails the test by this timeout
    with httpx.Client(base_url=agent.url, timeout=15, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
        yield client


def put(
    http: httpx.Client,
    task: str,
    source: str,
    options: dict[str, Any] | None = None,
    bundles: str | None = None,
    wait: float = 0,
) -> httpx.Response:
    dataset: dict[str, Any] = {"name": "probe", "source": source}
    if options is not None:
        dataset["storageOptions"] = options
    if bundles is not None:
        dataset["bundles"] = bundles
    return http.put(f"/v1/tasks/{task}?wait={wait}", json={"datasets": [dataset]})


def test_finding_1_the_async_wrapper_cannot_reach_host_files(http: httpx.Client, base: Path) -> None:
    options = {"target_protocol": "file", "target_options": {}, "asynchronous": False}
    answer = put(http, "f1", f"async_wrapper://{base / 'host-secrets'}", options, wait=10)
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "invalid_input"
    datasets = http.get("/v1/datasets").json()["datasets"]
    assert not datasets, datasets
    assert http.get("/v1/tasks/f1").status_code == 404  # nothing was recorded either


@pytest.mark.parametrize(
    "source, options",
    [
        # wrappers and archives of every shape: refused by name, never built
        ("async_wrapper:///etc", {"target_protocol": "file"}),
        ("filecache://x", {"target_protocol": "memory"}),
        ("dir:///", {"path": "/etc", "fs": "file"}),
        ("reference://", {"fo": "/etc/hostname"}),
        ("zip://a", {"fo": "/etc/hostname"}),
        ("cached:///etc", {}),
        ("LOCAL:///etc", {}),
        # an allowed protocol with a key that names another filesystem or a host path
        ("s3://bucket/x", {"target_protocol": "file"}),
        ("s3://bucket/x", {"client_kwargs": {"config": "x"}}),
        ("gs://bucket/x", {"token": "/etc/hostname"}),
        ("https://example.invalid/x", {"client_kwargs": {"trust_env": True}}),
        ("memory://x", {"fs": "file"}),
        # local paths: hosts, aliases, traversal, links
        ("file://localhost/etc", None),
        ("file://evil/etc", None),
        ("local:///etc", None),
        ("ALLOWED/../host-secrets", None),
        ("file://ALLOWED/../host-secrets", None),
        ("~/", None),
        ("relative/path", None),
    ],
)
def test_wrappers_aliases_and_unlisted_options_are_refused(
    http: httpx.Client, base: Path, source: str, options: dict[str, Any] | None
) -> None:
    source = source.replace("ALLOWED", str(base / "allowed"))
    answer = put(http, "wrappers", source, options)
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "invalid_input"


def test_a_symlink_to_the_host_inside_the_allowed_directory_is_refused(http: httpx.Client, base: Path) -> None:
    link = base / "allowed" / "escape"
    if not link.is_symlink():
        link.symlink_to(base / "host-secrets")
    answer = put(http, "link", str(link))
    assert answer.status_code == 400, answer.text


def test_finding_2_filecache_never_creates_its_cache_storage(http: httpx.Client, base: Path) -> None:
    made = base / "made-by-the-agent"
    answer = put(http, "f2a", "filecache://x", {"target_protocol": "memory", "cache_storage": str(made)})
    assert answer.status_code == 400, answer.text
    assert not made.exists()


def test_finding_2_tar_never_opens_its_fo(http: httpx.Client, base: Path) -> None:
    # a FIFO as ``fo``: opening it would block the request until the client gives up
    answer = put(http, "f2b", "tar:///x", {"fo": str(base / "host-fifo")})
    assert answer.status_code == 400, answer.text
    answer = put(http, "f2c", "tar:///x", {"fo": "/etc/hostname"})
    assert answer.status_code == 400, answer.text


@pytest.mark.parametrize(
    "source",
    ["jupyter://localhost:1/x", "generic://x", "tar:///x", "data:,hello", "nosuch://x", "http://", "https:///x"],
)
def test_finding_8_unknown_and_odd_protocols_are_a_400_never_a_500(http: httpx.Client, source: str) -> None:
    answer = put(http, "f8", source, {"fo": "/etc/hostname"} if source.startswith("tar") else None)
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "invalid_input"


def test_finding_3_a_fifo_source_is_refused_without_opening_it(http: httpx.Client, base: Path) -> None:
    for task in range(3):  # each would have blocked one worker thread in open() for good
        answer = put(http, f"fifo-{task}", str(base / "allowed" / "pipe"), wait=5)
        assert answer.status_code == 400, answer.text
        assert "FIFO" in answer.json()["message"]
    assert http.get("/readyz").status_code == 200


def _ipv6_available() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_available(), reason="no IPv6 loopback on this machine")
def test_finding_8_an_ipv6_literal_url_is_cached(http: httpx.Client, tmp_path: Path) -> None:
    www = tmp_path / "www"
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "one.bin").write_bytes(b"over ipv6" * 100)
    manifest = pack(tmp_path / "src", www / "store", name="probe")
    server = LoopbackServer(www, host="::1")
    try:
        assert server.url.startswith("http://[::1]:")
        answer = put(http, "ipv6", f"{server.url}/nowhere", bundles=f"{server.url}/store", wait=20)
        assert answer.status_code == 200, answer.text
        record = answer.json()
        assert record["state"] == "ready", record
        verify_tree(Path(record["datasets"][0]["path"]), manifest)
    finally:
        server.close()
        http.delete("/v1/tasks/ipv6")


# --------------------------------------------------------------------------- the policy itself


def test_the_policy_decides_from_text_and_folds_aliases() -> None:
    from dsagent.format.sources import SourcePolicy, canonical_protocol, is_chain

    assert canonical_protocol("s3a://b/x") == "s3"
    assert canonical_protocol("gcs://b/x") == "gs"
    assert canonical_protocol("abfs://c/x") == "az"
    assert canonical_protocol("/data/x") == "file"
    assert not is_chain("http://[::1]:8080/x")
    assert not is_chain("http://user@[fe80::1%25eth0]:80/x")
    assert is_chain("simplecache::http://[::1]:8080/x")
    assert is_chain("http://[::1]:8080/x::file:///etc")
    policy = SourcePolicy(protocols=("s3", "http"))
    policy.check("s3a://bucket/x", {"key": "k", "secret": "s", "client_kwargs": {"region_name": "eu"}})
    with pytest.raises(InvalidInput, match="storage option 'headers' is not accepted"):
        policy.check("http://[::1]:8080/x", {"headers": {"Authorization": "Bearer x"}})  # no header by default
    allowing = SourcePolicy(protocols=("http",), option_keys={"http": ("headers.Authorization",)})
    allowing.check("http://[::1]:8080/x", {"headers": {"Authorization": "Bearer x"}})
    with pytest.raises(InvalidInput):
        policy.check("gs://bucket/x", None)  # not listed by this operator
    with pytest.raises(InvalidInput):
        policy.check("s3://bucket/x", {"key": {"nested": 1}})
