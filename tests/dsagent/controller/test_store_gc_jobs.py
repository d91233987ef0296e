"""The Dataset controller's store gc Jobs against the fake API server,
and the Job's own command run as ``dsctl`` against a real local store."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from dsagent.controller.controllersettings import ControllerSettings
from dsagent.controller.reconcile import DatasetController
from dsagent.controller.storegc import due, gc_job_name
from tests.clock import Clock
from tools.support.fake_apiserver import FakeApiServer, make_dataset

NS = "dsplatform"
DAY = 86400.0


def controller(api_client: Any, clock: Clock, *, store_gc: float | None = DAY) -> DatasetController:
    settings = ControllerSettings(
        namespace=NS,
        identity="c-1",
        pack_image="registry.example/dsp:1",
        pack_service_account="bucket-writer",
        store_gc_s=store_gc,
        store_gc_grace_s=3 * DAY,
    )
    # a fixed listing: the pack Job's state is what these tests steer
    return DatasetController(api_client, settings, clock=clock, fingerprint=lambda url, options: "f" * 32)


def packed(name: str, store: str, namespace: str = "ml", *, auto: bool = True) -> dict[str, Any]:
    ds = make_dataset(name, namespace=namespace, source=f"s3://src/{name}", bundles=store)
    ds["spec"]["pack"] = {"auto": auto}
    return ds


def gc_jobs(apiserver: FakeApiServer) -> list[dict[str, Any]]:
    return [j for j in apiserver.list("jobs") if j["metadata"]["labels"]["app.kubernetes.io/component"] == "store-gc"]


def finish(apiserver: FakeApiServer, job: str, condition: str = "Complete") -> None:
    apiserver.patch(
        "jobs",
        job,
        {"status": {"conditions": [{"type": condition, "status": "True"}]}},
        namespace=NS,
        subresource="status",
    )


def test_off_by_default_no_gc_job(apiserver: FakeApiServer, api_client: Any) -> None:
    apiserver.create(packed("coco", "s3://bundles/store"))
    controller(api_client, Clock(), store_gc=None).reconcile_all()
    assert gc_jobs(apiserver) == []
    assert ControllerSettings.from_env({}).store_gc_s is None
    settings = ControllerSettings.from_env(
        {"DSAGENT_CONTROLLER_STORE_GC": "24h", "DSAGENT_CONTROLLER_STORE_GC_GRACE": "7d"}
    )
    assert (settings.store_gc_s, settings.store_gc_grace_s) == (DAY, 7 * DAY)


def test_one_gc_job_per_store_and_interval_never_beside_a_running_pack(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    store, other = "s3://bundles/store", "gs://elsewhere/store"
    apiserver.create(packed("coco", store))
    apiserver.create(packed("imagenet", store, namespace="vision"))
    apiserver.create(packed("manual", other, auto=False))  # not packed by the controller: not its to collect
    clock = Clock()
    ctl = controller(api_client, clock)
    ctl.reconcile_all()  # the first pass starts both packs: their store waits
    assert gc_jobs(apiserver) == []
    for job in apiserver.list("jobs"):
        finish(apiserver, job["metadata"]["name"])
    ctl.reconcile_all()  # the packs succeeded: the store is collected in the same pass
    [job] = gc_jobs(apiserver)
    number = int(clock.now // DAY)
    assert job["metadata"]["name"] == gc_job_name(store, number) and job["metadata"]["namespace"] == NS
    spec = job["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert container["command"] == ["dsctl"] and container["image"] == "registry.example/dsp:1"
    assert container["args"] == ["gc", "--delete", "--grace", f"{int(3 * DAY)}s", "--", store]
    assert spec["serviceAccountName"] == "bucket-writer" and spec["securityContext"]["runAsNonRoot"] is True
    assert job["spec"]["activeDeadlineSeconds"] < DAY  # ended before the next interval's Job
    clock.now += 3600
    ctl.reconcile_all()
    controller(api_client, clock).reconcile_all()  # a new leader, same interval: no second Job
    assert len(gc_jobs(apiserver)) == 1
    clock.now += DAY  # the next interval, while the first Job still runs: wait for it
    ctl.reconcile_all()
    assert len(gc_jobs(apiserver)) == 1
    finish(apiserver, job["metadata"]["name"])
    ctl.reconcile_all()
    assert sorted(j["metadata"]["name"] for j in gc_jobs(apiserver)) == sorted(
        [gc_job_name(store, number), gc_job_name(store, number + 1)]
    )


def test_due_is_pure_and_skips_hostile_or_running_stores() -> None:
    running = packed("a", "s3://b/one")
    running["status"] = {"pack": {"state": "Running"}}
    datasets = [
        running,
        packed("b", "s3://b/one"),  # same store as a running pack: skipped
        packed("c", "s3://b/two"),
        packed("d", "x" * 5000),  # absurdly long: skipped
        {"spec": "not an object"},
        packed("e", "s3://b/three", auto=False),
    ]
    assert [d.store for d in due(datasets, now=10 * DAY, interval_s=DAY)] == ["s3://b/two"]
    [item] = due(datasets, now=10 * DAY, interval_s=DAY)
    assert (item.job, item.previous) == (gc_job_name("s3://b/two", 10), gc_job_name("s3://b/two", 9))


def test_the_jobs_command_collects_a_real_store(apiserver: FakeApiServer, api_client: Any, tmp_path: Path) -> None:
    """The Job's args, given to dsctl as the container does: the old orphan goes, the live
    bundle and the young orphan stay."""
    from dsagent.cli import main
    from dsagent.format.bundles.bundle import pack

    source = tmp_path / "src"
    source.mkdir()
    (source / "a.bin").write_bytes(b"a" * 1000)
    store = tmp_path / "store"
    pack(source, store, name="coco")
    bundles = store / "bundles"
    [live] = list(bundles.iterdir())
    old, young = bundles / ("1" * 32 + ".tar.zst"), bundles / ("2" * 32 + ".tar.zst")
    old.write_bytes(b"old orphan")
    young.write_bytes(b"young orphan")
    week_ago = time.time() - 7 * DAY
    os.utime(old, (week_ago, week_ago))
    apiserver.create(packed("coco", str(store)))
    apiserver.create(packed("other", str(tmp_path / "elsewhere")))
    clock = Clock()
    clock.now = time.time()
    ctl = controller(api_client, clock)
    ctl.reconcile_all()
    for job in apiserver.list("jobs"):
        finish(apiserver, job["metadata"]["name"])
    ctl.reconcile_all()
    [job] = [j for j in gc_jobs(apiserver) if j["metadata"]["annotations"]["dsagent.io/store"] == str(store)]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    main(list(args))  # as the container runs it; an error would exit non-zero
    assert sorted(p.name for p in bundles.iterdir() if p.is_file()) == sorted([live.name, young.name])
