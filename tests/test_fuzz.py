"""Property-based fuzzing of the agent's API and the extender's wire format.

Whatever a pod or a node sends, the answer is never a 5xx: the agent answers 2xx or a
4xx JSON error; the extender always answers a well-formed 200, and one node's data never
sets ``Error`` for the whole filter. Bounded: a few hundred examples, no deadline.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsagent.api import create_app as create_agent_app
from dsagent.cache.settings import Settings as AgentSettings
from scheduler_plugin.app import create_app as create_extender_app
from scheduler_plugin.settings import Settings as ExtenderSettings
from scheduler_plugin.testing import args_body, holding, inventory_json, node, pod, topology_json
from scheduler_plugin.wire import BodyNotJson

pytestmark = pytest.mark.slow

TOKEN = "fuzz-admin-token-0123456789abcdef"

PREFIXES = [
    "",
    "/",
    "file://",
    "file:///",
    "file://host/",
    "local://",
    "memory://",
    "http://127.0.0.1:1/",
    "http://[::1]:1/",
    "https://",
    "s3://",
    "s3a://",
    "gcs://",
    "abfs://",
    "simplecache::",
    "tar://",
    "zip://",
    "async_wrapper://",
    "filecache::",
    "dir::",
    "reference://",
    "data:,",
    "jupyter://",
    "generic://",
    "~/",
    "../",
    "ALLOWED/",
    "ALLOWED/../",
]
junk = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
source = st.builds(lambda p, s: p + s, st.sampled_from(PREFIXES), junk)
json_scalar = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | junk
json_value = st.recursive(
    json_scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(junk, inner, max_size=3), max_leaves=8
)
option_key = (
    st.sampled_from(
        [
            "key",
            "secret",
            "anon",
            "endpoint_url",
            "fo",
            "target_protocol",
            "cache_storage",
            "client_kwargs",
            "headers",
            "token",
            "asynchronous",
        ]
    )
    | junk
)
options = st.none() | st.dictionaries(option_key, json_value, max_size=4)
dataset = st.fixed_dictionaries(
    {"name": st.sampled_from(["ok", "a/b", "..", "", "x" * 200]) | junk, "source": source},
    optional={"bundles": source, "storageOptions": options},
)
task_id = st.sampled_from(["t1", "-bad", "..%2F..", "6f1c2a4e-9b7d-4c3e-8a21-0d5e7f9a1b2c", "x" * 300]) | junk.filter(
    lambda s: "/" not in s and "?" not in s and "#" not in s
)
body = st.one_of(
    st.fixed_dictionaries({"datasets": st.lists(dataset, max_size=3)}),
    json_value,
    st.fixed_dictionaries(
        {"mode": st.sampled_from(["idle", "unused", "space", "names", "all"]) | junk},
        optional={"names": st.lists(junk, max_size=3), "bytes": st.integers(-5, 2**65), "force": st.booleans()},
    ),
)
request = st.tuples(
    st.sampled_from(["GET", "PUT", "DELETE", "POST", "PATCH"]),
    st.sampled_from(
        [
            "/v1/tasks/{}",
            "/v1/tasks/{}?wait=0",
            "/v1/tasks/{}?wait=-1",
            "/v1/datasets/{}",
            "/v1/datasets/{}?force=true",
            "/v1/evict",
            "/v1/inventory",
            "/readyz",
            "/v1/{}",
        ]
    ),
    task_id,
    body,
    st.booleans(),
)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import httpx

    from tests.scheduler_plugin.server import serving

    base = tmp_path_factory.mktemp("fuzz")
    (base / "allowed").mkdir()
    (base / "allowed" / "f").write_text("x")
    app_settings = AgentSettings(
        root=base / "cache", admin_token=TOKEN, local_sources=(base / "allowed",), sweep_interval=3600, source_timeout=2
    )
    with serving(create_agent_app(app_settings)) as url, httpx.Client(base_url=url, timeout=30) as client:
        client.allowed = str(base / "allowed")  # type: ignore[attr-defined]
        yield client


@settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(request)
def test_the_agent_api_never_answers_5xx(agent: Any, req: tuple[str, str, str, Any, bool]) -> None:
    method, template, ident, payload, with_token = req
    path = template.format(quote(ident, safe="%:"))
    text = json.dumps(payload).replace("ALLOWED", agent.allowed)
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {TOKEN}"} if with_token else {})}
    answer = agent.request(method, path, content=text if method in ("PUT", "POST", "DELETE") else None, headers=headers)
    assert answer.status_code < 500, (method, path, text, answer.status_code, answer.text)
    if answer.status_code >= 400:
        assert {"code", "message"} <= set(answer.json())


TOPO = topology_json()
annotation = (
    junk
    | st.sampled_from(["\u00b2", "9" * 5000, '{"datasets":' * 3000 + "{}" + "}" * 3000, "0,1,2", "", "-1", "1e309"])
    | json_value.map(json.dumps)
)


@settings(max_examples=200, deadline=None)
@given(inventory=annotation, topology=annotation, free=annotation)
def test_one_nodes_data_never_fails_the_filter_or_zeroes_the_others(inventory: str, topology: str, free: str) -> None:
    app = create_extender_app(ExtenderSettings())
    wants = [{"name": "imagenet", "source": "s3://d/imagenet", "digest": "a" * 32}]
    nodes = [
        node(
            "holds", inventory=inventory_json(datasets={"imagenet": holding()}), topology=TOPO, free_gpus=[4, 5, 6, 7]
        ),
        node("hostile", inventory=inventory, topology=topology, free_gpus=free),
    ]
    body = args_body(pod(datasets=wants, gpus=4), nodes, node_cache_capable=False)
    result = json.loads(app.filter(body))
    assert result["Error"] == ""
    assert "holds" in {n["metadata"]["name"] for n in result["Nodes"]["items"]}
    scores = {h["Host"]: h["Score"] for h in json.loads(app.prioritize(body))}
    assert scores["holds"] > 0


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000) | json_value.map(lambda v: json.dumps(v).encode()))
def test_any_body_gets_a_well_formed_answer(raw: bytes) -> None:
    """A JSON object gets the verbs' 200 answer (``Error`` set when it is wrong); anything
    else is refused as :class:`BodyNotJson`, which the route answers 400, and only then."""
    app = create_extender_app(ExtenderSettings())
    try:
        is_object = isinstance(json.loads(raw), dict)
    except ValueError:
        is_object = False
    if not is_object:
        with pytest.raises(BodyNotJson):
            app.filter(raw)
        with pytest.raises(BodyNotJson):
            app.prioritize(raw)
        return
    result = json.loads(app.filter(raw))
    assert set(result) >= {"Error"}
    assert isinstance(json.loads(app.prioritize(raw)), list)
