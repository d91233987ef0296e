"""Striped versions' pure core: HRW ownership, canonical buckets, rank assignment, the layout file."""

from __future__ import annotations

import io
from collections import Counter

import pytest
import xxhash

from dsagent.policy.eviction import EVICT_RATIO
from dsplatform.stripe import (
    LayoutError,
    StripeLayout,
    assign,
    bucket_of,
    epoch_order,
    group_size,
    owned,
    owner,
    owners,
)


def _digest(text: str) -> str:
    return xxhash.xxh3_128_hexdigest(text.encode())


def _layout(bundles: int = 40, files_per_bundle: int = 7, members: int = 4, **kw: object) -> StripeLayout:
    paths, sizes, index = [], [], []
    for b in range(bundles):
        first = len(paths)
        for f in range(files_per_bundle):
            paths.append(f"b{b:04d}/f{f:03d}.jpg")
            sizes.append(100 + f)
        index.append((_digest(f"bundle{b}"), first, files_per_bundle, sum(sizes[first:])))
    nodes = [f"node-{i}" for i in range(members)]
    return StripeLayout.create("imagenet", _digest("version"), nodes, index, paths, sizes, **kw)  # type: ignore[arg-type]


def test_owner_is_the_same_whatever_the_member_order() -> None:
    members = ["a", "b", "c", "d", "e"]
    for i in range(200):
        key = _digest(str(i))
        assert owner(key, members) == owner(key, list(reversed(members)))


def test_ownership_spreads_evenly_and_a_leaving_member_moves_only_its_share() -> None:
    members = [f"n{i}" for i in range(8)]
    keys = [_digest(str(i)) for i in range(4000)]
    before = {k: owner(k, members) for k in keys}
    counts = Counter(before.values())
    assert min(counts.values()) > 0.8 * 4000 / 8 and max(counts.values()) < 1.2 * 4000 / 8
    after = {k: owner(k, members[:-1]) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == "n7" for k in moved)  # only the leaver's bundles move
    joined = {k: owner(k, [*members, "n8"]) for k in keys}
    assert all(joined[k] in (before[k], "n8") for k in keys)  # a joiner takes, nobody else moves
    assert 0.05 < sum(joined[k] == "n8" for k in keys) / 4000 < 0.18


def test_weights_give_proportional_shares_and_zero_weight_owns_nothing() -> None:
    keys = [_digest(str(i)) for i in range(6000)]
    counts = Counter(owner(k, ["big", "small", "gone"], {"big": 3.0, "small": 1.0, "gone": 0.0}) for k in keys)
    assert counts["gone"] == 0
    assert 2.5 < counts["big"] / counts["small"] < 3.5
    assert owner(keys[0], ["x"], {"x": 0.0}) is None


def test_replicas_are_distinct_and_led_by_the_owner() -> None:
    members = ["a", "b", "c", "d"]
    for i in range(50):
        key = _digest(str(i))
        two = owners(key, members, replicas=2)
        assert len(set(two)) == 2 and two[0] == owner(key, members)


def test_owned_partitions_the_bundles() -> None:
    layout = _layout()
    shares = [set(owned([b.digest for b in layout.bundles], m, layout.members)) for m in layout.members]
    assert sum(len(s) for s in shares) == len(layout.bundles)
    assert set().union(*shares) == {b.digest for b in layout.bundles}
    assert all(
        layout.held_by(m) == [b for b in layout.bundles if b.digest in s] for m, s in zip(layout.members, shares)
    )


def test_group_size_keeps_each_member_under_its_budget() -> None:
    assert group_size(30 * 10**12, 4 * 10**12, headroom=EVICT_RATIO) == 18  # 30 TB on 4 TB nodes at half a disk each
    assert group_size(1, 4 * 10**12, headroom=EVICT_RATIO) == 1
    with pytest.raises(LayoutError):
        group_size(10, 0, headroom=EVICT_RATIO)


def test_layout_round_trips_and_checks_its_version() -> None:
    layout = _layout(bundles=5)
    again = StripeLayout.load(io.BytesIO(layout.dumps()))
    assert again == layout
    text = layout.dumps()
    with pytest.raises(LayoutError, match="version 2 is not supported"):
        StripeLayout.loads(text.replace(b'"version":1', b'"version":2', 1))
    with pytest.raises(LayoutError, match="not a stripe layout"):
        StripeLayout.loads(b'{"format":"other"}\n')


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t.replace(b"b0000/f000.jpg", b"../etc/passwd", 1), "unsafe path"),
        (lambda t: t + b'["extra",1]\n', "data after"),
        (lambda t: t[: t.rindex(b"[")], "malformed"),
        (lambda t: t.replace(b'"node-0"', b'"node-1"', 1), "distinct members"),
        (lambda t: t.replace(b'"files":35', b'"files":99999999999', 1), "over the limit"),
        (lambda t: t.replace(b'"name":"imagenet"', b'"name":"../x"', 1), "invalid dataset"),
    ],
)
def test_a_hostile_layout_is_refused_with_one_line(mutate, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(LayoutError, match=message):
        StripeLayout.loads(mutate(_layout(bundles=5).dumps()))


def test_bundles_must_tile_the_files() -> None:
    layout = _layout(bundles=3)
    bad = [(b.digest, b.first + 1, b.count, b.size) for b in layout.bundles]
    with pytest.raises(LayoutError, match="tile"):
        StripeLayout.create("imagenet", layout.digest, layout.members, bad, layout.paths, layout.sizes)


def test_a_bucket_holds_bundles_of_its_home_member_only() -> None:
    layout = _layout(bundles=64)
    k = len(layout.members)
    for bundle in layout.bundles:
        assert layout.members[bucket_of(layout, bundle) % k] == bundle.owner


@pytest.mark.parametrize("world", [1, 3, 4, 8, 13])
def test_every_sample_goes_to_exactly_one_rank_with_even_counts(world: int) -> None:
    layout = _layout(bundles=37, files_per_bundle=11)
    nodes = [layout.members[r % 4] for r in range(world)]
    result = assign(layout, world, nodes)
    seen = Counter(f for r in range(world) for _, files in result.ranks[r] for f in files)
    assert sorted(seen) == list(range(len(layout.paths))) and set(seen.values()) == {1}
    counts = [result.samples(r) for r in range(world)]
    assert max(counts) - min(counts) <= 1


def test_ranks_read_mostly_their_own_nodes_bundles() -> None:
    layout = _layout(bundles=200, files_per_bundle=10)
    nodes = list(layout.members)
    result = assign(layout, 4, nodes)
    local = sum(len(f) for r in range(4) for bi, f in result.ranks[r] if layout.bundles[bi].owner == nodes[r])
    assert local / len(layout.paths) > 0.8


def test_a_changed_world_size_moves_whole_buckets_not_their_order() -> None:
    layout = _layout(bundles=64, files_per_bundle=5)
    four = assign(layout, 4, list(layout.members))
    eight = assign(layout, 8, [m for m in layout.members for _ in range(2)])

    # the order of one bundle's files in an epoch is the same whoever reads it
    def orders(a, world):  # type: ignore[no-untyped-def]
        out = {}
        for r in range(world):
            for bi, files in epoch_order(layout, a, r, seed=7, epoch=3):
                if len(files) == layout.bundles[bi].count:
                    out[bi] = files
        return out

    o4, o8 = orders(four, 4), orders(eight, 8)
    common = set(o4) & set(o8)
    assert len(common) > 40 and all(o4[b] == o8[b] for b in common)


def test_epochs_shuffle_differently_and_reproducibly() -> None:
    layout = _layout(bundles=20)
    result = assign(layout, 2, list(layout.members[:2]))
    e0 = epoch_order(layout, result, 0, seed=1, epoch=0)
    assert e0 == epoch_order(layout, result, 0, seed=1, epoch=0)
    assert e0 != epoch_order(layout, result, 0, seed=1, epoch=1)
    assert sorted(f for _, fs in e0 for f in fs) == sorted(f for _, fs in result.ranks[0] for f in fs)


def test_ranks_without_a_node_still_get_everything_once() -> None:
    layout = _layout(bundles=9)
    result = assign(layout, 4, None)
    assert sum(result.samples(r) for r in range(4)) == len(layout.paths)
    with pytest.raises(LayoutError):
        assign(layout, 0)
    with pytest.raises(LayoutError):
        assign(layout, 2, ["a"])
