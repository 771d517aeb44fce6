"""The MSEObserver's exact search (quantlab.calibration.mse_search) against the independent
float64 numpy oracle: the same chosen candidate on random and adversarial batches, by both of
its exact methods, at int8 and int16, under three scale rules and two rounding modes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from calibration_oracle import sse

from quantlab.calibration import mse_search
from quantlab.numerics import DType, Round, ScaleRule, compute_scale

RULES = {"half_range": ScaleRule.HALF_RANGE, "qmax": ScaleRule.QMAX, "pot": ScaleRule.POT}
ROUNDS = {"half_even": Round.HALF_EVEN, "half_away": Round.HALF_AWAY}
FACTORS = 1.0 - 0.01 * torch.arange(95, dtype=torch.float64)


def _cases() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    gauss = torch.randn(3000, generator=g)
    gauss[:6] *= 9.0
    relu = (torch.randn(3000, generator=g) * torch.rand(3000, generator=g)).clamp_min(0.0)
    relu[:3] = torch.tensor([7.0, 5.5, 4.0])
    s = float(compute_scale(4.0, DType.INT8))  # candidate 0's int8 scale for the grid case
    grid = torch.randint(-128, 128, (3000,), generator=g).float() * s  # on candidate 0's grid
    grid[0] = 4.0
    ties = (torch.randint(-60, 60, (3000,), generator=g).float() + 0.5) * s  # every value a tie
    ties[0] = -4.0
    return {
        "gauss_outliers": gauss,
        "relu": relu,
        "on_grid": grid,
        "half_ties": ties,
        "constant": torch.full((500,), 0.37),
        "few": torch.tensor([1e-30, -2.5, 0.7, 3.0]),
    }


def _oracle(x: np.ndarray, amaxes, rule: str, mode: str, dtype: DType) -> tuple[int, np.ndarray]:
    errs = np.array([sse(x, a, rule, qmin=dtype.qmin, qmax=dtype.qmax, mode=mode) for a in amaxes])
    return int(np.flatnonzero(errs == errs.min()).max()), errs


def _acceptable(errs: np.ndarray) -> set[int]:
    """The oracle's best, and any candidate within its float64 rounding of the best."""
    return {int(i) for i in np.flatnonzero(errs <= errs.min() * (1 + 1e-12))}


@pytest.mark.parametrize(
    ("rule", "mode"), [("half_range", "half_even"), ("qmax", "half_away"), ("pot", "half_even")]
)
@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_both_exact_methods_choose_the_oracles_candidate(rule, mode, dtype):
    for name, x in _cases().items():
        xn = x.double().numpy()
        amaxes = float(np.abs(xn).max()) * FACTORS
        want, errs = _oracle(xn, amaxes.numpy(), rule, mode, dtype)
        ok = _acceptable(errs)
        assert want in ok
        x64 = x[x != 0].double()
        scales = compute_scale(amaxes, dtype, RULES[rule]).double()
        if dtype is DType.INT8 or name == "gauss_outliers":  # int16: 6.2M edges, sorted once
            bucket, bound = mse_search.bucket_errors(x64, scales, dtype, ROUNDS[mode])
            oracle = torch.from_numpy(errs)  # within the stated bound (and the oracle's rounding)
            assert bool(((bucket - oracle).abs() <= bound + 1e-12 * oracle).all()), name
        pruned = mse_search.pruned_errors(x64, scales, dtype, ROUNDS[mode])
        got_pruned = int(torch.nonzero(pruned == pruned.min()).max())
        got, _ = mse_search.best_candidate(x, amaxes, dtype, RULES[rule], ROUNDS[mode])
        assert got in ok and got_pruned in ok, (name, got, got_pruned, want)
        if len(ok) == 1 or errs.min() == 0.0:  # separated, or exact zero-error ties
            assert got == got_pruned == want, name


def test_the_interval_method_runs_on_a_large_batch_and_agrees_with_the_oracle():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(100_000, generator=g) * torch.rand(100_000, generator=g)
    x[:4] *= 12.0
    amaxes = float(x.abs().max()) * FACTORS
    assert mse_search.BUCKET_RATIO * 95 * 255 <= x.numel()  # best_candidate takes intervals
    got, errs = mse_search.best_candidate(
        x, amaxes, DType.INT8, ScaleRule.HALF_RANGE, Round.HALF_EVEN
    )
    want, oracle = _oracle(
        x.double().numpy(), amaxes.numpy(), "half_range", "half_even", DType.INT8
    )
    assert got == want and 0 < got < 94  # an interior optimum: it clipped, but not all the way
    assert np.allclose(errs.numpy(), oracle, rtol=1e-9)


def test_all_zero_and_single_value_batches():
    z = torch.zeros(100)
    best, errs = mse_search.best_candidate(
        z, FACTORS, DType.INT8, ScaleRule.HALF_RANGE, Round.HALF_EVEN
    )
    assert best == 94 and float(errs.abs().max()) == 0.0
    one = torch.tensor([0.0, 2.0])
    best, _ = mse_search.best_candidate(
        one, 2.0 * FACTORS, DType.INT8, ScaleRule.QMAX, Round.HALF_EVEN
    )
    want, _ = _oracle(
        np.array([0.0, 2.0]), (2.0 * FACTORS).numpy(), "qmax", "half_even", DType.INT8
    )
    assert best == want


def _adversarial_values() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    gauss = torch.randn(50_000, generator=g)
    dup = torch.randint(-5, 6, (20_000,), generator=g).float() * 0.25  # many equal values
    tiny = torch.tensor([1e-45, -1e-45, 1e-38, -3.4e38, 3.4e38, 0.0, -0.0, 2.0, -2.0])
    strided = torch.randn(64, 64, generator=g).t()  # not contiguous
    return [gauss, dup, tiny, strided, gauss.half(), gauss.bfloat16(), gauss.double()]


def test_numpy_selection_and_sort_give_torchs_values_bit_for_bit():
    for x in _adversarial_values():
        flat = x.reshape(-1)
        want = flat[flat != 0].to(torch.float64)
        got = mse_search.nonzero_float64(x)
        assert got.dtype == torch.float64 and torch.equal(got, want), x.dtype
        assert not bool((got == 0).any())
        assert torch.equal(mse_search.sorted_values(got), torch.sort(want).values), x.dtype
    x = torch.randn(100, requires_grad=True)  # a tensor that records gradients is read detached
    assert torch.equal(mse_search.nonzero_float64(x), x.detach().double())


def test_the_interval_moments_hold_within_their_bound_on_values_at_cell_edges():
    """Values exactly on candidates' cell edges (ties), below the first edge and beyond the
    last, in a batch large enough for the interval method: every candidate's error from the
    intervals is within its stated bound of the direct evaluation."""
    g = torch.Generator().manual_seed(8)
    amax = 4.0
    amaxes = amax * FACTORS
    scales = compute_scale(amaxes, DType.INT8, ScaleRule.HALF_RANGE).double()
    k = torch.randint(0, scales.numel(), (200_000,), generator=g)
    cells = torch.randint(-127, 127, (200_000,), generator=g).double() + 0.5
    edge = cells * scales[k]
    on_edges = edge[edge.float().double() == edge].float()  # float32 values on an edge, exactly
    assert on_edges.numel() > 3_000
    spread = torch.randn(60_000, generator=g) * 1.5
    x = torch.cat([on_edges, spread, torch.tensor([amax, -amax, 1e-30])])
    x64 = mse_search.nonzero_float64(x)
    errs, bound = mse_search.bucket_errors(x64, scales, DType.INT8, Round.HALF_EVEN)
    direct = mse_search.direct_errors(
        x64, scales, list(range(scales.numel())), DType.INT8, Round.HALF_EVEN
    )
    assert bool(((errs - direct).abs() <= bound + 1e-12 * direct).all())
    best, _ = mse_search.best_candidate(
        x, amaxes, DType.INT8, ScaleRule.HALF_RANGE, Round.HALF_EVEN
    )
    assert best == int(torch.nonzero(direct == direct.min()).max())


def test_a_batch_searched_at_int8_and_int16_selects_and_sorts_its_values_once(monkeypatch):
    """The observer keeps one ``BatchValues`` per batch for its MSE searches at both dtypes
    (the interval method at int8, the pruned one at int16, each on a sorted copy): the same
    choices as two searches of their own, with one selection and one sort between them."""
    from quantlab.calibration import vendor

    g = torch.Generator().manual_seed(12)
    x = torch.cat([torch.randn(120_000, generator=g), torch.zeros(500), torch.tensor([9.0])])
    assert mse_search.BUCKET_RATIO * 95 * 255 <= x.numel()  # int8 takes the intervals
    rule, rounding = ScaleRule.HALF_RANGE, Round.HALF_EVEN
    alone = [vendor.mse_batch(x, dt, rule, rounding) for dt in (DType.INT8, DType.INT16)]
    calls = {"select": 0, "sort": 0}

    def counted(name, f):
        def wrapper(*args):
            calls[name] += 1
            return f(*args)

        return wrapper

    # selection: numpy's (float32 on the CPU); sorting: the radix sort, or torch's / numpy's
    monkeypatch.setattr(mse_search, "_nonzero_numpy", counted("select", mse_search._nonzero_numpy))
    for sort in ("sorted_values", "sort_float64"):
        monkeypatch.setattr(mse_search, sort, counted("sort", getattr(mse_search, sort)))
    values = mse_search.BatchValues(x)
    shared = [vendor.mse_batch(x, dt, rule, rounding, values) for dt in (DType.INT8, DType.INT16)]
    assert shared == alone and calls == {"select": 1, "sort": 1}
