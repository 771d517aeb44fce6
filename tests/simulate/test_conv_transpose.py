"""Transposed convolutions (nn.ConvTranspose2d / F.conv_transpose2d) in the simulator: one GEMM
op with per-output-channel weight scales along the weight's dim 1 (one scale per tensor with
groups), fixed-mode codes equal to the integer reference, the QAT form equal to torch's
fake-quant kernels, a following BatchNorm folded per output channel, and the platform's GEMM
template."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from torch import nn

from quantlab.models.fold import to_deployment_form
from quantlab.numerics import reference
from quantlab.numerics.dtypes import DType
from quantlab.numerics.requant import requant_scale
from quantlab.simulate import Mode, Simulator
from quantlab.simulate.fusion import scale_output_channels
from quantlab.simulate.profiles import platform_config

UP = "0:conv_transpose2d#0"
KW = dict(stride=2, padding=1, output_padding=1)


def _model(groups: int = 1, batch_norm: bool = False) -> nn.Module:
    """ConvTranspose2d(4 -> 6, 3x3, stride 2) [-> BatchNorm2d] -> Sigmoid, output channels of
    unequal magnitude (per-channel scales differ from one per tensor)."""
    torch.manual_seed(3)
    up = nn.ConvTranspose2d(4, 6, 3, groups=groups, **KW)
    with torch.no_grad():
        up.weight.mul_(torch.logspace(-1, 0.5, 6 // groups).reshape(1, -1, 1, 1))
    layers = [up]
    if batch_norm:
        bn = nn.BatchNorm2d(6)
        with torch.no_grad():
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.3, 3.0)
            bn.weight.uniform_(0.5, 2.0)
            bn.bias.uniform_(-0.5, 0.5)
        layers.append(bn)
    return nn.Sequential(*layers, nn.Sigmoid()).eval()


def _calibrated(model, platform, x):
    sim = Simulator(model, platform_config(platform))
    sim.calibrate([(x,)], progress=False)
    return sim


def _weight_scale(w: torch.Tensor, groups: int) -> torch.Tensor:
    """j6m's int8 weight scales (amax / 127.5): per output channel (dim 1) with one group, one
    per tensor with groups."""
    if groups == 1:
        return (w.abs().amax(dim=(0, 2, 3)) / 127.5).float()
    return torch.tensor(float(w.abs().max()) / 127.5, dtype=torch.float32)


def _x() -> torch.Tensor:
    return torch.randn(2, 4, 5, 6, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("groups", [1, 2])
def test_fixed_codes_equal_the_integer_reference(groups):
    x = _x()
    model = _model(groups)
    sim = _calibrated(model, "j6m", x)
    plat = sim.platform
    rq = sim.qconfig_of(UP)
    sx = sim.act_scale(UP, "in0", DType.INT8, rq)
    so = sim.act_scale(UP, "out", DType.INT8, rq)
    w, b = model[0].weight.detach(), model[0].bias.detach()
    sw = _weight_scale(w, groups)
    axis = 1 if groups == 1 else None
    xc = reference.quantize(x, sx, DType.INT8)
    wc = reference.quantize(w, sw, DType.INT8, axis=axis)
    acc = reference.int_conv_transpose2d(xc, wc, groups=groups, **KW)
    acc = acc + reference.quantize_bias(b, sx, sw).reshape(1, -1, 1, 1)
    acc, _ = reference.accumulate(acc)
    real = requant_scale(sx, sw, so, plat.requant)
    codes = reference.requantize(
        acc,
        real,
        plat.requant,
        DType.INT8,
        plat.requant_round,
        1 if groups == 1 else None,
        mult_bits=plat.requant_mult_bits,
    )
    info = sim.trace(x, mode=Mode.FIXED).qinfo[UP]
    assert_bits_equal(info.codes.to(torch.int64), torch.from_numpy(codes))
    ops = sim.ops.set_index("name")
    assert ops.loc[UP, "category"] == "GEMM" and bool(ops.loc[UP, "supported"])


@pytest.mark.parametrize("groups", [1, 2])
def test_fake_mode_is_torchs_fake_quant_along_the_output_channels(groups):
    x = _x()
    model = _model(groups)
    sim = _calibrated(model, "j6m", x)
    rq = sim.qconfig_of(UP)
    sx = sim.act_scale(UP, "in0", DType.INT8, rq)
    so = sim.act_scale(UP, "out", DType.INT8, rq)
    w, b = model[0].weight.detach(), model[0].bias.detach()
    sw = _weight_scale(w, groups)
    if groups == 1:
        zeros = torch.zeros(sw.numel(), dtype=torch.int32)
        wq = torch.fake_quantize_per_channel_affine(w, sw, zeros, 1, -128, 127)
    else:
        wq = torch.fake_quantize_per_tensor_affine(w, float(sw), 0, -128, 127)
    xq = torch.fake_quantize_per_tensor_affine(x, float(sx), 0, -128, 127)
    y = F.conv_transpose2d(xq, wq, b, groups=groups, **KW)
    want = torch.fake_quantize_per_tensor_affine(y, float(so), 0, -128, 127)
    assert_bits_equal(sim.trace(x, mode=Mode.FAKE).outputs[UP], want)


def test_scale_output_channels_follows_the_groups():
    g = torch.Generator().manual_seed(0)
    for groups, cin, cout in ((1, 4, 6), (2, 4, 6), (3, 6, 9)):
        w = torch.randn(cin, cout // groups, 2, 3, generator=g)
        k = torch.randn(cout, generator=g)
        want = w.clone()
        for c in range(cin):
            gi = c // (cin // groups)
            for j in range(cout // groups):
                want[c, j] *= k[gi * (cout // groups) + j]
        assert_bits_equal(scale_output_channels(w, k, groups), want)
    w = torch.randn(6, 4, 3, 3, generator=g)  # a convolution's (O, ...) weight
    k = torch.randn(6, generator=g)
    assert_bits_equal(scale_output_channels(w, k), w * k.reshape(-1, 1, 1, 1))


@pytest.mark.parametrize("groups", [1, 2])
def test_a_following_batch_norm_is_folded_per_output_channel(groups):
    """The BatchNorm after a transposed convolution is fused into it: its FAKE and FIXED outputs
    equal those of the model whose weight and bias hold the folded values (float32, as
    folded)."""
    x = _x()
    model = _model(groups, batch_norm=True)
    sim = _calibrated(model, "j6m", x)
    ops = sim.ops.set_index("name")
    assert ops.loc["1:batch_norm#0", "fused_into"] == UP
    up, bn = model[0], model[1]
    k = torch.rsqrt(bn.running_var.float() + bn.eps) * bn.weight.detach().float()
    folded = _model(groups)
    with torch.no_grad():
        folded[0].weight.copy_(scale_output_channels(up.weight.detach(), k, groups))
        folded[0].bias.copy_((up.bias.detach() - bn.running_mean) * k + bn.bias.detach())
    ref = _calibrated(folded, "j6m", x)
    for mode in (Mode.FAKE, Mode.FIXED):  # the op's output (the sigmoid's scale is observed
        # on each model's own float run, which rounds differently with and without the fold)
        assert_bits_equal(sim.trace(x, mode=mode).outputs[UP], ref.trace(x, mode=mode).outputs[UP])


def test_deployment_form_folds_a_batch_norm_into_a_transposed_convolution():
    for groups in (1, 2):
        model = _model(groups, batch_norm=True)
        x = _x()
        with torch.no_grad():
            before = model(x)
        to_deployment_form(model, (x,))
        assert isinstance(model[1], nn.Identity)
        with torch.no_grad():
            after = model(x)
        assert float((after - before).abs().max()) < 1e-6


def test_platform_gemm_template_applies():
    """J6P runs Conv / MatMul at int8 in a float16 model: a transposed convolution's input is
    int8 too; its output feeding the model output is the high-precision one."""
    x = _x()
    sim = _calibrated(_model(), "j6p", x)
    assert sim.qconfig_of(UP).input_dtype is DType.INT8
    plain = nn.Sequential(nn.ConvTranspose2d(4, 3, 2, stride=2)).eval()
    sim = _calibrated(plain, "j6m", x)
    assert sim.qconfig_of(UP).high_precision_output
    out = sim.run(x, mode=Mode.FIXED)
    assert out.dtype == torch.float32 and np.isfinite(out.numpy()).all()
