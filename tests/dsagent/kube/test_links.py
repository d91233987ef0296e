"""Stable per-pod dataset paths: links to the versions a task is bound to."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from dsagent.cli.links import main
from dsagent.errors import InvalidInput
from dsagent.kube.stablelinks import link_targets, write_links

A, B = "a" * 32, "b" * 32


def record(state: str = "ready", **digests: str | None) -> dict[str, Any]:
    return {"task": "t", "state": state, "datasets": [{"name": n, "digest": d} for n, d in digests.items()]}


def test_each_dataset_links_to_its_bound_version() -> None:
    assert link_targets(record(imagenet=A, coco=B), "/datasets") == {
        "imagenet": f"/datasets/imagenet/{A}",
        "coco": f"/datasets/coco/{B}",
    }


@pytest.mark.parametrize(
    ("rec", "complaint"),
    [
        (record("pending", imagenet=A), "not ready"),
        (record(imagenet=None), "no digest"),
        (record(imagenet="../../etc"), "no digest"),
        ({"state": "ready", "datasets": [{"name": "../x", "digest": A}]}, "unusable dataset name"),
    ],
)
def test_what_cannot_be_linked_is_refused(rec: dict[str, Any], complaint: str) -> None:
    with pytest.raises(InvalidInput, match=complaint):
        link_targets(rec, "/datasets")


def test_links_are_replaced_in_place(tmp_path: Path) -> None:
    write_links(tmp_path / "links", {"imagenet": "/datasets/imagenet/" + A})
    write_links(tmp_path / "links", {"imagenet": "/datasets/imagenet/" + B})
    assert os.readlink(tmp_path / "links" / "imagenet") == "/datasets/imagenet/" + B
    assert sorted(os.listdir(tmp_path / "links")) == ["imagenet"]


def test_without_a_task_id_the_command_fails_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("DSAGENT_TASK_ID", raising=False)
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path), "/datasets"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == "dsagent links: error: DSAGENT_TASK_ID is not set\n"
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith("dsagent links: error: usage: python -m dsagent.cli.links ")
