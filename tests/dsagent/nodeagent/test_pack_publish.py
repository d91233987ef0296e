"""``dsctl pack --publish``: packing records the new digest in the Dataset's status."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsagent.cli import main
from dsagent.format.manifest import read_manifest
from tools.support.fake_apiserver import FakeApiServer


def test_pack_with_publish_creates_the_dataset_and_records_its_digest(
    apiserver: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "src"
    (source / "cats").mkdir(parents=True)
    (source / "cats" / "1.jpg").write_bytes(b"\xff\xd8 a cat")
    (source / "dogs.txt").write_text("woof\n")
    store = tmp_path / "store"
    monkeypatch.setenv("KUBECONFIG", str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    main(["pack", str(source), "--name", "pets", "--to", str(store), "--publish", "ml-team", "--no-digest-cache"])

    manifest = read_manifest(str(store), "pets")
    dataset = apiserver.get("datasets", "pets", namespace="ml-team")
    assert dataset is not None
    assert dataset["spec"]["source"] == str(source)
    assert dataset["status"]["digest"] == manifest.digest
    assert dataset["status"]["files"] == 2
    assert f"published Dataset ml-team/pets: digest {manifest.digest}" in capsys.readouterr().out


def test_pack_with_publish_and_no_cluster_says_how_to_reach_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.txt").write_text("a")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "pack",
                str(source),
                "--name",
                "a",
                "--to",
                str(tmp_path / "store"),
                "--publish",
                "ns",
                "--no-digest-cache",
            ]
        )

    assert exit_info.value.code == 7  # transient: the packing itself is done and kept
    err = capsys.readouterr().err
    assert "no Kubernetes configuration" in err and "KUBECONFIG" in err
    assert read_manifest(str(tmp_path / "store"), "a").file_count == 1
