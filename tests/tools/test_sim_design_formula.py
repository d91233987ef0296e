"""The simulator's design-as-written variant (``deadline-design``) ranks plans by the product's
(12): the very function the webhook and the plan loop rank by by default,
``scheduling.timemodel.FORMULAS[DEFAULT_FORMULA]``, reached through the product's
``decide``; tools/sim holds no formula of its own (docs/simulation.md, docs/design.md#deadline-formula)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling import timemodel
from scheduling.timemodel import DEFAULT_FORMULA, FORMULAS, Plan, parallel_efficiency
from tools.sim import policies
from tools.sim.engine import ClusterParams, Simulation
from tools.sim.workload import WorkloadParams, make_jobs

pytestmark = pytest.mark.slow


def test_the_design_variant_ranks_by_the_products_formula_and_no_other(monkeypatch: pytest.MonkeyPatch) -> None:
    design = policies.variant("deadline-design")
    assert design is not None and design.as_written and design.formula == DEFAULT_FORMULA
    assert FORMULAS[DEFAULT_FORMULA] is parallel_efficiency  # the product's default reading of (12)
    calls: list[float] = []

    def product(plan: Plan, t_single: float) -> float:
        value = parallel_efficiency(plan, t_single)
        calls.append(value)
        return value

    def other(plan: Plan, t_single: float) -> float:
        raise AssertionError("the design variant ranked plans by another formula than the product's")

    def slack(self: Plan) -> float:
        raise AssertionError("the design variant ranked plans by slack per GPU")

    for name in FORMULAS:
        monkeypatch.setitem(timemodel.FORMULAS, name, product if name == DEFAULT_FORMULA else other)
    monkeypatch.setattr(timemodel.Plan, "performance", property(slack))
    jobs, datasets = make_jobs(WorkloadParams(jobs=40, datasets=5), 6 * 8, seed=2)
    sim: Any = Simulation("deadline-design", jobs, datasets, ClusterParams(nodes=6), seed=2).run()
    assert calls, "the design variant never ranked a plan through the product's decide"
    assert all(o.end == o.end for o in sim.outcomes.values())  # every job ran to its end
