"""The agent API's task bodies: what the clients write the agent reads, what the agent answers
the clients read back, and what a reader keeps of a hostile answer."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from dsagent.api.schemas import DatasetIn, TaskIn, TaskOut, TasksOut
from dsagent.cache.task import DatasetRequest, DatasetStatus, TaskRecord
from dsagent.cli.cache import describe
from dsagent.controller.agents import task_report, task_request
from dsplatform.wire.agenttask import (
    ALLOW_PER_FILE,
    DATASET_STATES,
    MAX_DATASETS,
    STORAGE_OPTIONS,
    DatasetProgress,
    TaskHeld,
    dataset_request,
    read_datasets,
    read_task_list,
    task_status,
)
from dsplatform.wire.agenttask import task_request as wire_task_request

DIGEST = "ab" * 16
RECORD = TaskRecord(
    "pod-1",
    created_at=1_795_000_000.0,
    lease_until=1_795_021_600.0,
    datasets=(
        DatasetStatus(
            "imagenet", "s3://b/imagenet", "s3://b/store", DIGEST, "ready", "/cache/imagenet", 900, 3, 900, 3
        ),
        DatasetStatus(
            "coco", "s3://b/coco", None, None, "fetching", size_bytes=400, bytes_done=100, rate=12.345, eta=24.06
        ),
        DatasetStatus(
            "broken", "s3://b/broken", None, None, "failed", error={"code": "not_found", "message": "no such bucket"}
        ),
    ),
)


def test_the_requests_the_clients_write_are_what_the_agent_reads() -> None:
    written = [
        dataset_request("imagenet", "s3://b/imagenet"),
        dataset_request("coco", "s3://b/coco", bundles="s3://b/store", storage_options={"anon": True}),
        dataset_request("laion", "s3://b/laion", bundles="s3://b/store", allow_per_file=True),
    ]
    body = json.loads(json.dumps(wire_task_request(written)))
    read = [d.to_request() for d in TaskIn.model_validate(body).datasets]
    assert read == [
        DatasetRequest("imagenet", "s3://b/imagenet"),
        DatasetRequest("coco", "s3://b/coco", "s3://b/store"),
        DatasetRequest("laion", "s3://b/laion", "s3://b/store", allow_per_file=True),
    ]
    assert read[1].storage_options == {"anon": True}
    assert DatasetIn.model_fields["storage_options"].alias == STORAGE_OPTIONS
    assert DatasetIn.model_fields["allow_per_file"].alias == ALLOW_PER_FILE
    assert TaskIn.model_json_schema()["properties"]["datasets"]["maxItems"] == MAX_DATASETS


def test_the_controller_asks_for_a_dataset_by_its_spec() -> None:
    assert task_request("d", {"source": "s3://b/d"}) == {"name": "d", "source": "s3://b/d"}
    with_store = task_request("d", {"source": "s3://b/d", "bundles": "s3://b/store"})
    assert with_store == {"name": "d", "source": "s3://b/d", "bundles": "s3://b/store", ALLOW_PER_FILE: True}
    read = TaskIn.model_validate(wire_task_request([with_store])).datasets[0].to_request()
    assert read == DatasetRequest("d", "s3://b/d", "s3://b/store", allow_per_file=True)


def test_the_status_the_agent_writes_is_what_its_readers_read_back() -> None:
    body = json.loads(json.dumps(task_status(RECORD)))
    TaskOut.model_validate(body)  # the documented response model
    assert (body["task"], body["state"], body["createdAt"], body["leaseUntil"]) == (
        "pod-1",
        "failed",
        "2026-11-18T11:06:40Z",
        "2026-11-18T17:06:40Z",
    )
    coco = body["datasets"][1]
    assert (coco["rateBytesPerSecond"], coco["etaSeconds"], coco["bytesDone"], coco["sizeBytes"]) == (
        12.3,
        24.1,
        100,
        400,
    )
    assert read_datasets(body) == (
        DatasetProgress("imagenet", "ready", 900, 900),
        DatasetProgress("coco", "fetching", 400, 100),
        DatasetProgress("broken", "failed", 0, 0, "no such bucket"),
    )
    assert task_report("n1", (200, body)) == {"node": "n1", "state": "ready", "bytesDone": 900, "bytesWanted": 900}
    assert "imagenet ready, coco fetching, broken failed" in describe(body)


@pytest.mark.parametrize(
    ("body", "read"),
    [
        (None, ()),
        ({"datasets": "all"}, ()),
        ({"datasets": [7, "x"]}, ()),
        (
            {"datasets": [{"name": 3, "state": "exploded", "sizeBytes": -5, "bytesDone": True}]},
            (DatasetProgress("", "unknown", 0, 0),),
        ),
        (
            {"datasets": [{"name": "d", "state": "failed", "error": {"message": "x" * 10_000}}]},
            (DatasetProgress("d", "failed", 0, 0, "x" * 300),),
        ),
    ],
    ids=["none", "not-a-list", "not-objects", "wrong-types", "long-message"],
)
def test_a_reader_keeps_only_known_states_and_whole_counts(body: Any, read: tuple[DatasetProgress, ...]) -> None:
    assert read_datasets(body) == read
    assert all(p.state in (*DATASET_STATES, "unknown") for p in read_datasets(body))


def test_an_answer_without_datasets_is_a_failed_report_naming_the_agents_message() -> None:
    report = task_report("n1", (404, {"code": "not_found", "message": "no such task"}))
    assert report == {"node": "n1", "state": "failed", "bytesDone": 0, "bytesWanted": 0, "message": "no such task"}
    assert task_report("n1", None)["state"] == "unreachable"


def test_the_task_list_the_agent_writes_is_what_the_controller_reads_back() -> None:
    pinned = dataclasses.replace(RECORD, task_id="warm.team-a.imagenet", namespace="team-a")
    body = json.loads(json.dumps({"tasks": [task_status(pinned), task_status(RECORD)]}))
    TasksOut.model_validate(body)  # the documented response model
    assert body["tasks"][0]["namespace"] == "team-a" and body["tasks"][1]["namespace"] is None
    assert read_task_list(body) == (
        TaskHeld("warm.team-a.imagenet", "team-a", ("imagenet", "coco", "broken")),
        TaskHeld("pod-1", None, ("imagenet", "coco", "broken")),
    )


@pytest.mark.parametrize(
    ("body", "read"),
    [
        (None, ()),
        ({"tasks": {"task": "x"}}, ()),
        ({"tasks": [7, {"task": 3}, {"task": ""}, {"task": "x" * 1000}]}, ()),
        (
            {"tasks": [{"task": "t", "namespace": ["team-a"], "datasets": [{"name": 5}, "d", {"name": "ok"}]}]},
            (TaskHeld("t", None, ("ok",)),),
        ),
        ({"tasks": [{"task": "t", "namespace": "team-a", "datasets": "all"}]}, (TaskHeld("t", "team-a", ()),)),
    ],
    ids=["none", "not-a-list", "no-task-id", "wrong-types", "datasets-not-a-list"],
)
def test_a_reader_of_the_task_list_keeps_ids_namespaces_and_names_only(body: Any, read: tuple[TaskHeld, ...]) -> None:
    assert read_task_list(body) == read
