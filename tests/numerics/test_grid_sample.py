import itertools

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal

from quantlab.numerics.dtypes import DType
from quantlab.numerics.grid_sample import (
    NanRule,
    Padding,
    SampleMode,
    absolute_frac_bits,
    check_grid_limits,
    grid_positions_fixed,
    grid_sample_fixed,
    normalized_grid_scale,
    plan_split,
    quantize_grid,
    split_grid_sample,
    unnormalize,
)
from quantlab.numerics.reference import grid_sample_reference
from quantlab.numerics.rounding import Round
from quantlab.platforms import GridCoord, PlatformConfig


def _rand_input(gen, dtype, shape):
    return torch.randint(dtype.qmin, dtype.qmax + 1, shape, generator=gen).to(dtype.torch_dtype)


CASES = list(
    itertools.product(
        GridCoord, SampleMode, Padding, (False, True), (DType.INT8, DType.INT16), (0, 1, 2)
    )
)


@pytest.mark.parametrize("coord,mode,pad,align,xdt,seed", CASES)
def test_fixed_matches_reference_random(coord, mode, pad, align, xdt, seed):
    gen = torch.Generator().manual_seed(seed)
    h, w = 3 + seed, 9 - seed
    x = _rand_input(gen, xdt, (2, 2, h, w))
    grid = torch.rand(2, 3, 5, 2, generator=gen) * 2.6 - 1.3  # includes points outside
    for gdt in (DType.INT16, DType.INT8):
        q = quantize_grid(grid, h, w, align, coord, gdt)
        for rnd in (Round.HALF_UP, Round.HALF_EVEN, Round.FLOOR):
            got = grid_sample_fixed(x, 0.05, xdt, q, mode, pad, align, rnd, 8, rnd, rnd)
            ref = grid_sample_reference(x, xdt, q, mode, pad, rnd, 8, rnd, rnd)
            assert_bits_equal(got, ref)


@pytest.mark.parametrize("p", [0, 3, 8, 12])
def test_fixed_matches_reference_adversarial(p):
    """Pixel centres, half-pixel ties, the extreme grid codes and extreme input codes."""
    xdt = DType.INT16
    h, w = 4, 6
    x = torch.tensor([xdt.qmin, xdt.qmax, -1, 0, 1, xdt.qmax - 1] * 4, dtype=torch.int16)
    x = x.reshape(1, 1, h, w)
    px = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.5, 2.5, 4.999, 5.0, 5.5, 6.0])
    gx = (2 * px + 1) / w - 1
    gy = torch.linspace(-1.2, 1.2, len(px))
    grid = torch.stack([gx, gy], -1).reshape(1, 2, 5, 2)
    for coord, mode, pad in itertools.product(GridCoord, SampleMode, Padding):
        q = quantize_grid(grid, h, w, False, coord)
        codes = q.codes.clone()
        codes[0, 0, 0] = torch.tensor([-32768, 32767])
        codes[0, 1, 4] = torch.tensor([32767, -32768])
        q = type(q)(**{**q.__dict__, "codes": codes})
        got = grid_sample_fixed(x, 1.0, xdt, q, mode, pad, False, weight_frac_bits=p)
        ref = grid_sample_reference(x, xdt, q, mode, pad, weight_frac_bits=p)
        assert_bits_equal(got, ref)


def test_identity_grid_nearest_is_exact_copy():
    h, w = 5, 12
    gen = torch.Generator().manual_seed(3)
    x = _rand_input(gen, DType.INT8, (1, 3, h, w))
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    grid = torch.stack([(2 * xs + 1) / w - 1, (2 * ys + 1) / h - 1], -1)[None].float()
    for coord, mode in itertools.product(GridCoord, SampleMode):
        q = quantize_grid(grid, h, w, False, coord)
        out = grid_sample_fixed(x, 0.1, DType.INT8, q, mode)
        assert_bits_equal(out, x)


def test_grid_scales_and_frac_bits_follow_the_spec():
    assert normalized_grid_scale(1024, DType.INT16, False) == pytest.approx((2 / 1024 + 1) / 32767)
    assert normalized_grid_scale(1024, DType.INT16, True) == pytest.approx((2 / 1023 + 1) / 32767)
    assert normalized_grid_scale(64, DType.INT8, False) == pytest.approx((2 / 64 + 1) / 127)
    # D = 1024 needs 11 integer bits (F = 4); D = 1023 needs 10 (F = 5); cap 8, floor 0
    assert absolute_frac_bits(1024, DType.INT16) == 4
    assert absolute_frac_bits(1023, DType.INT16) == 5
    assert absolute_frac_bits(16, DType.INT16) == 8
    assert absolute_frac_bits(65536, DType.INT16) == 0


@pytest.mark.parametrize("w", [256, 1024, 16384, 65536])
def test_normalized_position_error_is_half_a_grid_step(w):
    gen = torch.Generator().manual_seed(w)
    grid = torch.rand(1, 64, 64, 2, generator=gen) * 2 - 1
    q = quantize_grid(grid, 8, w, False, GridCoord.NORMALIZED)
    px, _, p = grid_positions_fixed(q, weight_frac_bits=15)
    err = (px.double() / 2**p - unnormalize(grid[..., 0], w, False)).abs()
    step = (w + 2) / 65534
    # half a step, plus the float32 quotient's rounding (half an ulp at 2**15 = 2**-9 codes)
    assert float(err.max()) <= step * (0.5 + 2**-9) + 2**-16
    assert float(err.max()) >= 0.4 * step  # 4096 random points reach near the bound


def test_float_agreement_within_one_lsb_for_smooth_sampling():
    h, w = 16, 64
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    img = (100 * torch.sin(xs / 9.0) * torch.cos(ys / 5.0)).round().to(torch.int8)[None, None]
    gen = torch.Generator().manual_seed(1)
    grid = torch.rand(1, 20, 30, 2, generator=gen) * 2 - 1
    q = quantize_grid(grid, h, w, False, GridCoord.NORMALIZED)
    out = grid_sample_fixed(img, 1.0, DType.INT8, q, weight_frac_bits=12)
    ref = F.grid_sample(img.float(), grid, align_corners=False)
    assert float((out.float() - ref).abs().max()) <= 1.0


def test_check_grid_limits():
    j6m = PlatformConfig(name="j6m")
    limits = (j6m.grid_max_side, j6m.grid_max_area)
    check_grid_limits(720, 1024, *limits)
    with pytest.raises(ValueError, match="grid_max_side=1024"):
        check_grid_limits(1, 2048, *limits)
    with pytest.raises(ValueError, match="grid_max_area=737280"):
        check_grid_limits(1024, 1024, *limits)
    check_grid_limits(1, 737280, 0, 0)


def test_nan_grid_raises_or_follows_zero_code_rule():
    grid = torch.zeros(1, 2, 2, 2)
    grid[0, 0, 1, 0] = float("nan")
    with pytest.raises(ValueError, match="1 NaN"):
        quantize_grid(grid, 4, 4, False, GridCoord.NORMALIZED)
    q = quantize_grid(grid, 4, 4, False, GridCoord.NORMALIZED, on_nan=NanRule.ZERO_CODE)
    assert q.nan_count == 1 and int(q.codes[0, 0, 1, 0]) == 0
    with pytest.raises(ValueError, match="NaN"):
        split_grid_sample(torch.zeros(1, 1, 4, 8, dtype=torch.int8), 1.0, DType.INT8, grid, 2)


def test_split_count_must_divide_w():
    grid = torch.zeros(1, 2, 2, 2)
    with pytest.raises(ValueError, match=r"k=3 must be a positive integer dividing W=1000"):
        plan_split(grid, 1000, 3, 2, False)


def test_split_k1_equals_direct_call():
    gen = torch.Generator().manual_seed(5)
    x = _rand_input(gen, DType.INT8, (1, 2, 6, 40))
    grid = torch.rand(1, 7, 9, 2, generator=gen) * 2.2 - 1.1
    q = quantize_grid(grid, 6, 40, False, GridCoord.NORMALIZED)
    direct = grid_sample_fixed(x, 0.1, DType.INT8, q)
    assert_bits_equal(split_grid_sample(x, 0.1, DType.INT8, grid, 1), direct)


@pytest.mark.parametrize("align", [False, True])
def test_split_is_a_selection_of_part_outputs(align):
    """Every point's code equals the unsplit kernel run on its part's columns."""
    gen = torch.Generator().manual_seed(7)
    w, k = 48, 4
    x = _rand_input(gen, DType.INT8, (1, 1, 5, w))
    grid = torch.rand(1, 6, 8, 2, generator=gen) * 2.4 - 1.2
    out = split_grid_sample(x, 0.1, DType.INT8, grid, k, halo=3, align_corners=align)
    plan = plan_split(grid, w, k, 3, align)
    for p in range(k):
        xp = x[..., plan.lo[p] : plan.hi[p]]
        q = quantize_grid(plan.local_grids[p], 5, xp.shape[-1], align, GridCoord.NORMALIZED)
        ref = grid_sample_reference(xp, DType.INT8, q)
        sel = (plan.part == p).unsqueeze(1)
        assert torch.equal(out[sel], ref[sel])


def test_split_restores_accuracy_at_large_w():
    gen = torch.Generator().manual_seed(11)
    w = 16384
    xs = torch.arange(w, dtype=torch.float64)
    img = (120 * torch.sin(xs / 7.0)).round().to(torch.int8).reshape(1, 1, 1, w).repeat(1, 1, 2, 1)
    grid = torch.rand(1, 4, 2048, 2, generator=gen) * 2 - 1
    ref = F.grid_sample(img.float(), grid, align_corners=False)
    errs = {}
    for k in (1, 16):
        out = split_grid_sample(img, 1.0, DType.INT8, grid, k)
        errs[k] = float((out.float() - ref).abs().max())
    assert errs[16] <= 1.0 < errs[1]


def test_float_input_codes_are_rejected_not_truncated():
    q = quantize_grid(torch.zeros(1, 2, 2, 2), 3, 3, False, GridCoord.NORMALIZED)
    x = torch.full((1, 1, 3, 3), 1.7)
    with pytest.raises(TypeError, match="x_codes"):
        grid_sample_fixed(x, 0.1, DType.INT8, q)
