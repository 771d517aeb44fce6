"""The precision recipe: a toy model whose int8 version misses a target and whose ceiling meets
it; the chosen configuration meets the target with fewer raised ops than the ceiling, and the
same configuration on a fresh simulator reproduces the reported metric."""

from __future__ import annotations

import pytest
from test_sensitivity import FragileSin, _inputs

from quantlab.analysis.recipe import Direction, RecipeTarget, platform_directions, run_recipe
from quantlab.analysis.sensitivity import sensitivity
from quantlab.models.tasks import OutputSQNR, Top1Agreement
from quantlab.platforms import load_platform
from quantlab.simulate import Mode, Simulator


@pytest.fixture(scope="module")
def fragile():
    x = _inputs((64, 8))
    sim = Simulator(FragileSin(), "j6m")
    sim.calibrate([x], progress=False)
    ranking = sensitivity(sim, [x], kinds=["activation", "weight"], progress=False).table
    return sim, x, ranking


@pytest.mark.parametrize("directions", [[Direction.BACKOFF], [Direction.RAISE]])
def test_recipe_meets_the_target_with_fewer_raised_ops_than_the_ceiling(fragile, directions):
    sim, x, ranking = fragile
    task = Top1Agreement()
    res = run_recipe(sim, [x], ranking, RecipeTarget(target_metric=0.95), task, None, directions)
    start = res.steps[0]
    ceiling = next(s for s in res.steps if s.direction == "ceiling")
    assert not start.meets and start.task.value < 0.95
    assert ceiling.meets and ceiling.task.value >= 0.95
    chosen = res.chosen
    assert chosen is not None and chosen.meets and chosen.task.value >= 0.95
    assert 0 < len(chosen.raised) < len(ceiling.raised)
    assert chosen.cost < ceiling.cost
    assert chosen.cost == min(s.cost for s in res.steps if s.meets)
    assert {s.direction for s in res.steps} >= {"start", "ceiling", directions[0].value}
    table = res.table()
    assert table["chosen"].sum() == 1 and table.loc[table.chosen, "step"].item() == chosen.step
    assert (table.task_n == 64).all() and (table.task_ci_low <= table.task).all()
    # the chosen configuration, given to a fresh simulator, gives the reported metric
    fresh = Simulator(FragileSin(), "j6m", chosen.spec)
    fresh.calibrate([x], progress=False)
    ref = [fresh.run(*x, mode=Mode.FLOAT)]
    assert task(ref, [fresh.run(*x, mode=Mode.FIXED)]) == chosen.task.value


def test_recipe_says_when_even_the_ceiling_misses(fragile):
    sim, x, ranking = fragile
    res = run_recipe(sim, [x], ranking, RecipeTarget(min_sqnr_db=200.0), None)
    assert res.chosen is None and not any(s.meets for s in res.steps)
    assert res.best.sqnr_db == max(s.sqnr_db for s in res.steps)
    assert [s.direction for s in res.steps] == ["start", "ceiling"]  # no back-off below it


def test_targets_and_flows():
    with pytest.raises(ValueError, match="exactly one target"):
        RecipeTarget()
    with pytest.raises(ValueError, match="exactly one target"):
        RecipeTarget(max_drop=0.1, min_sqnr_db=20.0)
    with pytest.raises(ValueError, match="max_drop must be >= 0"):
        RecipeTarget(max_drop=-1.0)
    t = RecipeTarget(max_drop=0.05)
    assert t.threshold(Top1Agreement(), 1.0) == pytest.approx(0.95)
    assert platform_directions(load_platform("j6m")) == [Direction.BACKOFF]
    assert platform_directions(load_platform("j6p")) == [Direction.RAISE]
    x = _inputs((4, 8))
    sim = Simulator(FragileSin(), "j6m")
    sim.calibrate([x], progress=False)
    with pytest.raises(ValueError, match="has none; use exp.min_sqnr_db"):
        run_recipe(sim, [x], None, t, None)
    # a user's model without a task metric of its own is judged by output SQNR against float,
    # inf for the float model itself: no drop from it can be met, so it is refused by name
    with pytest.raises(ValueError, match="exp.max_drop: the task metric output_sqnr_db of the"):
        run_recipe(sim, [x], None, t, OutputSQNR())
