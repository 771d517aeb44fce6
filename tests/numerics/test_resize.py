"""Fixed-point bilinear resize (numerics.resize): source positions follow torch's mapping
(size ratio, scale factor, align_corners, clamped at 0) to within half a unit of their last
bit, and the codes equal a slow per-pixel reference in exact rationals on random and extreme
inputs, up- and downsampling, int8 and int16, 0 to 15 fractional bits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal

from quantlab.numerics.dtypes import DType
from quantlab.numerics.reference import resize_bilinear_reference
from quantlab.numerics.resize import resize_bilinear_fixed, source_positions

CASES = [  # (h, w, ho, wo, align_corners, scale factors or None)
    (5, 7, 10, 14, False, None),
    (5, 7, 10, 14, True, None),
    (8, 8, 3, 5, False, None),
    (8, 8, 3, 5, True, None),
    (6, 6, 12, 12, False, (2.0, 2.0)),
    (7, 5, 10, 7, False, (1.5, 1.5)),
    (9, 4, 4, 2, False, (0.5, 0.5)),
    (3, 3, 1, 1, True, None),
    (1, 6, 4, 11, False, None),
    (4, 4, 13, 7, False, (3.3, 1.9)),
]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("p", [0, 8, 15])
def test_codes_equal_the_slow_reference(case, p):
    h, w, ho, wo, align, scales = case
    g = torch.Generator().manual_seed(ho * 31 + wo + p)
    for dtype in (DType.INT8, DType.INT16):
        codes = torch.randint(dtype.qmin, dtype.qmax + 1, (2, 2, h, w), generator=g)
        codes[0, 0] = dtype.qmax  # extremes: a plane at each end of the range
        codes[1, 1] = dtype.qmin
        codes = codes.to(dtype.torch_dtype)
        sc = scales or (None, None)
        got = resize_bilinear_fixed(codes, dtype, (ho, wo), align, sc, weight_frac_bits=p)
        assert got.dtype == dtype.torch_dtype
        want = resize_bilinear_reference(codes, dtype, (ho, wo), align, sc, weight_frac_bits=p)
        assert_bits_equal(got.to(torch.int64), torch.from_numpy(want))


@pytest.mark.parametrize("case", CASES, ids=str)
def test_positions_follow_torchs_mapping(case):
    """Bilinear resize of a ramp gives torch's source positions (inside the input; beyond the
    last pixel it repeats it): ours are within 2**-9 of them at 8 fractional bits."""
    h, w, ho, wo, align, scales = case
    for axis, (out, size) in enumerate(((ho, h), (wo, w))):
        ramp = torch.arange(size, dtype=torch.float64)
        shape = (1, 1, size, 1) if axis == 0 else (1, 1, 1, size)
        x = ramp.reshape(shape).expand(1, 1, h, w)
        if scales is None:
            y = F.interpolate(x, size=(ho, wo), mode="bilinear", align_corners=align)
        else:
            y = F.interpolate(x, scale_factor=scales, mode="bilinear", align_corners=align)
        torch_pos = (y[0, 0, :, 0] if axis == 0 else y[0, 0, 0, :]).clamp(max=size - 1)
        ours = source_positions(out, size, align, None if scales is None else scales[axis], 8)
        ours = (ours.to(torch.float64) / 2**8).clamp(max=size - 1)
        assert float((ours - torch_pos).abs().max()) <= 2**-9 + 1e-12, axis


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="frac_bits"):
        source_positions(4, 4, False, None, 16)
    with pytest.raises(ValueError, match="sizes"):
        source_positions(0, 4, False)
    with pytest.raises(ValueError, match="scale"):
        source_positions(4, 4, False, -2.0)
    with pytest.raises(ValueError, match="shape"):
        resize_bilinear_fixed(torch.zeros(4, 4, dtype=torch.int8), DType.INT8, (2, 2), False)
