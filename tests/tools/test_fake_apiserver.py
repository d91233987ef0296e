"""The fake API server speaks what the unmodified ``kubernetes`` client sends and expects."""

from __future__ import annotations

import copy
import errno
import json
import socket
import threading
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tools.support.fake_apiserver import (
    FakeApiServer,
    field_selector_matches,
    json_patch,
    label_selector_matches,
    make_dataset,
    make_lease,
    make_node,
    make_pod,
    merge_patch,
)

GROUP, VERSION, PLURAL = "dsagent.io", "v1alpha1", "datasets"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


def collect(stream_factory: Any, until: int, timeout: int = 5) -> list[dict[str, Any]]:
    """Run one watch with a server-side timeout and return the events it delivered."""
    events: list[dict[str, Any]] = []
    w = watch.Watch()
    for event in w.stream(stream_factory.func, *stream_factory.args, timeout_seconds=timeout, **stream_factory.kwargs):
        events.append(event)
        if len(events) >= until:
            w.stop()
    return events


class Call:
    def __init__(self, func: Any, *args: Any, **kwargs: Any) -> None:
        self.func, self.args, self.kwargs = func, args, kwargs


def in_background(target: Any) -> tuple[threading.Thread, list[Any]]:
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(target())
        except Exception as exc:  # handed back to the test
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def _take(w: watch.Watch, stream: Any, n: int) -> list[dict[str, Any]]:
    out = []
    for event in stream:
        out.append(event)
        if len(out) >= n:
            w.stop()
    return out


# -- list, get, selectors


def test_list_nodes_carries_a_resource_version_and_real_models(apiserver: FakeApiServer, api_client: Any) -> None:
    apiserver.create(make_node("gpu-1"))
    apiserver.create(make_node("gpu-2", labels={"pool": "a100"}))
    nodes = client.CoreV1Api(api_client).list_node()
    assert [n.metadata.name for n in nodes.items] == ["gpu-1", "gpu-2"]
    assert int(nodes.metadata.resource_version) >= int(nodes.items[1].metadata.resource_version)
    assert nodes.items[0].status.allocatable["nvidia.com/gpu"] == "8"


def test_get_of_a_missing_object_is_a_404_status(api_client: Any) -> None:
    with pytest.raises(ApiException) as info:
        client.CoreV1Api(api_client).read_node("nope")
    assert info.value.status == 404
    assert '"reason": "NotFound"' in info.value.body


def test_pods_are_listed_by_node_with_a_field_selector(apiserver: FakeApiServer, api_client: Any) -> None:
    apiserver.create(make_pod("a", node_name="gpu-1"))
    apiserver.create(make_pod("b", node_name="gpu-2"))
    apiserver.create(make_pod("c"))
    pods = client.CoreV1Api(api_client).list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-1")
    assert [p.metadata.name for p in pods.items] == ["a"]


def test_pods_are_listed_by_label_selector_within_a_namespace(apiserver: FakeApiServer, api_client: Any) -> None:
    apiserver.create(make_pod("a", labels={"dsagent.io/job": "j1"}))
    apiserver.create(make_pod("b", labels={"dsagent.io/job": "j2"}))
    apiserver.create(make_pod("c", namespace="other", labels={"dsagent.io/job": "j1"}))
    pods = client.CoreV1Api(api_client).list_namespaced_pod("default", label_selector="dsagent.io/job in (j1)")
    assert [p.metadata.name for p in pods.items] == ["a"]


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("", {}, True),
        ("a=1", {"a": "1"}, True),
        ("a==1", {"a": "1"}, True),
        ("a=1", {"a": "2"}, False),
        ("a!=1", {"a": "2"}, True),
        ("a!=1", {}, True),
        ("a", {"a": ""}, True),
        ("a", {}, False),
        ("!a", {}, True),
        ("!a", {"a": "x"}, False),
        ("a in (1, 2)", {"a": "2"}, True),
        ("a in (1,2)", {"a": "3"}, False),
        ("a notin (1,2)", {"a": "3"}, True),
        ("a notin (1,2)", {"a": "1"}, False),
        ("a=1,b in (x,y),!c", {"a": "1", "b": "y"}, True),
        ("a=1,b in (x,y),!c", {"a": "1", "b": "y", "c": "z"}, False),
    ],
)
def test_label_selectors(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert label_selector_matches(selector, labels) is expected


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("spec.nodeName=gpu-1", True),
        ("spec.nodeName==gpu-1", True),
        ("spec.nodeName=gpu-2", False),
        ("spec.nodeName!=", True),
        ("metadata.namespace=default,status.phase=Running", True),
        ("status.phase!=Running", False),
    ],
)
def test_field_selectors(selector: str, expected: bool) -> None:
    pod = make_pod("p", node_name="gpu-1", phase="Running")
    assert field_selector_matches(selector, pod) is expected


# -- create, replace, delete, patch


def test_create_assigns_uid_and_resource_version_and_rejects_duplicates(api_client: Any) -> None:
    api = client.CoreV1Api(api_client)
    created = api.create_namespaced_pod("default", make_pod("p"))
    assert created.metadata.uid and created.metadata.resource_version
    with pytest.raises(ApiException) as info:
        api.create_namespaced_pod("default", make_pod("p"))
    assert info.value.status == 409


def test_replace_with_a_stale_resource_version_conflicts(apiserver: FakeApiServer, api_client: Any) -> None:
    api = client.CoreV1Api(api_client)
    node = api.read_node(apiserver.create(make_node("gpu-1"))["metadata"]["name"])
    apiserver.patch("nodes", "gpu-1", {"metadata": {"labels": {"x": "1"}}})
    with pytest.raises(ApiException) as info:
        api.replace_node("gpu-1", node)
    assert info.value.status == 409


def test_delete_removes_the_pod(apiserver: FakeApiServer, api_client: Any) -> None:
    api = client.CoreV1Api(api_client)
    apiserver.create(make_pod("p"))
    api.delete_namespaced_pod("p", "default")
    assert apiserver.get("pods", "p") is None


@pytest.mark.parametrize("content_type", [MERGE, STRATEGIC])
def test_node_annotations_are_patched_and_removed_with_null(
    apiserver: FakeApiServer, api_client: Any, content_type: str
) -> None:
    api = client.CoreV1Api(api_client)
    apiserver.create(make_node("gpu-1", annotations={"keep": "me", "drop": "me"}))
    api.patch_node(
        "gpu-1",
        {"metadata": {"annotations": {"dsagent.io/free-gpus": "0,1", "drop": None}}},
        _content_type=content_type,
    )
    assert apiserver.get("nodes", "gpu-1")["metadata"]["annotations"] == {"keep": "me", "dsagent.io/free-gpus": "0,1"}


def test_a_json_patch_applies_and_a_map_body_goes_as_strategic_merge(apiserver: FakeApiServer, api_client: Any) -> None:
    api = client.CoreV1Api(api_client)
    apiserver.create(make_node("gpu-1"))
    api.patch_node("gpu-1", [{"op": "add", "path": "/metadata/annotations/dsagent.io~1x", "value": "1"}])
    assert apiserver.get("nodes", "gpu-1")["metadata"]["annotations"]["dsagent.io/x"] == "1"
    api.patch_node("gpu-1", {"metadata": {"annotations": {"y": "2"}}})
    assert apiserver.requests[-1].content_type == STRATEGIC
    assert apiserver.get("nodes", "gpu-1")["metadata"]["annotations"]["y"] == "2"


def test_a_json_patch_must_be_a_list_of_operations() -> None:
    from tools.support.fake_apiserver import ApiError

    with pytest.raises(ApiError) as info:
        json_patch({}, {"op": "add"})
    assert info.value.code == 400


def test_custom_resources_reject_strategic_merge_as_the_real_server_does(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    apiserver.create(make_dataset("d"))
    with pytest.raises(ApiException) as info:
        client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, "d", {"spec": {"source": "x"}}, _content_type=STRATEGIC
        )
    assert info.value.status == 415


def test_a_patch_that_changes_nothing_keeps_the_resource_version(apiserver: FakeApiServer, api_client: Any) -> None:
    api = client.CoreV1Api(api_client)
    rv = apiserver.create(make_node("gpu-1", annotations={"a": "1"}))["metadata"]["resourceVersion"]
    api.patch_node("gpu-1", {"metadata": {"annotations": {"a": "1"}}}, _content_type=MERGE)
    assert apiserver.get("nodes", "gpu-1")["metadata"]["resourceVersion"] == rv


def test_unknown_patch_types_get_415(apiserver: FakeApiServer, api_client: Any) -> None:
    apiserver.create(make_node("gpu-1"))
    with pytest.raises(ApiException) as info:
        client.CoreV1Api(api_client).patch_node("gpu-1", {"a": 1}, _content_type="application/apply-patch+yaml")
    assert info.value.status == 415


@pytest.mark.parametrize(
    ("doc", "ops", "expected"),
    [
        ({"a": 1}, [{"op": "replace", "path": "/a", "value": 2}], {"a": 2}),
        ({"a": [1, 3]}, [{"op": "add", "path": "/a/1", "value": 2}], {"a": [1, 2, 3]}),
        ({"a": [1]}, [{"op": "add", "path": "/a/-", "value": 2}], {"a": [1, 2]}),
        ({"a": 1, "b": 2}, [{"op": "remove", "path": "/a"}], {"b": 2}),
        ({"a": {"x": 1}}, [{"op": "move", "from": "/a/x", "path": "/b"}], {"a": {}, "b": 1}),
        ({"a": 1}, [{"op": "copy", "from": "/a", "path": "/b"}], {"a": 1, "b": 1}),
        ({"a": 1}, [{"op": "test", "path": "/a", "value": 1}], {"a": 1}),
    ],
)
def test_json_patch_operations(doc: dict[str, Any], ops: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    assert json_patch(doc, ops) == expected


def test_merge_patch_merges_maps_replaces_lists_and_deletes_nulls() -> None:
    assert merge_patch({"a": {"x": 1, "y": 2}, "l": [1, 2]}, {"a": {"y": None, "z": 3}, "l": [3]}) == {
        "a": {"x": 1, "z": 3},
        "l": [3],
    }


# -- the Dataset custom resource and its status subresource


def test_dataset_status_is_written_only_through_the_status_subresource(api_client: Any) -> None:
    api = client.CustomObjectsApi(api_client)
    api.create_namespaced_custom_object(GROUP, VERSION, "ml", PLURAL, make_dataset("imagenet", namespace="ml"))
    api.patch_namespaced_custom_object(
        GROUP, VERSION, "ml", PLURAL, "imagenet", {"spec": {"source": "s3://new"}, "status": {"digest": "x" * 32}}
    )
    obj = api.get_namespaced_custom_object(GROUP, VERSION, "ml", PLURAL, "imagenet")
    assert obj["spec"]["source"] == "s3://new" and "status" not in obj
    assert obj["metadata"]["generation"] == 2
    api.patch_namespaced_custom_object_status(
        GROUP, VERSION, "ml", PLURAL, "imagenet", {"spec": {"source": "ignored"}, "status": {"digest": "a" * 32}}
    )
    obj = api.get_namespaced_custom_object(GROUP, VERSION, "ml", PLURAL, "imagenet")
    assert obj["status"] == {"digest": "a" * 32}
    assert obj["spec"]["source"] == "s3://new"


def test_datasets_list_across_namespaces(apiserver: FakeApiServer, api_client: Any) -> None:
    apiserver.create(make_dataset("a", namespace="x"))
    apiserver.create(make_dataset("b", namespace="y"))
    listed = client.CustomObjectsApi(api_client).list_cluster_custom_object(GROUP, VERSION, PLURAL)
    assert [d["metadata"]["name"] for d in listed["items"]] == ["a", "b"]
    assert listed["metadata"]["resourceVersion"]


# -- watch


def test_a_watch_without_resource_version_starts_with_the_current_state_then_changes(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    api = client.CoreV1Api(api_client)
    apiserver.create(make_node("gpu-1"))
    thread, result = in_background(lambda: collect(Call(api.list_node), until=3))
    apiserver.wait_for(lambda: apiserver.open_watches == 1, what="the watch")
    apiserver.patch("nodes", "gpu-1", {"metadata": {"labels": {"x": "1"}}})
    apiserver.delete("nodes", "gpu-1")
    thread.join(10)
    events = result[0]
    assert [(e["type"], e["object"].metadata.name) for e in events] == [
        ("ADDED", "gpu-1"),
        ("MODIFIED", "gpu-1"),
        ("DELETED", "gpu-1"),
    ]
    assert events[1]["object"].metadata.labels["x"] == "1"


def test_a_watch_from_a_resource_version_sends_only_later_changes(apiserver: FakeApiServer, api_client: Any) -> None:
    api = client.CoreV1Api(api_client)
    apiserver.create(make_node("old"))
    rv = api.list_node().metadata.resource_version
    apiserver.create(make_node("new"))
    events = collect(Call(api.list_node, resource_version=rv), until=1)
    assert [(e["type"], e["object"].metadata.name) for e in events] == [("ADDED", "new")]


def test_a_pod_bound_to_the_node_arrives_as_added_on_a_node_scoped_watch(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    api = client.CoreV1Api(api_client)
    apiserver.create(make_pod("p"))
    rv = api.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-1").metadata.resource_version
    thread, result = in_background(
        lambda: collect(
            Call(api.list_pod_for_all_namespaces, field_selector="spec.nodeName=gpu-1", resource_version=rv), until=2
        )
    )
    apiserver.wait_for(lambda: apiserver.open_watches == 1, what="the watch")
    apiserver.patch("pods", "p", {"spec": {"nodeName": "gpu-1"}})
    apiserver.patch("pods", "p", {"spec": {"nodeName": "gpu-2"}})  # not realistic, but a transition
    thread.join(10)
    assert [e["type"] for e in result[0]] == ["ADDED", "DELETED"]


def test_a_bookmark_moves_the_clients_resource_version_forward(apiserver: FakeApiServer, api_client: Any) -> None:
    api = client.CoreV1Api(api_client)
    rv = api.list_node().metadata.resource_version
    apiserver.create(make_node("elsewhere"))  # changes the resourceVersion, not seen below
    w = watch.Watch()
    stream = w.stream(
        api.list_node, resource_version=rv, allow_watch_bookmarks=True, label_selector="pool=none", timeout_seconds=5
    )
    thread, result = in_background(lambda: _take(w, stream, 1))
    apiserver.wait_for(lambda: apiserver.open_watches == 1, what="the watch")
    apiserver.send_bookmarks()
    thread.join(10)
    assert [e["type"] for e in result[0]] == ["BOOKMARK"]
    assert int(w.resource_version) > int(rv)
    apiserver.wait_for(lambda: apiserver.open_watches == 0, timeout=2, what="the server to notice")


def test_bookmark_events_are_sent_only_to_watches_that_allow_them(apiserver: FakeApiServer, api_client: Any) -> None:
    api = client.CoreV1Api(api_client)
    rv = api.list_node().metadata.resource_version
    thread, result = in_background(
        lambda: collect(Call(api.list_node, resource_version=rv, allow_watch_bookmarks=True), until=1)
    )
    plain_thread, plain = in_background(lambda: collect(Call(api.list_node, resource_version=rv), until=1, timeout=1))
    apiserver.wait_for(lambda: apiserver.open_watches == 2, what="two watches")
    apiserver.send_bookmarks()
    thread.join(10)
    plain_thread.join(10)
    assert [e["type"] for e in result[0]] == ["BOOKMARK"]
    assert int(result[0][0]["raw_object"]["metadata"]["resourceVersion"]) >= int(rv)
    assert plain == [[]]


def test_a_watch_from_a_compacted_resource_version_gets_410_gone(apiserver: FakeApiServer, api_client: Any) -> None:
    api = client.CoreV1Api(api_client)
    apiserver.create(make_node("gpu-1"))
    rv = api.list_node().metadata.resource_version
    apiserver.compact()
    with pytest.raises(ApiException) as info:
        collect(Call(api.list_node, resource_version=rv), until=1)
    assert info.value.status == 410
    fresh = api.list_node().metadata.resource_version
    apiserver.create(make_node("gpu-2"))
    assert [e["object"].metadata.name for e in collect(Call(api.list_node, resource_version=fresh), until=1)] == [
        "gpu-2"
    ]


def test_timeout_seconds_ends_a_quiet_watch(apiserver: FakeApiServer, api_client: Any) -> None:
    api = client.CoreV1Api(api_client)
    rv = api.list_node().metadata.resource_version
    assert collect(Call(api.list_node, resource_version=rv), until=1, timeout=1) == []


def test_a_restart_on_the_same_port_ends_watches_and_keeps_objects(apiserver: FakeApiServer, api_client: Any) -> None:
    api = client.CoreV1Api(api_client)
    apiserver.create(make_node("gpu-1"))
    port = apiserver.port
    raw = api.list_node(watch=True, _preload_content=False, resource_version="0", timeout_seconds=30)
    apiserver.wait_for(lambda: apiserver.open_watches == 1, what="the watch")
    apiserver.restart()
    assert apiserver.port == port
    # the stream ends (the connection was dropped) instead of hanging
    with pytest.raises(Exception):  # noqa: B017 - urllib3 raises one of several errors
        for _ in raw.stream(amt=None, decode_content=False):
            pass
        raise ConnectionError("stream ended")
    raw.release_conn()
    assert [n.metadata.name for n in api.list_node().items] == ["gpu-1"]


def test_a_stopped_server_refuses_connections_and_keeps_its_port(apiserver: FakeApiServer) -> None:
    apiserver.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", apiserver.port), timeout=5).close()
    other = socket.socket()
    with other, pytest.raises(OSError) as taken:  # no other server takes it meanwhile
        other.bind(("127.0.0.1", apiserver.port))
    assert taken.value.errno == errno.EADDRINUSE
    apiserver.start()
    socket.create_connection(("127.0.0.1", apiserver.port), timeout=5).close()


def test_requests_are_recorded_with_their_content_type(apiserver: FakeApiServer, api_client: Any) -> None:
    apiserver.create(make_node("gpu-1"))
    client.CoreV1Api(api_client).patch_node("gpu-1", {"metadata": {"labels": {"a": "b"}}}, _content_type=MERGE)
    [request] = apiserver.requests_matching("PATCH", "/api/v1/nodes/gpu-1")
    assert request.content_type == MERGE
    assert request.body == {"metadata": {"labels": {"a": "b"}}}


# -- coordination.k8s.io/v1 Leases


def test_leases_are_created_read_and_replaced_in_the_real_wire_format(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    import datetime as dt

    api = client.CoordinationV1Api(api_client)
    when = dt.datetime(2027, 1, 15, 8, 0, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    body = client.V1Lease(
        metadata=client.V1ObjectMeta(name="job-a"),
        spec=client.V1LeaseSpec(
            holder_identity="gpu-roce2", lease_duration_seconds=3600, acquire_time=when, renew_time=when
        ),
    )
    created = api.create_namespaced_lease("ml", body)
    assert created.spec.holder_identity == "gpu-roce2" and created.metadata.resource_version
    raw = apiserver.get("leases", "job-a", "ml")
    assert raw is not None and raw["apiVersion"] == "coordination.k8s.io/v1" and "generation" not in raw["metadata"]
    assert raw["spec"]["renewTime"] == "2027-01-15T07:00:00.123456Z"  # MicroTime, UTC, as the server returns it
    with pytest.raises(client.ApiException) as exists:
        api.create_namespaced_lease("ml", body)
    assert exists.value.status == 409 and json.loads(exists.value.body)["reason"] == "AlreadyExists"
    created.spec.holder_identity = "gpu-roce1"
    api.replace_namespaced_lease("job-a", "ml", created)
    stale = copy.deepcopy(created)
    with pytest.raises(client.ApiException) as conflict:
        api.replace_namespaced_lease("job-a", "ml", stale)
    assert conflict.value.status == 409 and json.loads(conflict.value.body)["reason"] == "Conflict"
    assert api.read_namespaced_lease("job-a", "ml").spec.holder_identity == "gpu-roce1"


@pytest.mark.parametrize(
    ("spec", "status", "message"),
    [
        ({"renewTime": "yesterday"}, 400, "parsing time"),
        ({"leaseDurationSeconds": "3600"}, 400, "expected int"),
        ({"holder": "x"}, 400, 'unknown field "holder"'),
        ({"leaseDurationSeconds": -1}, 422, "must be greater than or equal to 0"),
    ],
)
def test_a_malformed_lease_is_refused_as_the_api_server_does(
    apiserver: FakeApiServer, spec: dict[str, Any], status: int, message: str
) -> None:
    # Raw HTTP: the client validates its own bodies; kubectl or another client may not.
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "bad"}, "spec": spec}
    code, answer = send(apiserver, "POST", "/apis/coordination.k8s.io/v1/namespaces/ml/leases", body)
    assert code == status and answer["kind"] == "Status" and message in answer["message"]


def send(apiserver: FakeApiServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"{apiserver.url}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def test_leases_have_no_status_subresource(apiserver: FakeApiServer) -> None:
    apiserver.create(make_lease("job-a", namespace="ml", holder="gpu-roce1"))
    code, _ = send(apiserver, "GET", "/apis/coordination.k8s.io/v1/namespaces/ml/leases/job-a/status")
    assert code == 404


@pytest.mark.parametrize(
    ("error", "printed"), [(BrokenPipeError, False), (ConnectionResetError, False), (KeyError, True)]
)
def test_a_client_gone_before_its_answer_is_not_printed_as_a_server_error(
    apiserver: FakeApiServer, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
    error: type[Exception], printed: bool,
) -> None:  # fmt: skip
    import urllib.error
    import urllib.request

    def fails(*args: Any) -> Any:
        raise error("the test's")

    monkeypatch.setattr(apiserver, "_handle", fails)
    server = apiserver._httpd
    assert server is not None
    done = threading.Event()
    real_shutdown = server.shutdown_request

    def shutdown_request(request: Any) -> None:  # after handle_error, in the request's thread
        real_shutdown(request)
        done.set()

    monkeypatch.setattr(server, "shutdown_request", shutdown_request)
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"{apiserver.url}/api/v1/nodes", timeout=5)
    assert done.wait(5)
    err = capfd.readouterr().err
    assert ("Traceback" in err) is printed, err


def test_cached_lists_follow_every_change_of_their_type() -> None:
    """``list_cache`` (the benchmarks): a list is served from bytes made once, until an
    object of its type changes; selectors still apply."""
    with FakeApiServer(list_cache=True) as server:
        core = client.CoreV1Api(server.api_client())
        server.create(make_node("n1"))
        assert [n.metadata.name for n in core.list_node().items] == ["n1"]
        server.create(make_node("n2", labels={"pool": "a"}))
        assert [n.metadata.name for n in core.list_node().items] == ["n1", "n2"]
        assert [n.metadata.name for n in core.list_node(label_selector="pool=a").items] == ["n2"]
        server.patch("nodes", "n1", {"metadata": {"labels": {"pool": "a"}}})
        assert [n.metadata.name for n in core.list_node(label_selector="pool=a").items] == ["n1", "n2"]
        server.create(make_pod("p1"))  # another type: the node lists stay as they were
        server.delete("nodes", "n2")
        assert [n.metadata.name for n in core.list_node().items] == ["n1"]


@pytest.mark.parametrize("list_cache", [False, True])
def test_a_list_with_a_limit_comes_in_pages_of_one_snapshot_unless_from_the_watch_cache(list_cache: bool) -> None:
    """As the API server: ``limit`` pages with ``continue`` tokens, every page of the list as
    it was at the first (etcd's snapshot); ``resourceVersion=0`` (the watch cache) sends the
    whole list; a token the server no longer knows is 410 Expired."""
    with FakeApiServer(list_cache=list_cache) as server:
        for i in range(5):
            server.create(make_node(f"n{i}"))
        api = server.api_client()
        try:
            core = client.CoreV1Api(api)

            def page(**kwargs: Any) -> dict[str, Any]:
                return dict(json.loads(core.list_node(_preload_content=False, **kwargs).data))

            first = page(limit=2)
            assert [n["metadata"]["name"] for n in first["items"]] == ["n0", "n1"]
            assert first["metadata"]["remainingItemCount"] == 3
            server.create(make_node("later"))  # after the first page: not in this list
            names, token = ["n0", "n1"], first["metadata"]["continue"]
            while token:
                doc = page(limit=2, _continue=token)
                assert doc["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
                names += [n["metadata"]["name"] for n in doc["items"]]
                token = doc["metadata"].get("continue")
            assert names == ["n0", "n1", "n2", "n3", "n4"]
            assert len(page(limit=2, resource_version="0")["items"]) == 6  # the watch cache: whole
            with pytest.raises(ApiException) as gone:
                page(limit=2, _continue="unknown")
            assert gone.value.status == 410
        finally:
            api.close()
