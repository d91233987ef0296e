"""Where the agent may connect for a request (dsagent/format/egress.py): the hosts a request
names are resolved and checked before anything is recorded, and every connection its
filesystems open is checked again where it is made (a redirect or a second resolution meets
the same rule); the headers metadata services require are never sent."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dsagent.errors import InvalidInput
from dsagent.format import storage
from dsagent.format.egress import EgressPolicy
from dsagent.format.sources import DEFAULT_OPTION_KEYS, SourcePolicy
from dsagent.format.storageconfig import DEFAULT, StoreOptions
from tools.support.harness import ADMIN_TOKEN, AgentProcess

#: the rule as an agent with the chart's defaults runs it: nothing allowed beyond it
STRICT = EgressPolicy.of(allow=())
METADATA_TOKEN = "http://169.254.169.254/computeMetadata/v1/instance/service-accounts/default/token"


def policy(egress: EgressPolicy = STRICT, **keys: tuple[str, ...]) -> SourcePolicy:
    return SourcePolicy(option_keys={**DEFAULT_OPTION_KEYS, **keys}, egress=egress)


@pytest.mark.parametrize(
    ("url", "options", "refusal"),
    [
        (METADATA_TOKEN, None, "169.254.169.254 is in 169.254.0.0/16"),
        ("http://metadata.google.internal/computeMetadata/v1/", None, "the metadata server"),
        ("http://[::ffff:169.254.169.254]/latest/meta-data/", None, "169.254.169.254 is in 169.254.0.0/16"),
        ("http://127.0.0.1:8080/x", None, "127.0.0.1 is in 127.0.0.0/8"),
        ("http://localhost:8080/x", None, "is in"),
        ("http://[::1]/x", None, "::1 is in ::1/128"),
        ("http://10.96.0.10/x", None, "10.96.0.10 is in 10.96.0.0/12"),  # a cluster service
        ("s3://bucket/x", {"endpoint_url": "http://169.254.169.254"}, "storage option 'endpoint_url'"),
        ("s3://bucket/x", {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}, "127.0.0.1"),
        ("gs://bucket/x", {"endpoint_url": "http://metadata.google.internal"}, "the metadata server"),
    ],
    ids=[
        "metadata-ip",
        "metadata-name",
        "mapped-v6",
        "loopback",
        "localhost",
        "v6-loopback",
        "cluster",
        "s3",
        "s3-kw",
        "gs",
    ],  # fmt: skip
)
def test_a_request_naming_an_internal_host_is_refused_before_anything_is_built(
    url: str, options: Any, refusal: str
) -> None:
    with pytest.raises(InvalidInput, match=refusal):
        policy().check(url, options)


def test_public_hosts_pass_and_the_operator_allows_more_by_range_or_name() -> None:
    policy().check("https://203.0.113.7/datasets/x", None)  # an address outside every denied range
    allowing = EgressPolicy.of(allow=("10.96.0.10", "minio.storage.svc.cluster.local"))
    policy(allowing).check("http://10.96.0.10:9000/x", None)
    policy(allowing).check("s3://bucket/x", {"endpoint_url": "http://minio.storage.svc.cluster.local:9000"})
    with pytest.raises(InvalidInput, match="10.96.0.11"):
        policy(allowing).check("http://10.96.0.11/x", None)
    assert EgressPolicy.of(deny=("192.168.0.0/16",)).refusal("192.168.3.4") is not None


def test_request_headers_are_the_operators_allowlist_and_never_a_metadata_header() -> None:
    headers = {"headers": {"Metadata-Flavor": "Google"}}
    with pytest.raises(InvalidInput, match="storage option 'headers' is not accepted"):
        policy().check("https://203.0.113.7/x", headers)  # no header passes by default
    everything = policy(http=("headers.*",), https=("headers.*",))
    with pytest.raises(InvalidInput, match="request header 'Metadata-Flavor' is never sent"):
        everything.check("https://203.0.113.7/x", headers)  # not even when the operator allows any header
    policy(https=("headers.Authorization",)).check("https://203.0.113.7/x", {"headers": {"Authorization": "t"}})


def test_the_agent_refuses_settings_that_would_send_a_metadata_header() -> None:
    from dsagent.cache.settings import Settings
    from dsplatform.settings import InvalidSettings

    with pytest.raises((InvalidSettings, ValueError), match="Metadata-Flavor"):
        Settings.read({"DSAGENT_STORAGE_OPTION_KEYS": '{"http": ["headers.Metadata-Flavor"]}'})
    settings = Settings.read(
        {"DSAGENT_EGRESS_ALLOW": "10.0.0.0/8, minio.local", "DSAGENT_EGRESS_DENY": "172.16.0.0/12"}
    )
    assert settings.egress_policy.refusal("10.1.2.3") is None
    assert settings.egress_policy.refusal("172.16.0.1") is not None
    with pytest.raises((InvalidSettings, ValueError), match="not an address or a CIDR"):
        Settings.read({"DSAGENT_EGRESS_DENY": "10.0.0.0/33"})


class _Redirecting(http.server.BaseHTTPRequestHandler):
    """Serves /file; /away redirects to the same port on another loopback address."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path == "/away":
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.2:{self.server.server_address[1]}/file")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"the file's bytes"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:  # noqa: N802 - the stdlib's name
        self.do_GET()


@pytest.fixture
def redirecting() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), _Redirecting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_every_connection_is_checked_where_it_is_made_a_redirect_included(redirecting: int) -> None:
    only_one = EgressPolicy.of(allow=("127.0.0.1",))  # 127.0.0.2 stays refused, as loopback is
    options = StoreOptions({}, DEFAULT, only_one)
    fs, path = storage.resolve(f"http://127.0.0.1:{redirecting}/file", options)
    assert fs.cat_file(path) == b"the file's bytes"
    fs, path = storage.resolve(f"http://127.0.0.1:{redirecting}/away", options)
    with pytest.raises(Exception) as refused:
        fs.cat_file(path)
    assert "127.0.0.2 is in 127.0.0.0/8" in repr(refused.value) or "refused to connect" in repr(refused.value)
    # the same redirect, unchecked (dsctl on a user's machine): followed
    fs, path = storage.resolve(f"http://127.0.0.1:{redirecting}/away", {})
    assert fs.cat_file(path) == b"the file's bytes"


@pytest.mark.slow
def test_a_pod_cannot_make_the_agent_fetch_the_nodes_credentials(tmp_path: Path) -> None:
    """A real agent with its defaults: a task naming the metadata server (with the header it
    requires), or a loopback server, is a 400 naming the reason; nothing is cached."""
    agent = AgentProcess(tmp_path / "agent", tcp=True, env={"DSAGENT_EGRESS_ALLOW": ""}).start()
    try:
        headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        with httpx.Client(base_url=agent.url, timeout=30, headers=headers) as client:
            for dataset, refusal in [
                ({"name": "md", "source": METADATA_TOKEN, "storageOptions": {"headers": {"Metadata-Flavor": "Google"}}},
                 "storage option 'headers' is not accepted"),
                ({"name": "md", "source": METADATA_TOKEN}, "169.254.169.254 is in 169.254.0.0/16"),
                ({"name": "lo", "source": f"{agent.url}/v1/inventory"}, "127.0.0.1 is in 127.0.0.0/8"),
            ]:  # fmt: skip
                response = client.put("/v1/tasks/pod-a", json={"datasets": [dataset]})
                assert response.status_code == 400, response.text
                assert refusal in response.json()["message"], response.json()
            assert client.get("/v1/datasets").json()["datasets"] == []
    finally:
        agent.stop()


@pytest.mark.slow
def test_an_s3_connection_is_checked_where_it_is_made(s3: Any) -> None:
    import s3fs

    s3.create_bucket("guarded")
    s3fs.S3FileSystem(endpoint_url=s3.endpoint, skip_instance_cache=True).pipe("guarded/x", b"bytes")
    allowed = StoreOptions({"endpoint_url": s3.endpoint}, DEFAULT, EgressPolicy.of(allow=("127.0.0.1",)))
    fs, path = storage.resolve("s3://guarded/x", allowed)
    assert fs.cat_file(path) == b"bytes"
    refused = StoreOptions({"endpoint_url": s3.endpoint, "skip_instance_cache": True}, DEFAULT, STRICT)
    fs, path = storage.resolve("s3://guarded/x", refused)
    with pytest.raises(Exception) as caught:
        fs.cat_file(path)
    assert "127.0.0.1 is in 127.0.0.0/8" in repr(caught.value) or "Could not connect" in repr(caught.value)
