"""The cache layout, the catalog, and start-up reconciliation (in process, real SQLite and disk)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dsagent.cache.catalog import Catalog
from dsagent.cache.layout import Store, validate_name
from dsagent.cache.service import CacheService, DatasetRequest, redact_url
from dsagent.cache.settings import Settings
from dsagent.errors import InvalidInput

DIGEST = "ab" * 16


@pytest.mark.parametrize(
    "name", ["..", ".", "a/b", "/etc", "a\\b", "", "x" * 129, "-lead", "a b", "na\u00efve", "a\x00"]
)
def test_names_that_could_escape_or_confuse_the_layout_are_refused(name: str) -> None:
    with pytest.raises(InvalidInput):
        validate_name(name)


@pytest.mark.parametrize("name", ["imagenet", "coco-2017", "ImageNet_21k.v2", "a", "9"])
def test_ordinary_names_are_accepted(name: str) -> None:
    assert validate_name(name) == name


def test_publishing_is_one_rename_and_removal_leaves_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    staging = store.staging_dir("ds", DIGEST)
    (staging / "a").mkdir(parents=True)
    (staging / "a" / "f").write_bytes(b"x")
    ready = store.publish("ds", DIGEST)
    assert (ready / "a" / "f").read_bytes() == b"x" and not staging.exists()
    store.remove("ds", DIGEST)
    assert not ready.exists() and not any((tmp_path / "trash").iterdir())


def test_the_catalog_keeps_tasks_bindings_and_leases(tmp_path: Path) -> None:
    catalog = Catalog(tmp_path / "c.db")
    catalog.begin_version("ds", DIGEST, size_bytes=10, files=1, source="s3://b/ds", bundles=None, now=1.0)
    catalog.create_task("t", [{"name": "ds", "source": "s3://b/ds", "bundles": None}], now=1.0, lease_until=100.0)
    catalog.bind("t", "ds", DIGEST)
    assert catalog.in_use(50.0) == {("ds", DIGEST)}
    assert catalog.in_use(100.0) == set()  # the lease lapsed
    assert catalog.expired_tasks(100.0) == ["t"]
    catalog.renew_task("t", 200.0)
    assert catalog.in_use(150.0) == {("ds", DIGEST)}
    # other than some tasks: what the others hold (the start rule's running data)
    assert catalog.in_use(150.0, except_tasks=("t",)) == set()
    catalog.create_task("u", [{"name": "ds", "source": "s3://b/ds", "bundles": None}], now=1.0, lease_until=300.0)
    catalog.bind("u", "ds", DIGEST)
    assert catalog.in_use(150.0, except_tasks=("t",)) == {("ds", DIGEST)}
    assert catalog.in_use(150.0, except_tasks=("t", "u")) == set()
    catalog.delete_task("u")
    catalog.close()
    reopened = Catalog(tmp_path / "c.db")
    assert reopened.task("t") is not None and reopened.task("t").digests == {"ds": DIGEST}  # type: ignore[union-attr]
    assert reopened.delete_task("t") and reopened.in_use(0) == set()
    reopened.close()


def test_start_up_reconciles_the_catalog_with_the_disk(tmp_path: Path) -> None:
    settings = Settings(root=tmp_path / "root", sweep_interval=3600)
    store = Store(settings.root)
    catalog = Catalog(store.catalog_path)
    gone, kept, orphan, staged = "11" * 16, "22" * 16, "33" * 16, "44" * 16
    for digest in (gone, kept):
        catalog.begin_version("ds", digest, size_bytes=1, files=1, source="s", bundles=None, now=1.0)
        catalog.mark_ready("ds", digest, now=2.0)
    catalog.close()
    store.ready_dir("ds", kept).mkdir(parents=True)
    store.ready_dir("ds", orphan).mkdir(parents=True)  # on disk, unknown to the catalog
    store.staging_dir("other", staged).mkdir(parents=True)  # a fetch nobody recorded
    store.pending_dir("ds", "0123456789abcdef").mkdir(parents=True)  # a copy killed before its digest was known
    (tmp_path / "root" / "datasets" / "ds" / "not-a-digest").mkdir()

    async def run() -> list[str]:
        service = CacheService(settings)
        await service.start()
        try:
            return [v["digest"] for v in await service.datasets()]
        finally:
            await service.stop()

    assert asyncio.run(run()) == [kept]
    assert sorted(p.name for p in (settings.root / "datasets" / "ds").iterdir()) == [kept]
    assert not any((settings.root / "staging").iterdir())


def test_submitting_validates_before_anything_is_recorded(tmp_path: Path) -> None:
    async def run() -> None:
        service = CacheService(Settings(root=tmp_path, sweep_interval=3600))
        await service.start()
        try:
            with pytest.raises(InvalidInput):
                await service.submit_task("t", [DatasetRequest("ok", "/etc")])
            with pytest.raises(InvalidInput):
                await service.submit_task("t", [])
            assert await service.datasets() == []
            assert await service._db(service.catalog.tasks) == []
        finally:
            await service.stop()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("s3://bucket/x", "s3://bucket/x"),
        ("https://u:pw@host:8443/d", "https://u:***@host:8443/d"),
        ("/data/x", "/data/x"),
        (None, None),
    ],
)
def test_passwords_in_urls_are_redacted(url: str | None, shown: str | None) -> None:
    assert redact_url(url) == shown
