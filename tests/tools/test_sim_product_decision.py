"""The simulator holds a version as the product decides it, never by a rule of its own.

How a version is held on a node (whole, or shares of a group) and how many nodes a group
has are :mod:`dsagent.policy.holding`'s, which the agent and the controller call too
(docs/design-striping.md#holding). These tests fail if the simulator decides it any other
way: a rule of its own, a copy of the constants, or a path around the call.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from dsagent.policy import holding as product
from scheduling.timemodel import JobProfile
from tools.sim import reads, stripereads
from tools.sim.engine import ClusterParams, Simulation
from tools.sim.workload import Dataset, Job

SIM = Path(__file__).resolve().parents[2] / "tools" / "sim"
A100 = (("dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt", 1.0),)
TB = 10**12


def test_the_simulator_calls_the_products_functions() -> None:
    assert reads.holding is product.holding
    assert stripereads.choose_placement is product.choose_placement  # which nodes, how many: the controller's
    assert stripereads.holding is product.holding and stripereads.worth_whole is product.worth_whole


def test_no_module_of_the_simulator_has_a_holding_rule_of_its_own() -> None:
    for path in SIM.glob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                assert node.name not in {"holding", "needs_group", "members_needed", "members_wanted"}, path
            if isinstance(node, ast.Constant) and node.value in (1.2, 0.5) and path.name in ("reads.py", "stripe.py"):
                pytest.fail(f"{path.name}:{node.lineno}: a copy of the headroom or the share budget")


def _run(monkeypatch: pytest.MonkeyPatch, decide: object) -> Simulation:
    monkeypatch.setattr(reads, "holding", decide)
    data = [Dataset(f"ds{i}", size, (0.0,)) for i, size in enumerate((TB // 4, TB // 2, 3 * TB))]
    jobs = [Job(i, 100.0 * i, 1, 8, f"ds{i % 3}", 2000.0, JobProfile(1.0, 1.0, 16_000, deadline=1e9)) for i in range(6)]
    params = replace(
        ClusterParams(nodes=6, node_types=A100, cache_bytes=TB, storage_bw=1e10, node_fetch_bw=1e9),
        epochs=2.0,
    )
    return Simulation("ours+stripe", jobs, data, params, seed=3).run()


def test_every_version_is_held_as_the_product_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[int, object, product.Holding]] = []

    def recording(size: int, **kw: object) -> product.Holding:
        answer = product.holding(size, **kw)  # type: ignore[arg-type]
        asked.append((size, kw.get("room_bytes"), answer))
        return answer

    sim = _run(monkeypatch, recording)
    names = {TB // 4: "ds0", TB // 2: "ds1", 3 * TB: "ds2"}
    assert {size for size, _, _ in asked} == set(names)  # asked for every version
    # by size alone only the 3 TB version is held as shares (1.2 x 3 TB > 1 TB)
    assert {size for size, room, answer in asked if room is None and answer is product.SHARE} == {3 * TB}
    # a version is read through a group only where the product answered "share" for it
    grouped = {name for name, _ in sim.stripes}
    shared = {names[size] for size, _, answer in asked if answer is product.SHARE}
    assert "ds2" in grouped and grouped <= shared and "ds0" not in grouped


def test_a_different_answer_changes_what_the_simulator_does(monkeypatch: pytest.MonkeyPatch) -> None:
    # the product answering "share" for everything: every version is read through a group
    sim = _run(monkeypatch, lambda size, **kw: product.SHARE)
    assert {name for name, _ in sim.stripes} == {"ds0", "ds1", "ds2"}


def test_a_job_node_on_a_share_is_made_whole_at_a_pass_only_as_the_product_rules_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every pod starts on a share (the start's answer forced to "share"); at the
    controller's passes the versions that fit are made whole on the job's nodes exactly when
    the product's ``worth_whole`` says so, with the bytes read through the window so far."""
    asked: list[tuple[int, int]] = []

    def recording(window: int, lacking: int) -> bool:
        asked.append((window, lacking))
        return product.worth_whole(window, lacking)

    monkeypatch.setattr(stripereads, "worth_whole", recording)
    ruled = _run(monkeypatch, lambda size, **kw: product.SHARE)
    assert asked and ruled.whole_replans == sum(1 for window, lacking in asked if window >= lacking) > 0
    assert any(window < lacking for window, lacking in asked)  # asked before it had paid: kept on the share
    monkeypatch.setattr(stripereads, "worth_whole", lambda window, lacking: False)
    never = _run(monkeypatch, lambda size, **kw: product.SHARE)
    assert never.whole_replans == 0
    monkeypatch.setattr(stripereads, "worth_whole", lambda window, lacking: True)
    eager = _run(monkeypatch, lambda size, **kw: product.SHARE)
    assert eager.whole_replans >= ruled.whole_replans
    # a node made whole reads its later epochs from its own disk, not through the window
    assert eager.read_local[1] > never.read_local[1] and eager.read_peer[1] < never.read_peer[1]


def _slot_to_hand_over(monkeypatch: pytest.MonkeyPatch, answer: product.Placement) -> tuple[Simulation, object]:
    """A 6-node simulation whose version ``ds0`` has a group of nodes 0-2, node 2 refusing its
    share; the product's placement answers ``answer``. Returns the simulation and the node
    that takes node 2's slot."""
    asked: list[dict[str, object]] = []

    def placing(nodes: object, **kw: object) -> product.Placement:
        asked.append(kw)
        return answer

    monkeypatch.setattr(stripereads, "choose_placement", placing)
    data = [Dataset("ds0", TB, (0.0,))]
    params = ClusterParams(nodes=6, node_types=A100, cache_bytes=TB, storage_bw=1e10, node_fetch_bw=1e9)
    sim = Simulation("ours+stripe", [], data, params, seed=3)
    group = stripereads.stripe.Group(("ds0", 0), (0, 1, 2), {0: TB / 3, 1: TB / 3, 2: TB / 3})
    rank = type("Worker", (), {"node": sim.nodes[0]})()
    out = type("Outcome", (), {"workers": [rank]})()
    taker = sim._taker(out, group, ("ds0", 0), 2, TB // 3, refused=True)  # type: ignore[arg-type]
    (kw,) = asked  # asked once, as the controller's next pass asks
    assert kw["before"] == ["0", "1"] and kw["job_nodes"] == ["0"]  # the refusing node is no member to keep
    return sim, taker


def test_a_refused_slot_goes_to_the_node_the_products_placement_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    sim, taker = _slot_to_hand_over(monkeypatch, product.Placement(["0", "1", "4"], [], []))
    assert taker is sim.nodes[4]


def test_where_the_placement_adds_no_node_the_simulator_hands_the_slot_over_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the product shrinks the group (the members left own the slot's bundles), which the
    # simulator's slots cannot express: a node that can make the room takes it, never the refuser
    sim, taker = _slot_to_hand_over(monkeypatch, product.Placement(["0", "1"], [], []))
    assert taker is not None and taker.index not in (0, 1, 2)


def test_a_job_on_nodes_already_in_the_group_is_placed_again_as_the_controller_places_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The controller places a striped version's group again at every pass, with the nodes
    of the pods reading it; a job that starts on nodes that are members already is no
    exception: the simulator asks the product's placement then too, and the nodes it adds
    join the group."""
    asked: list[dict[str, object]] = []

    def placing(nodes: object, **kw: object) -> product.Placement:
        asked.append(kw)
        return product.Placement(["0", "1", "2", "3", "4", "5"], [], [])

    monkeypatch.setattr(stripereads, "choose_placement", placing)
    data = [Dataset("ds0", 3 * TB, (0.0,))]
    params = ClusterParams(nodes=6, node_types=A100, cache_bytes=TB, storage_bw=1e10, node_fetch_bw=1e9)
    sim = Simulation("ours+stripe", [], data, params, seed=3)
    key = ("ds0", 0)
    group = stripereads.stripe.Group(key, (0, 1, 2, 3), {m: 3 * TB / 4 for m in range(4)})
    group.holding.update(group.members)  # every member holds its share
    rank = type("Worker", (), {"node": sim.nodes[0]})()
    out = type("Outcome", (), {"workers": [rank]})()
    sim._join(out, group, key, 3 * TB)  # type: ignore[arg-type]
    (kw,) = asked
    assert kw["job_nodes"] == ["0"] and kw["before"] == ["0", "1", "2", "3"]
    assert set(group.members) == {0, 1, 2, 3, 4, 5}
