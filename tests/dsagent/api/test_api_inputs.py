"""Every bad input gets a 4xx JSON error, never a 500, over a real agent's TCP listener;
operator actions over TCP need the admin token; nothing leaves the cache root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tools.support.harness import ADMIN_TOKEN, AgentProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Any:
    base = tmp_path_factory.mktemp("api")
    (base / "allowed").mkdir()
    process = AgentProcess(
        base / "agent", tcp=True, local_sources=(base / "allowed",), env={"DSAGENT_MAX_BODY": "64kB"}
    ).start()
    yield process
    process.stop()


@pytest.fixture
def http(agent: AgentProcess) -> Any:
    with httpx.Client(base_url=agent.url, timeout=30, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
        yield client


@pytest.fixture
def anonymous(agent: AgentProcess) -> Any:
    with httpx.Client(base_url=agent.url, timeout=30) as client:
        yield client


GOOD = {"name": "ok", "source": "memory://nowhere/ok"}

BAD_REQUESTS = [
    ("invalid-name-slash", "PUT", "/v1/tasks/t1", {"datasets": [{**GOOD, "name": "a/b"}]}, 400, "invalid_input"),
    ("invalid-name-dotdot", "PUT", "/v1/tasks/t1", {"datasets": [{**GOOD, "name": ".."}]}, 400, "invalid_input"),
    (
        "invalid-name-unicode",
        "PUT",
        "/v1/tasks/t1",
        {"datasets": [{**GOOD, "name": "d\u00e9j\u00e0"}]},
        400,
        "invalid_input",
    ),
    ("invalid-name-empty", "PUT", "/v1/tasks/t1", {"datasets": [{**GOOD, "name": ""}]}, 400, "invalid_input"),
    ("invalid-name-too-long", "PUT", "/v1/tasks/t1", {"datasets": [{**GOOD, "name": "x" * 200}]}, 400, "invalid_input"),
    ("duplicate-names", "PUT", "/v1/tasks/t1", {"datasets": [GOOD, GOOD]}, 400, "invalid_input"),
    ("unknown-field", "PUT", "/v1/tasks/t1", {"datasets": [{**GOOD, "sorce": "x"}]}, 400, "invalid_input"),
    ("unknown-top-field", "PUT", "/v1/tasks/t1", {"datasets": [GOOD], "priority": 1}, 400, "invalid_input"),
    ("no-datasets", "PUT", "/v1/tasks/t1", {"datasets": []}, 400, "invalid_input"),
    ("wrong-type", "PUT", "/v1/tasks/t1", {"datasets": "imagenet"}, 400, "invalid_input"),
    # a boolean only: "yes", 1 or "true" are not coerced into the slow per-file opt-in
    (
        "allow-per-file-string",
        "PUT",
        "/v1/tasks/t1",
        {"datasets": [{**GOOD, "allowPerFile": "yes"}]},
        400,
        "invalid_input",
    ),
    ("allow-per-file-number", "PUT", "/v1/tasks/t1", {"datasets": [{**GOOD, "allowPerFile": 1}]}, 400, "invalid_input"),
    (
        "unknown-protocol",
        "PUT",
        "/v1/tasks/t1",
        {"datasets": [{**GOOD, "source": "nosuchproto://b/x"}]},
        400,
        "invalid_input",
    ),
    (
        "nul-in-url",
        "PUT",
        "/v1/tasks/t1",
        {"datasets": [{**GOOD, "source": "memory://a\u0000b"}]},
        400,
        "invalid_input",
    ),
    (
        "malformed-bundles-url",
        "PUT",
        "/v1/tasks/t1",
        {"datasets": [{**GOOD, "bundles": "nosuchproto://"}]},
        400,
        "invalid_input",
    ),
    (
        "local-source-outside-allowed",
        "PUT",
        "/v1/tasks/t1",
        {"datasets": [{**GOOD, "source": "/etc"}]},
        400,
        "invalid_input",
    ),
    (
        "local-source-traversal",
        "PUT",
        "/v1/tasks/t1",
        {"datasets": [{**GOOD, "source": "ALLOWED/../../etc"}]},
        400,
        "invalid_input",
    ),
    (
        "file-url-outside-allowed",
        "PUT",
        "/v1/tasks/t1",
        {"datasets": [{**GOOD, "source": "file:///etc"}]},
        400,
        "invalid_input",
    ),
    (
        "cache-chained-to-local",
        "PUT",
        "/v1/tasks/t1",
        {"datasets": [{**GOOD, "source": "simplecache::file:///etc"}]},
        400,
        "invalid_input",
    ),
    (
        "blockcache-chained-to-local",
        "PUT",
        "/v1/tasks/t1",
        {"datasets": [{**GOOD, "source": "blockcache::file:///etc"}]},
        400,
        "invalid_input",
    ),
    (
        "dir-wrapper-over-local",
        "PUT",
        "/v1/tasks/t1",
        {"datasets": [{**GOOD, "source": "dir::/etc"}]},
        400,
        "invalid_input",
    ),
    (
        "archive-chained-to-local",
        "PUT",
        "/v1/tasks/t1",
        {"datasets": [{**GOOD, "source": "zip://x::file:///etc/a.zip"}]},
        400,
        "invalid_input",
    ),
    (
        "bundles-chained-to-local",
        "PUT",
        "/v1/tasks/t1",
        {"datasets": [{**GOOD, "bundles": "simplecache::file:///etc"}]},
        400,
        "invalid_input",
    ),
    ("invalid-task-id", "PUT", "/v1/tasks/-bad", {"datasets": [GOOD]}, 400, "invalid_input"),
    ("task-id-traversal", "PUT", "/v1/tasks/..%2F..%2Fetc", {"datasets": [GOOD]}, 404, "not_found"),
    ("wait-negative", "PUT", "/v1/tasks/t1?wait=-1", {"datasets": [GOOD]}, 400, "invalid_input"),
    ("wait-not-a-number", "PUT", "/v1/tasks/t1?wait=soon", {"datasets": [GOOD]}, 400, "invalid_input"),
    ("unknown-task", "GET", "/v1/tasks/never-submitted", None, 404, "not_found"),
    ("release-unknown-task", "DELETE", "/v1/tasks/never-submitted", None, 404, "not_found"),
    ("dataset-name-traversal", "GET", "/v1/datasets/..%2F..%2Fetc%2Fpasswd", None, 404, "not_found"),
    ("dataset-name-backslash", "GET", "/v1/datasets/..%5Cetc", None, 400, "invalid_input"),
    ("evict-traversal-name", "POST", "/v1/evict", {"mode": "names", "names": ["../../etc"]}, 400, "invalid_input"),
    ("dataset-dotdot", "GET", "/v1/datasets/..", None, 404, "not_found"),
    ("unknown-dataset", "GET", "/v1/datasets/nothing-here", None, 404, "not_found"),
    ("unknown-route", "GET", "/v2/everything", None, 404, "not_found"),
    ("wrong-method", "PATCH", "/v1/inventory", None, 405, "method_not_allowed"),
    ("evict-unknown-mode", "POST", "/v1/evict", {"mode": "everything"}, 400, "invalid_input"),
    ("evict-unknown-field", "POST", "/v1/evict", {"mode": "idle", "all": True}, 400, "invalid_input"),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"), [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS]
)
def test_bad_requests_get_a_4xx_json_error_with_a_code_and_message(
    http: httpx.Client, agent: AgentProcess, method: str, path: str, body: Any, status: int, code: str
) -> None:
    if body is not None:
        body = _fill(body, str(agent.root.parent / "allowed"))
    headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    response = http.request(method, path, json=body, headers=headers)
    assert response.status_code == status, response.text
    error = response.json()
    assert error["code"] == code
    assert error["message"]


def _fill(body: Any, allowed: str) -> Any:
    import json

    return json.loads(json.dumps(body).replace("ALLOWED", allowed))


def test_malformed_json_and_oversized_bodies_are_refused(http: httpx.Client) -> None:
    response = http.put("/v1/tasks/t1", content=b"{not json", headers={"content-type": "application/json"})
    assert (response.status_code, response.json()["code"]) == (400, "invalid_input")
    huge = {"datasets": [{**GOOD, "storageOptions": {"pad": "x" * 100_000}}]}
    response = http.put("/v1/tasks/t1", json=huge)
    assert (response.status_code, response.json()["code"]) == (413, "body_too_large")


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def with_options(options: str) -> bytes:
    return ('{"datasets":[{"name":"ok","source":"memory://x/ok","storageOptions":' + options + "}]}").encode()


# FastAPI's parse accepted any depth under the recursion limit and answered anything
# past it, or not UTF-8, "There was an error parsing the body" (code http_error)
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (nested(20_000).encode(), "request body is nested deeper than 32 levels"),
        (b'{"datasets":' + nested(20_000).encode() + b"}", "request body is nested deeper than 32 levels"),
        # 33 levels in all: under the interpreter's bound, over the one bound (dsplatform.boundedjson)
        (with_options('{"a":' * 30 + "1" + "}" * 30), "request body is nested deeper than 32 levels"),
        (b'{"datasets":"\xff"}', "request body is not JSON: 'utf-8' codec"),
        (b'{"datasets":[{"name":"ok"},]}', "request body is not JSON: Expecting value"),
    ],
    ids=["nested-arrays", "nested-datasets", "options-33-deep", "not-utf8", "trailing-comma"],
)
@pytest.mark.parametrize(("method", "path"), [("PUT", "/v1/tasks/t1"), ("POST", "/v1/evict")], ids=["task", "evict"])
def test_a_nested_or_broken_json_body_is_a_400_that_says_so(
    http: httpx.Client, body: bytes, message: str, method: str, path: str
) -> None:
    response = http.request(method, path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["code"] == "invalid_input" and error["message"].startswith(message), error


def test_a_body_32_levels_deep_is_parsed_and_judged_on_its_fields(http: httpx.Client) -> None:
    body = with_options('{"a":' * 29 + "1" + "}" * 29)  # 32 levels: allowed through to the checks
    response = http.put("/v1/tasks/t1", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400 and "nested" not in response.json()["message"], response.text


def test_a_body_over_the_limit_without_a_length_is_413_not_a_bare_400(http: httpx.Client) -> None:
    def chunks() -> Any:  # no Content-Length: sent chunked, refused while it streams in
        yield b'{"datasets":[{"name":"ok","source":"memory://x/y","storageOptions":{"pad":"'
        for _ in range(20):
            yield b"x" * 10_000
        yield b'"}}]}'

    response = http.put("/v1/tasks/t1", content=chunks(), headers={"content-type": "application/json"})
    assert (response.status_code, response.json()["code"]) == (413, "body_too_large"), response.text


def test_a_task_cannot_change_its_datasets(http: httpx.Client, agent: AgentProcess) -> None:
    http.put("/v1/tasks/fixed", json={"datasets": [{"name": "m1", "source": "memory://dsagent-api/m1"}]})
    response = http.put("/v1/tasks/fixed", json={"datasets": [{"name": "m2", "source": "memory://dsagent-api/m2"}]})
    assert (response.status_code, response.json()["code"]) == (409, "conflict")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/evict", {"mode": "idle", "dryRun": True}),
        ("DELETE", "/v1/datasets/anything", None),
        ("PUT", "/v1/tasks/t-anon", {"datasets": [GOOD]}),
        ("DELETE", "/v1/tasks/t-anon", None),
    ],
    ids=["evict", "evict-dataset", "submit-task", "release-task"],
)
def test_changes_over_tcp_need_the_admin_token(anonymous: httpx.Client, method: str, path: str, body: Any) -> None:
    for headers in ({}, {"authorization": "Bearer wrong-token-wrong-token"}, {"authorization": ADMIN_TOKEN}):
        response = anonymous.request(method, path, json=body, headers=headers)
        assert (response.status_code, response.json()["code"]) == (401, "unauthorized")


def test_reads_over_tcp_need_no_token(anonymous: httpx.Client) -> None:
    for path in ("/v1/inventory", "/v1/datasets", "/metrics", "/healthz", "/readyz"):
        assert anonymous.get(path).status_code == 200, path


def test_operator_actions_work_with_the_token_or_over_the_socket(http: httpx.Client, agent: AgentProcess) -> None:
    ok = http.post("/v1/evict", json={"mode": "idle", "dryRun": True})
    assert ok.status_code == 200 and ok.json()["evicted"] == []
    with agent.client() as client:  # the unix socket is guarded by its permissions instead
        assert client.evict(mode="idle", dry_run=True)["evicted"] == []


def test_storage_options_are_never_returned_or_logged(http: httpx.Client, agent: AgentProcess) -> None:
    secret = "AKIA-very-secret-value-42"
    options = {
        "key": secret,
        "secret": secret,
        "endpoint_url": "http://127.0.0.1:9",
        "client_kwargs": {"region_name": "x"},
    }
    body = {"datasets": [{"name": "s3set", "source": "s3://bucket/none", "storageOptions": options}]}
    answer = http.put("/v1/tasks/with-secret?wait=5", json=body)
    assert answer.status_code == 200
    everything = (
        answer.text
        + http.get("/v1/tasks/with-secret").text
        + http.get("/v1/datasets").text
        + http.get("/v1/inventory").text
    )
    assert secret not in everything
    assert secret not in agent.log.read_text()
    assert secret.encode() not in (agent.root / "catalog.db").read_bytes()


def test_health_readiness_and_metrics_answer(http: httpx.Client) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    assert http.get("/readyz").json() == {"status": "ready"}
    text = http.get("/metrics").text
    for name in (
        "dsplatform_agent_cache_hits_total",
        "dsplatform_agent_cache_misses_total",
        "dsplatform_agent_fetched_bytes_total",
        "dsplatform_agent_fetch_duration_seconds_count",
        "dsplatform_agent_free_bytes",
        "dsplatform_agent_used_bytes",
    ):
        assert f"\n{name} " in "\n" + text, name


def test_nothing_was_written_outside_the_cache_root(agent: AgentProcess) -> None:
    root = agent.root.parent
    assert sorted(p.name for p in root.iterdir()) == sorted(["agent", "agent.log", "agent.sock", "allowed"])
    assert not (Path("/etc") / "passwd").is_relative_to(agent.root)


@pytest.mark.parametrize(
    ("body", "key"),
    [
        (b'{"datasets":[{"name":"d","name":"e","source":"memory://nowhere/ok"}]}', "name"),
        (b'{"datasets":[],"datasets":[{"name":"ok","source":"memory://nowhere/ok"}]}', "datasets"),
    ],
    ids=["in-a-dataset", "at-the-top"],
)
def test_a_key_given_twice_is_a_400_naming_it_not_the_last_one_winning(
    http: httpx.Client, body: bytes, key: str
) -> None:
    response = http.put("/v1/tasks/dup", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["code"] == "invalid_input" and f"the key {key!r} twice" in error["message"], error
    assert http.get("/v1/tasks/dup").status_code == 404  # nothing was cached under either name
