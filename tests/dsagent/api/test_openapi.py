"""``/v1/openapi.json`` states what the agent really does: every route, its typed answer,
the error statuses it sends with the ErrorOut body, and no 422 (validation errors are 400)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from dsagent.api.routes import router
from tools.support.harness import ADMIN_TOKEN, AgentProcess

pytestmark = pytest.mark.slow

ERROR_REF = "#/components/schemas/ErrorOut"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    process = AgentProcess(
        tmp_path_factory.mktemp("openapi") / "agent", tcp=True, env={"DSAGENT_MAX_BODY": "4kB"}
    ).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def document(agent: AgentProcess) -> dict[str, Any]:
    answer = httpx.get(f"{agent.url}/v1/openapi.json", timeout=30)
    assert answer.status_code == 200
    return dict(answer.json())


def test_the_document_lists_every_route_with_a_typed_answer_and_its_errors(document: dict[str, Any]) -> None:
    assert "422" not in str(document) and "ValidationError" not in str(document)
    for route in router.routes:
        assert isinstance(route, APIRoute)
        for method in route.methods:
            operation = document["paths"][route.path][method.lower()]
            responses = operation["responses"]
            if route.path not in ("/metrics", "/v1/peer/bundles/{digest}"):  # Prometheus text, a tar+zstd stream
                assert "$ref" in str(responses["200"]["content"]["application/json"]["schema"]), route.path
            for status, response in responses.items():
                if status.startswith(("4", "5")) and route.path != "/readyz":
                    assert response["content"]["application/json"]["schema"] == {"$ref": ERROR_REF}, (
                        route.path,
                        status,
                    )
    error = document["components"]["schemas"]["ErrorOut"]
    assert set(error["required"]) == {"code", "message"} and {"hint", "details"} <= set(error["properties"])


def declared(document: dict[str, Any], method: str, path: str) -> set[int]:
    return {int(s) for s in document["paths"][path][method.lower()]["responses"]}


@pytest.mark.parametrize(
    ("method", "url", "template", "kwargs", "status"),
    [
        ("PUT", "/v1/tasks/t1", "/v1/tasks/{task_id}", {"json": {"datasets": [{"name": "x", "sorce": "y"}]}}, 400),
        ("PUT", "/v1/tasks/t1", "/v1/tasks/{task_id}", {"json": {"datasets": [{"name": "x", "source": "s3:/x"}]}}, 400),
        (
            "PUT",
            "/v1/tasks/t1",
            "/v1/tasks/{task_id}",
            {
                "json": {"datasets": [{"name": "x", "source": "memory://x"}]},
                "headers": {"authorization": "Bearer wrong"},
            },
            401,
        ),
        (
            "PUT",
            "/v1/tasks/t1",
            "/v1/tasks/{task_id}",
            {"content": b"{" + b" " * 8000 + b"}", "headers": {"content-type": "application/json"}},
            413,
        ),
        ("GET", "/v1/tasks/none", "/v1/tasks/{task_id}", {}, 404),
        ("DELETE", "/v1/tasks/none", "/v1/tasks/{task_id}", {}, 404),
        ("GET", "/v1/datasets/none", "/v1/datasets/{name}", {}, 404),
        ("GET", "/v1/datasets/a%20b", "/v1/datasets/{name}", {}, 400),
        ("DELETE", "/v1/datasets/none", "/v1/datasets/{name}", {}, 404),
        ("POST", "/v1/evict", "/v1/evict", {"json": {"mode": "sometimes"}}, 400),
    ],
)
def test_the_errors_sent_are_the_errors_declared(
    agent: AgentProcess,
    document: dict[str, Any],
    method: str,
    url: str,
    template: str,
    kwargs: dict[str, Any],
    status: int,
) -> None:
    kwargs = dict(kwargs)
    headers = {"authorization": f"Bearer {ADMIN_TOKEN}", **kwargs.pop("headers", {})}
    answer = httpx.request(method, f"{agent.url}{url}", headers=headers, timeout=30, **kwargs)
    assert answer.status_code == status, answer.text
    assert status in declared(document, method, template)
    body = answer.json()
    assert isinstance(body["code"], str) and isinstance(body["message"], str)


def test_answers_match_their_models(agent: AgentProcess, document: dict[str, Any]) -> None:
    listing = httpx.get(f"{agent.url}/v1/datasets", timeout=30).json()
    required = document["components"]["schemas"]["DatasetsOut"]["required"]
    assert set(required) <= set(listing)
