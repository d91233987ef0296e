"""A striped bundle's fetch that yields the store to a peer waits for that peer
(:meth:`dsagent.cache.striped.stripefetch.BundleSources.fetch`, docs/design-striping.md).

Of two agents asking each other for one bundle at once, the one told to yield must not
read the store as well: its ``before_store`` says False, and it asks the peers again,
waiting while they answer "later", before the store. A whole copy asks the bundle's owner
once more before it claims the store read: an owner whose fill began meanwhile has it
claimed, and is waited for."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dsagent.cache.peers import PeerFetchingIt, PeerRefused
from dsagent.cache.settings import Settings
from dsagent.cache.striped.stripefetch import BundleSources


class _Peers:
    """Peer ``n2`` answers each ask in turn from ``answers``: "no", "later" or "yes"."""

    def __init__(self, answers: list[str]) -> None:
        self.answers, self.asked = answers, 0

    def fetch_from(
        self, url: str, manifest: Any, ref: Any, directory: Path, *, reader: bool = False, stop: Any = None
    ) -> None:
        self.asked += 1
        answer = self.answers.pop(0)
        if answer == "no":
            raise PeerRefused("not here")
        if answer == "later":
            raise PeerFetchingIt("downloading it now")


def _fetch(
    tmp_path: Path, peers: _Peers, monkeypatch: pytest.MonkeyPatch, yielded: bool, again: tuple[str, ...] = ()
) -> dict[str, int]:
    settings = Settings(root=tmp_path / "c", peer_token="t" * 32, peer_wait=5, node_name="n1")
    counts = {"peer_bundles": 0, "store_bundles": 0}
    sources = BundleSources(settings, peers, counts)  # type: ignore[arg-type]
    stored: list[str] = []
    monkeypatch.setattr("dsagent.cache.striped.stripefetch.unpack_bundle", lambda *a, **kw: stored.append("store"))
    monkeypatch.setattr("dsagent.cache.striped.stripefetch.POLL_EVERY", 0.01)
    version = SimpleNamespace(manifest=None, store="s3://b/p", storage_options={}, peers={"n2": "http://n2"})
    ref = SimpleNamespace(digest="a" * 32)
    assert sources.fetch(version, ref, tmp_path, ["n2"], before_store=lambda: not yielded, again=again)  # type: ignore[arg-type]
    return counts


def test_a_fetch_told_to_yield_waits_for_the_peer_that_reads_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    peers = _Peers(["no", "later", "later", "yes"])  # the peer starts its store read after our first ask
    assert _fetch(tmp_path, peers, monkeypatch, yielded=True) == {"peer_bundles": 1, "store_bundles": 0}
    assert peers.asked == 4


def test_a_fetch_not_told_to_yield_reads_the_store_after_the_peers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    peers = _Peers(["no"])
    assert _fetch(tmp_path, peers, monkeypatch, yielded=False) == {"peer_bundles": 0, "store_bundles": 1}
    assert peers.asked == 1


def test_a_whole_copy_asks_the_owner_again_before_the_store_and_waits_for_its_fill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the owner had no share yet at the first ask; its fill began while the others were asked
    peers = _Peers(["no", "later", "yes"])
    assert _fetch(tmp_path, peers, monkeypatch, yielded=False, again=("n2",)) == {"peer_bundles": 1, "store_bundles": 0}
    assert peers.asked == 3
    # an owner that still has not begun: the store, after one more ask
    peers = _Peers(["no", "no"])
    assert _fetch(tmp_path, peers, monkeypatch, yielded=False, again=("n2",)) == {"peer_bundles": 0, "store_bundles": 1}
