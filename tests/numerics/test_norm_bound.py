"""Fixed-point (and QAT) normalisation against float LayerNorm / GroupNorm / InstanceNorm: the
measured error never exceeds the per-element bound derived from the widths and scales
(quantlab.numerics.norm_bound), and that bound is small."""

import pytest
import torch
import torch.nn.functional as F

from quantlab.numerics.dtypes import DType
from quantlab.numerics.norm import EpsMode, NormContract, NormLayout
from quantlab.numerics.norm_bound import NormChain, norm_error_bound
from quantlab.numerics.norm_calibrate import norm_fake, norm_steps
from quantlab.numerics.norm_integer import norm_fixed
from tests.numerics.test_norm import calibrated, params, rows_data

LAYOUTS = {
    "layer_norm": (NormLayout.layer(64), (48, 64), 64),
    "group_norm": (NormLayout.group(4), (4, 16, 6, 6), 16),
    "instance_norm": (NormLayout.instance(), (4, 8, 8, 8), 8),
}


def test_float_steps_are_torch_norms():
    x = rows_data(0, (3, 8, 4, 5)).to(torch.float64)
    w, b = (p.to(torch.float64) for p in params(8, 0))
    got = norm_steps(x, NormLayout.group(2), w, b, 1e-5).out
    assert torch.allclose(got, F.group_norm(x, 2, w, b, 1e-5), rtol=0, atol=1e-12)
    got = norm_steps(x, NormLayout.instance(), w, b, 1e-5).out
    assert torch.allclose(got, F.instance_norm(x, weight=w, bias=b, eps=1e-5), atol=1e-12)
    w2, b2 = (p.to(torch.float64) for p in params(20, 1))
    w2, b2 = w2.reshape(4, 5), b2.reshape(4, 5)
    got = norm_steps(x, NormLayout.layer((4, 5)), w2, b2, 1e-5).out
    assert torch.allclose(got, F.layer_norm(x, (4, 5), w2, b2, 1e-5), rtol=0, atol=1e-12)


def _case(kind, dtype, seed, spread):
    layout, shape, c = LAYOUTS[kind]
    x = rows_data(seed, shape, spread)
    w, b = params(c, seed)
    codes, s_in, sc, so = calibrated(x, layout, w, b, dtype, dtype)
    y_float = norm_steps(codes.to(torch.float64) * s_in, layout, w, b, 1e-5).out
    return layout, w, b, codes, s_in, sc, so, y_float


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16], ids=["int8", "int16"])
@pytest.mark.parametrize("kind", list(LAYOUTS))
def test_fixed_and_fake_within_the_bound(kind, dtype):
    """Rows with per-row spreads over a factor e: the integer chain (rsqrt table included) and
    the QAT chain stay within their proven bounds; the bound itself is at most 4 output LSB for
    int8 and 0.25% of full scale (82 LSB) for int16."""
    layout, w, b, codes, s_in, sc, so, y_float = _case(kind, dtype, 0, 1.0)
    args = (codes, s_in, layout, w, b, 1e-5, sc, so, dtype)
    fixed = norm_fixed(*args).to(torch.float64) * so
    bound = norm_error_bound(*args)
    assert torch.isfinite(bound).all()
    assert ((fixed - y_float).abs() <= bound).all()
    assert float(bound.max()) <= (4 if dtype is DType.INT8 else 82) * so
    x = codes.to(torch.float32) * s_in
    fake = norm_fake(x, layout, w, b, 1e-5, sc, so, dtype).to(torch.float64)
    fake_bound = norm_error_bound(*args, chain=NormChain.FAKE)
    assert ((fake - y_float).abs() <= fake_bound).all()


def test_bound_holds_on_adversarial_rows():
    """Constant rows (variance 0: float gives beta, the chain amplifies the mean's rounding by
    1/sqrt(eps)), wide spreads, a saturating output scale, and eps added as codes."""
    layout = NormLayout.layer(32)
    consts = torch.linspace(-3, 3, 7).reshape(-1, 1).expand(7, 32)
    x = torch.cat([rows_data(5, (6, 32), spread=4.0), consts])
    w, b = params(32, 5)
    for dtype in (DType.INT8, DType.INT16):
        for contract in (NormContract(), NormContract(eps_mode=EpsMode.ADD_CODES)):
            codes, s_in, sc, so = calibrated(x, layout, w, b, dtype, dtype, 1e-5, contract)
            y_float = norm_steps(codes.to(torch.float64) * s_in, layout, w, b, 1e-5).out
            for s_out in (so, so / 4):
                args = (codes, s_in, layout, w, b, 1e-5, sc, s_out, dtype, contract)
                fixed = norm_fixed(*args).to(torch.float64) * s_out
                assert ((fixed - y_float).abs() <= norm_error_bound(*args)).all()
