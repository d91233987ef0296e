"""One node's unreadable data costs only that node its score; one
parse per body; a body limit; a huge body never holds up ``/healthz``.

The extender over real HTTP (uvicorn on 127.0.0.1), with bodies shaped as kube-scheduler
sends them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from scheduler_plugin.app import create_app
from scheduler_plugin.settings import Settings
from scheduler_plugin.testing import args_body, holding, inventory_json, node, pod, topology_json
from tests.scheduler_plugin.server import serving

TOPO = topology_json()
IMAGENET = [{"name": "imagenet", "source": "s3://datasets/imagenet", "digest": "a" * 32}]


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with serving(create_app(Settings(max_body_bytes=8 << 20))) as url, httpx.Client(base_url=url, timeout=30) as http:
        yield http


def good_nodes() -> list[dict[str, Any]]:
    return [
        node(
            "holds", inventory=inventory_json(datasets={"imagenet": holding()}), topology=TOPO, free_gpus=[4, 5, 6, 7]
        ),
        node("empty", inventory=inventory_json(), topology=TOPO, free_gpus=[0, 1, 2, 3]),
    ]


def nested(depth: int) -> str:
    return '{"datasets":' * depth + "{}" + "}" * depth


HOSTILE = {
    "superscript-two": {"free_gpus": "\u00b2"},
    "5000-digits": {"free_gpus": "9" * 5000},
    "nested-inventory": {"inventory": nested(5000)},
    "nested-topology": {"topology": nested(5000)},
    "huge-number-inventory": {"inventory": '{"datasets":{},"capacityBytes":' + "9" * 5000 + "}"},
}


@pytest.mark.parametrize("annotation", list(HOSTILE), ids=list(HOSTILE))
def test_one_unreadable_node_costs_only_its_own_score(client: httpx.Client, annotation: str) -> None:
    nodes = [*good_nodes(), node("hostile", **HOSTILE[annotation])]
    body = args_body(pod(datasets=IMAGENET, gpus=4), nodes, node_cache_capable=False)
    result = client.post("/filter", content=body).json()
    assert result["Error"] == "", result["Error"]
    passed = {n["metadata"]["name"] for n in result["Nodes"]["items"]}
    assert {"holds", "empty"} <= passed
    scores = {h["Host"]: h["Score"] for h in client.post("/prioritize", content=body).json()}
    # the others keep their scores; the hostile node gets no dataset credit (its GPU
    # count falls back to allocatable, as for any node without a readable free list)
    assert scores["holds"] > scores["hostile"], scores
    assert scores["holds"] > 0, scores


def test_a_body_over_the_limit_is_refused_without_a_parse(client: httpx.Client) -> None:
    body = json.dumps({"Pod": pod(), "NodeNames": ["n"] * 2_000_000}).encode()
    assert len(body) > 8 << 20
    result = client.post("/filter", content=body).json()
    assert "larger than" in result["Error"]


@pytest.mark.slow
def test_a_huge_body_without_a_pod_never_holds_up_healthz() -> None:
    # ~60 MB of valid JSON with no Pod, under a 64 MiB limit (the default)
    body = json.dumps(
        {"Nodes": {"items": [{"metadata": {"name": f"n{i}"}, "x": "y" * 40} for i in range(800_000)]}}
    ).encode()
    assert 40 << 20 < len(body) < 64 << 20
    with serving(create_app(Settings())) as url, httpx.Client(base_url=url, timeout=60) as http:
        answers: list[Any] = []
        began = time.monotonic()
        worker = threading.Thread(target=lambda: answers.append(http.post("/prioritize", content=body)))
        worker.start()
        worst, probes = 0.0, 0
        while worker.is_alive():
            started = time.monotonic()
            assert http.get("/healthz").status_code == 200
            worst = max(worst, time.monotonic() - started)
            probes += 1
            time.sleep(0.02)
        worker.join()
        whole = time.monotonic() - began
        assert answers[0].status_code == 200
        # relative, not a timing target: no probe waited for the body's whole decode (a
        # blocked event loop makes one probe take about as long as the request itself)
        assert probes >= 2 and worst < 0.5 * whole, f"/healthz waited {worst:.2f} s of the request's {whole:.2f} s"


# nesting past the parser's own bound is a clear refusal, not a traceback
DEEP_POD = b'{"a":' * 100_000 + b"1" + b"}" * 100_000


@pytest.mark.parametrize(
    "body",
    [
        # the layout Go's json.Marshal gives (the fast path), with a Pod nested 100,000 deep
        b'{"Pod":' + DEEP_POD + b',"Nodes":{"metadata":{},"items":[]},"NodeNames":null}',
        # any other layout (the general parse)
        b'{"NodeNames":["n"],"Pod":' + DEEP_POD + b"}",
        b"[" * 100_000 + b'"Pod":' + b"]" * 100_000,
    ],
    ids=["go-layout", "other-layout", "nested-arrays"],
)
def test_a_deeply_nested_body_is_refused_with_a_clear_error(
    client: httpx.Client, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    result = client.post("/filter", content=body).json()
    assert "nested too deeply" in result["Error"], result["Error"]  # old code: "internal error (RecursionError)"
    assert client.post("/prioritize", content=body).json() in ([], [{"Host": "n", "Score": 0}])
    assert not any(record.exc_info for record in caplog.records), "a traceback was logged"


# a body that is not JSON was answered "ExtenderArgs has no Pod"
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"hello", "request body is not JSON: Expecting value: line 1 column 1 (char 0)"),
        (b"{oops", "request body is not JSON: Expecting property name enclosed in double quotes"),
        (b"", "request body is empty"),
        (b"  \n ", "request body is empty"),
        (b'["Pod"]', "request body is JSON but not an object: got an array"),
        (b"42", "request body is JSON but not an object: got a number"),
        (b'"x"', "request body is JSON but not an object: got a string"),
        (b"\xff\xfe", "request body is not JSON"),
        (b"<" + b"x" * (2 << 20), "request body is not JSON: it starts with b'<'"),  # large: by its first byte
        (b"[" + b"1," * (1 << 20) + b"1]", "request body is JSON but not an object: got an array"),
    ],
    ids=["text", "broken-object", "empty", "blank", "array", "number", "string", "binary", "large-text", "large-array"],
)
def test_a_body_that_is_not_a_json_object_is_a_400_saying_so(
    client: httpx.Client, body: bytes, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    for path in ("/filter", "/prioritize", "/prioritize/numa"):
        answer = client.post(path, content=body)
        assert answer.status_code == 400, (path, answer.text)
        error = answer.json()
        assert error["code"] == "invalid_json" and error["message"].startswith(message), error
        assert "\n" not in error["message"] and "has no Pod" not in error["message"]
    assert not any(record.exc_info for record in caplog.records), "a traceback was logged"


def test_a_json_object_without_a_pod_is_still_the_verbs_200_with_error_set(client: httpx.Client) -> None:
    result = client.post("/filter", content=b'{"Nodes": null}')
    assert result.status_code == 200 and result.json()["Error"] == "dsplatform extender: ExtenderArgs has no Pod"
    assert client.post("/prioritize", content=b'{"Nodes": null}').json() == []


def _twice(text: str, key: str) -> bytes:
    """``text`` (a JSON object) with ``"key": ...`` repeated in the first object that has it."""
    doc_start = text.index(f'"{key}":')
    return (text[:doc_start] + f'"{key}": null, ' + text[doc_start:]).encode()


@pytest.mark.parametrize(
    ("where", "key"),
    [("top", "Pod"), ("pod", "metadata"), ("small", "Nodes")],
)
def test_a_key_given_twice_is_a_400_naming_it(client: httpx.Client, where: str, key: str) -> None:
    good = args_body(pod(datasets=IMAGENET, gpus=4), good_nodes(), node_cache_capable=False).decode()
    if where == "small":
        body = b'{"Pod": {}, "Nodes": null, "Nodes": {"items": []}}'
    elif where == "pod":
        body = _twice(good, key)
    else:
        body = good.replace('{"Pod":', '{"Pod": {}, "Pod":', 1).encode()
        assert body != good.encode()
    for path in ("/filter", "/prioritize"):
        answer = client.post(path, content=body)
        assert answer.status_code == 400, (where, path, answer.text)
        error = answer.json()
        assert error["code"] == "invalid_json" and f"the key {key!r} appears twice" in error["message"], error


def test_a_node_with_a_key_twice_in_kube_schedulers_layout_fails_the_verb_naming_the_key(
    client: httpx.Client,
) -> None:
    """Nodes in the layout Go writes are cut, not parsed, until the extender reads them:
    then the verb answers kube-scheduler's way, 200 with ``Error`` naming the key. (A node
    the extender already read at the same resourceVersion is not read again.)"""
    nodes = [node("twice", inventory=inventory_json(), topology=TOPO, free_gpus=[0, 1, 2, 3])]
    good = args_body(pod(datasets=IMAGENET, gpus=4), nodes, node_cache_capable=False).decode()
    at = good.index('"labels":', good.index('"Nodes"'))
    body = (good[:at] + '"labels": {}, ' + good[at:]).encode()
    result = client.post("/filter", content=body).json()
    assert "the key 'labels' appears twice" in result["Error"], result
    assert result["Nodes"]["items"] == []
    assert all(h["Score"] == 0 for h in client.post("/prioritize", content=body).json())
