"""The extender over real HTTP, with requests shaped exactly as kube-scheduler sends them."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from scheduler_plugin.app import create_app
from scheduler_plugin.settings import Settings
from scheduler_plugin.testing import (
    GIB,
    args_body,
    holding,
    inventory_json,
    node,
    pod,
    topology_json,
)
from tests.scheduler_plugin.server import serving

TOPO = topology_json()
IMAGENET = [{"name": "imagenet", "source": "s3://datasets/imagenet", "digest": "a" * 32}]


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with serving(create_app(Settings())) as url, httpx.Client(base_url=url, timeout=30) as http:
        yield http


def cluster() -> list[dict[str, Any]]:
    return [
        node(
            "holds-all",
            inventory=inventory_json(datasets={"imagenet": holding()}),
            topology=TOPO,
            free_gpus=[4, 5, 6, 7],
        ),
        node(
            "holds-stale",
            inventory=inventory_json(datasets={"imagenet": holding("b" * 32)}),
            topology=TOPO,
            free_gpus=[0, 1, 2, 3],
        ),
        node("two-free", inventory=inventory_json(), topology=TOPO, free_gpus=[0, 5]),
        node("tiny-cache", inventory=inventory_json(capacity=GIB // 2), topology=TOPO, free_gpus=range(8)),
    ]


def post(client: httpx.Client, verb: str, body: bytes) -> Any:
    response = client.post(f"/{verb}", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 200
    return response.json()


@pytest.mark.parametrize("node_cache_capable", [False])
def test_filter_answers_in_the_field_the_request_used_with_reasons(
    client: httpx.Client, node_cache_capable: bool
) -> None:
    body = args_body(pod(datasets=IMAGENET, gpus=4), cluster(), node_cache_capable=node_cache_capable)
    result = post(client, "filter", body)
    assert set(result) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert result["Error"] == "" and result["NodeNames"] is None
    passed = [n["metadata"]["name"] for n in result["Nodes"]["items"]]
    assert passed == ["holds-all", "holds-stale"]
    assert result["Nodes"]["items"][0] == cluster()[0]  # echoed whole, unchanged
    assert result["FailedNodes"] == {"two-free": "2 free GPUs, pod needs 4"}
    assert list(result["FailedAndUnresolvableNodes"]) == ["tiny-cache"]


def test_prioritize_returns_integer_scores_for_every_node_in_order(client: httpx.Client) -> None:
    body = args_body(pod(datasets=IMAGENET, gpus=4), cluster()[:3], node_cache_capable=False)
    result = post(client, "prioritize", body)
    assert [h["Host"] for h in result] == ["holds-all", "holds-stale", "two-free"]
    assert all(set(h) == {"Host", "Score"} and isinstance(h["Score"], int) and 0 <= h["Score"] <= 10 for h in result)
    assert result[0]["Score"] == 10 and result[0]["Score"] > result[1]["Score"] > result[2]["Score"]


@pytest.mark.parametrize(
    ("verb", "expected"),
    [("prioritize/dataset", [10, 0, 0]), ("prioritize/roce", [10, 10, 0]), ("prioritize/numa", [10, 10, 0])],
)
def test_each_score_has_its_own_verb(client: httpx.Client, verb: str, expected: list[int]) -> None:
    body = args_body(pod(datasets=IMAGENET, gpus=4), cluster()[:3], node_cache_capable=False)
    assert [h["Score"] for h in post(client, verb, body)] == expected


def test_an_empty_candidate_list_is_answered_in_kind(client: httpx.Client) -> None:
    body = args_body(pod(gpus=1), [], node_cache_capable=False)
    assert json.loads(body)["Nodes"] == {"metadata": {}, "items": None}
    assert post(client, "prioritize", body) == []
    assert post(client, "filter", body)["Nodes"] == {"metadata": {}, "items": []}


@pytest.mark.parametrize(
    "body",
    [
        b'{"Pod": null, "NodeNames": ["a"]}',
        b'{"Pod": {}}',
        b'{"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}',
        b'{"Pod": {}, "NodeNames": [1, 2]}',
        b'{"NodeNames": ["a"]}',
    ],
    ids=["no-pod", "no-nodes", "nameless-node", "names-not-strings", "pod-missing"],
)
def test_malformed_requests_get_200_with_error_or_zeros_and_a_log_line(
    client: httpx.Client, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """ExtenderArgs that are wrong; a body that is not a JSON object at all (never from
    kube-scheduler) is a 400: tests/scheduler_plugin/test_hostile_input.py."""
    with caplog.at_level(logging.WARNING, logger="scheduler_plugin"):
        result = post(client, "filter", body)
        assert result["Error"].startswith("dsplatform extender:")
        scores = post(client, "prioritize", body)
    assert all(h["Score"] == 0 for h in scores)
    assert "filter:" in caplog.text and "prioritize/combined:" in caplog.text


def test_prioritize_salvages_node_names_of_a_malformed_request(client: httpx.Client) -> None:
    assert post(client, "prioritize", b'{"Pod": 5, "NodeNames": ["a", "b"]}') == [
        {"Host": "a", "Score": 0},
        {"Host": "b", "Score": 0},
    ]


def test_names_only_without_a_watch_cache_is_an_error_not_a_silent_filter(client: httpx.Client) -> None:
    body = args_body(pod(gpus=1), cluster(), node_cache_capable=True)
    result = post(client, "filter", body)
    assert "DSEXT_WATCH" in result["Error"] or "watch cache" in result["Error"]
    assert [h["Score"] for h in post(client, "prioritize", body)] == [0, 0, 0, 0]


def test_lowercase_field_names_are_accepted_like_gos_decoder(client: httpx.Client) -> None:
    doc = json.loads(args_body(pod(gpus=1), cluster()[:1], node_cache_capable=False))
    lowered = json.dumps({k.lower(): v for k, v in doc.items()}).encode()
    assert [h["Host"] for h in post(client, "prioritize", lowered)] == ["holds-all"]


def test_roce_class_endpoint_reports_the_cluster_wide_choice(client: httpx.Client) -> None:
    nodes = [
        node(f"n{i}", topology=TOPO, free_gpus=free)
        for i, free in enumerate([[0, 1, 2, 5], [4, 5, 6], [1, 4, 5, 6, 7]])
    ]
    post(client, "prioritize", args_body(pod(), nodes, node_cache_capable=False))
    answer = client.get("/v1/roce-class", params={"gpus": 2}).json()
    assert answer["class"] == "gpu-roce2" and answer["votes"] == {"gpu-roce1": 1, "gpu-roce2": 2}
    assert answer["nodes"] == 3 and answer["source"] == "recent-requests"
    assert client.get("/v1/roce-class", params={"gpus": 4}).json()["class"] == "gpu-roce2"
    assert client.get("/v1/roce-class", params={"gpus": 5}).json()["class"] is None


@pytest.mark.parametrize("gpus", ["0", "-1", "two", ""])
def test_roce_class_endpoint_rejects_a_bad_gpu_count(client: httpx.Client, gpus: str) -> None:
    response = client.get("/v1/roce-class", params={"gpus": gpus})
    assert response.status_code == 400 and response.json()["code"] == "invalid_request"


def test_health_and_unknown_routes(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    assert client.get("/nope").status_code == 404
    assert client.get("/filter").status_code == 405


@pytest.mark.slow
def test_a_5000_node_request_is_served(client: httpx.Client) -> None:
    nodes = [
        node(
            f"gpu-node-{i}",
            inventory=inventory_json(datasets={"imagenet": holding()} if i % 7 == 0 else {}),
            topology=TOPO,
            free_gpus=[j for j in range(8) if (i + j) % 3],
        )
        for i in range(5000)
    ]
    body = args_body(pod(datasets=IMAGENET, gpus=2, job="big"), nodes, node_cache_capable=False)
    scores = post(client, "prioritize", body)
    assert len(scores) == 5000 and {h["Score"] for h in scores} <= set(range(11))
    assert max(h["Score"] for h in scores[::7]) > max(h["Score"] for h in scores[1::7])
    result = post(client, "filter", body)
    assert len(result["Nodes"]["items"]) + len(result["FailedNodes"]) == 5000


def test_base_path_prefixes_every_route() -> None:
    with serving(create_app(Settings(base_path="/scheduler"))) as url, httpx.Client(base_url=url) as http:
        body = args_body(pod(gpus=1), [node("n1", topology=TOPO, free_gpus=[0])], node_cache_capable=False)
        assert http.post("/scheduler/prioritize", content=body).json()[0]["Host"] == "n1"
        assert http.get("/scheduler/healthz").status_code == 200


def test_every_worker_of_a_job_is_steered_to_the_first_workers_class() -> None:
    with serving(create_app(Settings())) as url, httpx.Client(base_url=url) as http:
        # First worker: gpu-roce2 has the most free GPUs on two nodes of three.
        first = [
            node(f"a{i}", topology=TOPO, free_gpus=free) for i, free in enumerate([[4, 5, 6], [4, 5, 6, 7], [0, 1]])
        ]
        post(http, "prioritize", args_body(pod("bert-0", gpus=2, job="bert"), first, node_cache_capable=False))
        # Later workers see a cluster where gpu-roce1 would win a fresh vote.
        later = [
            node(f"b{i}", topology=TOPO, free_gpus=free)
            for i, free in enumerate([[0, 1, 2, 3], [0, 1, 2, 4, 5], [0, 1, 2]])
        ]
        for worker in range(1, 4):
            body = args_body(pod(f"bert-{worker}", gpus=2, job="bert"), later, node_cache_capable=False)
            assert [h["Score"] for h in post(http, "prioritize/roce", body)] == [0, 10, 0]
        answer = http.get("/v1/roce-class", params={"gpus": 2, "job": "ml/bert"}).json()
        assert answer["class"] == "gpu-roce2" and answer["remembered"] is True
        assert http.get("/v1/roce-class", params={"gpus": 2}).json()["class"] == "gpu-roce1"


def test_partial_mode_credits_nodes_holding_some_datasets() -> None:
    wanted = [{"name": "big", "source": "s3://b"}, {"name": "small", "source": "s3://s"}]
    nodes = [
        node("both", inventory=inventory_json(datasets={"big": holding(size=3 * GIB), "small": holding(size=GIB)})),
        node("big-only", inventory=inventory_json(datasets={"big": holding(size=3 * GIB)})),
        node("small-only", inventory=inventory_json(datasets={"small": holding(size=GIB)})),
    ]
    body = args_body(pod(datasets=wanted), nodes, node_cache_capable=False)
    for partial, expected in ((False, [10, 0, 0]), (True, [10, 7, 2])):
        with serving(create_app(Settings(partial_datasets=partial))) as url, httpx.Client(base_url=url) as http:
            assert [h["Score"] for h in post(http, "prioritize/dataset", body)] == expected


# A request body written out literally, field for field as Go's encoding/json marshals
# extenderv1.ExtenderArgs for nodeCacheCapable: false (struct field order, empty
# TypeMeta omitted, ListMeta as {}), with the reply bytes kube-scheduler decodes.
LITERAL_ARGS = (
    b'{"Pod":{"metadata":{"name":"bert-0","namespace":"ml","uid":"0f1e","resourceVersion":"42",'
    b'"creationTimestamp":"2026-11-21T10:00:00Z","labels":{"dsagent.io/job":"bert"},'
    b'"annotations":{"dsagent.io/datasets":"imagenet"}},"spec":{"containers":[{"name":"train",'
    b'"image":"pytorch:24.05","resources":{"limits":{"nvidia.com/gpu":"1"},"requests":{"nvidia.com/gpu":"1"}}}],'
    b'"restartPolicy":"Never","schedulerName":"default-scheduler"},"status":{"phase":"Pending","qosClass":"BestEffort"}},'
    b'"Nodes":{"metadata":{},"items":[{"metadata":{"name":"n1","uid":"a1","resourceVersion":"7",'
    b'"creationTimestamp":"2026-10-01T08:00:00Z","annotations":{"dsagent.io/inventory":'
    b'"{\\"version\\":1,\\"node\\":\\"n1\\",\\"capacityBytes\\":100,\\"freeBytes\\":50,\\"datasets\\":'
    b'{\\"imagenet\\":{\\"digest\\":\\"aa\\",\\"sizeBytes\\":10,\\"files\\":1,\\"state\\":\\"ready\\",'
    b'\\"inUse\\":false,\\"lastUsed\\":null}}}"}},"spec":{},"status":{"allocatable":{"nvidia.com/gpu":"8"}}},'
    b'{"metadata":{"name":"n2","uid":"a2","resourceVersion":"8","creationTimestamp":"2026-10-01T08:00:00Z"},'
    b'"spec":{},"status":{"allocatable":{"nvidia.com/gpu":"0"}}}]},"NodeNames":null}'
)


def test_literal_go_request_gets_byte_exact_replies(client: httpx.Client) -> None:
    prioritized = client.post("/prioritize/dataset", content=LITERAL_ARGS)
    assert prioritized.content == b'[{"Host":"n1","Score":10},{"Host":"n2","Score":0}]'
    assert prioritized.headers["content-type"] == "application/json"
    filtered = client.post("/filter", content=LITERAL_ARGS).json()
    assert [n["metadata"]["name"] for n in filtered["Nodes"]["items"]] == ["n1"]
    assert filtered["NodeNames"] is None and filtered["Error"] == ""
    assert filtered["FailedNodes"] == {"n2": "0 free GPUs, pod needs 1"}
    assert filtered["FailedAndUnresolvableNodes"] == {}


def timed_pod(annotations: dict[str, str], gpus: int = 2) -> dict[str, Any]:
    raw = pod(gpus=gpus)
    raw["metadata"]["annotations"].update(annotations)
    raw["metadata"]["creationTimestamp"] = "2026-11-22T09:00:00Z"
    return raw


def test_prioritize_time_meets_deadlines_first_and_a_bad_annotation_scores_zero(client: httpx.Client) -> None:
    nodes = [
        node("roomy", topology=TOPO, free_gpus=range(8)),
        node("tight", topology=TOPO, free_gpus=[0, 1]),
        node("full", topology=TOPO, free_gpus=[]),
    ]
    good = {
        "dsagent.io/params": "1B",
        "dsagent.io/step-seconds": "100ms",
        "dsagent.io/steps": "1000",
        "dsagent.io/deadline": "2100-01-01T00:00:00Z",
    }
    scores = {
        h["Host"]: h["Score"]
        for h in post(client, "prioritize/time", args_body(timed_pod(good), nodes, node_cache_capable=False))
    }
    # the deadline is far: both nodes that can hold 2 GPUs are in the top tier (6..10); the
    # exact fit wins; a node without free GPUs scores 0
    assert scores["full"] == 0 and 6 <= scores["roomy"] < scores["tight"] <= 10
    past = dict(good, **{"dsagent.io/deadline": "2000-01-01T00:00:00Z"})
    late = {
        h["Host"]: h["Score"]
        for h in post(client, "prioritize/time", args_body(timed_pod(past), nodes, node_cache_capable=False))
    }
    assert 1 <= late["roomy"] <= 5 and 1 <= late["tight"] <= 5
    for bad in (
        {"dsagent.io/params": "lots", "dsagent.io/step-seconds": "1", "dsagent.io/steps": "1"},
        {"dsagent.io/params": "1B", "dsagent.io/step-seconds": "1", "dsagent.io/steps": "9" * 60},
    ):
        result = post(client, "prioritize/time", args_body(timed_pod(bad), nodes, node_cache_capable=False))
        assert [h["Score"] for h in result] == [0, 0, 0]


def test_plan_answers_over_the_nodes_seen_and_refuses_bad_queries() -> None:
    with serving(create_app(Settings())) as url, httpx.Client(base_url=url, timeout=30) as http:
        nodes = [node("three", topology=TOPO, free_gpus=[0, 1, 2]), node("one", topology=TOPO, free_gpus=[7])]
        post(http, "prioritize", args_body(pod(gpus=1), nodes, node_cache_capable=False))
        # tiny gradients, 1 s steps, 80 steps, deadline 25 s: 4 GPUs (20 s) meet it, 3 do
        # not; no node has 4 free, so the cross-node plan takes the fragment first (3.4, 4.3)
        answer = http.get(
            "/v1/plan",
            params={"gradient-bytes": "1kB", "step-seconds": "1s", "steps": "80", "deadline": "25s", "max-gpus": "4"},
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["branch"] == "cross-expected"
        assert body["plan"]["nodes"] == [{"node": "one", "gpus": 1}, {"node": "three", "gpus": 3}]
        assert body["plan"]["meetsDeadline"] and body["candidates"]["single-late"]["gpus"] == 3
        assert body["formula"] == "efficiency"
        # the same deadline by eq. (6): t_single = 80 s, factor 0.3125 -> 25 s
        by_factor = http.get(
            "/v1/plan",
            params={
                "gradient-bytes": "1kB",
                "step-seconds": "1s",
                "steps": "80",
                "deadline-factor": "0.3125",
                "max-gpus": "4",
            },
        ).json()
        assert by_factor["plan"] == body["plan"] and by_factor["branch"] == "cross-expected"
        for query in (
            {"steps": "80", "max-gpus": "4"},
            {"gradient-bytes": "1kB", "step-seconds": "1s", "steps": "80"},
            {"params": "nope", "step-seconds": "1s", "steps": "80", "max-gpus": "4"},
        ):
            bad = http.get("/v1/plan", params=query)
            assert bad.status_code == 400 and bad.json()["code"] == "invalid_request", query


def test_dsctl_plan_prints_the_extenders_plan_for_a_person(capsys: pytest.CaptureFixture[str]) -> None:
    from click.testing import CliRunner

    from dsagent.cli import main as dsctl
    from dsagent.cli.group import cli  # through the group, as a user runs it: a command invoked alone
    # keeps the help option of its own context (no -h) for the rest of the process

    with serving(create_app(Settings())) as url, httpx.Client(base_url=url, timeout=30) as http:
        post(
            http,
            "prioritize",
            args_body(pod(gpus=1), [node("eight", topology=TOPO, free_gpus=range(8))], node_cache_capable=False),
        )
        runner = CliRunner()
        done = runner.invoke(
            cli,
            [
                "plan",
                "--extender",
                url,
                "--gradient-bytes",
                "1kB",
                "--step-seconds",
                "1s",
                "--steps",
                "80",
                "--deadline",
                "25s",
                "--max-gpus",
                "4",
            ],
        )
        assert done.exit_code == 0, done.output
        assert done.output.splitlines()[0] == (
            "plan (single-expected, ranked by efficiency): 4 GPUs on eightx4: runs 20 s, ends in 20 s, "
            "meets the deadline"
        )
        # eq. (6): 80 s on one GPU x 0.3125 = the same 25 s
        args = ["--extender", url, "--gradient-bytes", "1kB", "--step-seconds", "1s", "--steps", "80"]
        by_factor = runner.invoke(cli, ["plan", *args, "--deadline-factor", "0.3125", "--max-gpus", "4"])
        assert by_factor.exit_code == 0 and by_factor.output.splitlines()[0] == done.output.splitlines()[0]
        # a refused query is the tree's InvalidInput: dsctl's edge prints one line, exit 2
        with pytest.raises(SystemExit) as refused:
            dsctl(["plan", "--extender", url, "--steps", "80", "--max-gpus", "4"])
        assert refused.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("dsctl: error: ") and "required" in err and err.count("\n") == 1, err


def test_dsctl_plan_without_an_extender_is_transient(capsys: pytest.CaptureFixture[str]) -> None:
    from dsagent.cli import main as dsctl

    with serving(create_app(Settings())) as url:
        pass  # a port that just stopped answering
    with pytest.raises(SystemExit) as unreachable:
        dsctl(["plan", "--extender", url, "--steps", "80", "--max-gpus", "4"])
    assert unreachable.value.code == 7
    assert capsys.readouterr().err.startswith(f"dsctl: error: cannot reach the extender at {url}: ")


def test_readyz_says_syncing_in_the_one_probe_shape_until_the_node_watch_has_listed() -> None:
    """The extender answered ``{"ok": true}`` / ``{"ready": false}`` where the agent
    and the webhook answer ``{"status": ...}``; now every process answers one shape."""
    from kubernetes import client as k8s

    from tools.support.harness import held_port

    config = k8s.Configuration()
    with held_port() as port:  # held, never listened on: the watch never lists
        config.host = f"http://127.0.0.1:{port}"
        app = create_app(Settings(watch=True), api_client=k8s.ApiClient(config))
        with serving(app) as url, httpx.Client(base_url=url, timeout=30) as http:
            reply = http.get("/readyz")
            assert reply.status_code == 503
            assert reply.json() == {"status": "syncing", "detail": "the node watch has not listed the nodes yet"}
            assert http.get("/healthz").json() == {"status": "ok"}


def test_readyz_is_ready_without_a_watch(client: httpx.Client) -> None:
    assert client.get("/readyz").json() == {"status": "ready"}
