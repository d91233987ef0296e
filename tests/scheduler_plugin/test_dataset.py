"""Dataset affinity: docs/design.md#dataset-affinity, case by case."""

from __future__ import annotations

import pytest

from scheduler_plugin.plugins.dataset import affinity, normalize, requested_sizes
from scheduling.nodeinfo import Holding, Inventory
from scheduling.podspec import DatasetWant

A, B = "a" * 32, "b" * 32
GIB = 1 << 30


def inv(**held: Holding) -> Inventory:
    return Inventory(capacity_bytes=100 * GIB, free_bytes=50 * GIB, datasets=held)


def ready(digest: str = A, *, in_use: bool = False, size: int = GIB) -> Holding:
    return Holding(digest=digest, size_bytes=size, ready=True, in_use=in_use)


def state(name: str, digest: str = A, *, in_use: bool = False) -> Holding:
    return Holding(digest=digest, size_bytes=GIB, ready=name == "ready", in_use=in_use)


IMAGENET = DatasetWant("imagenet", A)
COCO = DatasetWant("coco", A)
UNPINNED = DatasetWant("imagenet")


@pytest.mark.parametrize(
    ("wants", "inventory", "expected"),
    [
        pytest.param([IMAGENET], inv(imagenet=ready()), 1.0, id="holds-the-one-dataset-ready-and-current"),
        pytest.param([IMAGENET, COCO], inv(imagenet=ready(), coco=ready()), 2.0, id="holds-all-scores-the-count"),
        pytest.param([IMAGENET, COCO], inv(imagenet=ready()), 0.0, id="holds-only-some-scores-zero"),
        pytest.param([IMAGENET, COCO], inv(), 0.0, id="holds-none-scores-zero"),
        pytest.param([IMAGENET], inv(imagenet=ready(B)), 0.0, id="holds-another-version-is-not-current"),
        pytest.param([IMAGENET], inv(imagenet=ready(B, in_use=True)), 0.0, id="would-update-a-dataset-in-use"),
        pytest.param(
            [IMAGENET, COCO],
            inv(imagenet=ready(), coco=ready(B, in_use=True)),
            0.0,
            id="update-of-one-in-use-dataset-zeroes-the-node",
        ),
        pytest.param([IMAGENET], inv(imagenet=ready(in_use=True)), 1.0, id="current-and-in-use-is-fine"),
        pytest.param([IMAGENET], inv(imagenet=state("fetching")), 0.0, id="fetching-is-not-ready"),
        pytest.param([IMAGENET], inv(imagenet=state("failed")), 0.0, id="failed-is-not-ready"),
        pytest.param([UNPINNED], inv(imagenet=ready(B)), 1.0, id="unpinned-pod-accepts-the-ready-copy"),
        pytest.param([UNPINNED], inv(imagenet=state("fetching")), 0.0, id="unpinned-pod-still-needs-ready"),
        pytest.param([IMAGENET], None, 0.0, id="unparseable-or-missing-inventory-scores-zero"),
        pytest.param([], inv(imagenet=ready()), 0.0, id="pod-without-datasets-scores-zero"),
    ],
)
def test_raw_score_follows_the_paper(wants: list[DatasetWant], inventory: Inventory | None, expected: float) -> None:
    assert affinity(wants, inventory) == expected


@pytest.mark.parametrize(
    ("raws", "expected"),
    [
        ([2.0, 0.0, 2.0], [10, 0, 10]),
        ([0.0, 0.0], [0, 0]),
        ([], []),
        ([3.0, 1.5, 1.0], [10, 5, 3]),
        ([0.0, 1.0, 0.0, 0.5], [0, 10, 0, 5]),
        ([-1.0, 2.0], [0, 10]),
        ([-1.0, 0.0], [0, 0]),
    ],
)
def test_scores_are_normalized_to_ten_over_the_candidates(raws: list[float], expected: list[int]) -> None:
    assert normalize(raws) == expected


def test_partial_mode_credits_the_cached_fraction_of_requested_bytes() -> None:
    big, small = DatasetWant("big", A), DatasetWant("small", A)
    sizes = {"big": 3 * GIB, "small": GIB}
    assert affinity([big, small], inv(big=ready(size=3 * GIB)), sizes=sizes) == pytest.approx(2 * 0.75)
    assert affinity([big, small], inv(small=ready()), sizes=sizes) == pytest.approx(2 * 0.25)
    assert affinity([big, small], inv(big=ready(size=3 * GIB), small=ready()), sizes=sizes) == 2.0


def test_partial_mode_is_off_unless_sizes_are_given() -> None:
    assert affinity([IMAGENET, COCO], inv(imagenet=ready())) == 0.0


def test_partial_mode_still_zeroes_a_node_where_an_in_use_dataset_would_change() -> None:
    sizes = {"imagenet": GIB, "coco": GIB}
    assert affinity([IMAGENET, COCO], inv(imagenet=ready(), coco=ready(B, in_use=True)), sizes=sizes) == 0.0


def test_requested_sizes_come_from_inventories_holding_that_version() -> None:
    wants = [IMAGENET, COCO]
    inventories = [inv(imagenet=ready(size=5)), inv(imagenet=ready(B, size=999)), None, inv(imagenet=ready(size=7))]
    assert requested_sizes(wants, inventories) == {"imagenet": 7}
