"""``platform.weight_per_channel`` and ``platform.bias_float`` decide what the simulator does,
checked against torch's fake-quant kernels and the integer reference (numerics.reference)."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from torch import nn

from quantlab.numerics import reference
from quantlab.numerics.dtypes import DType
from quantlab.numerics.requant import requant_scale
from quantlab.numerics.rounding import Round
from quantlab.platforms import load_platform
from quantlab.simulate import Mode, Simulator

CONV = "0:conv2d#0"


def _conv_model() -> nn.Module:
    """conv (output requantized to int8) -> sigmoid; output channels of unequal magnitude, so a
    per-tensor weight scale differs from per-channel ones."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Sigmoid()).eval()
    with torch.no_grad():
        model[0].weight.mul_(torch.logspace(-1, 0.5, 8).reshape(-1, 1, 1, 1))
    return model


def _calibrated(model, platform, x):
    sim = Simulator(model, platform)
    sim.calibrate([(x,)], progress=False)
    return sim


def _fq(t, s):
    """torch's own per-tensor fake quantization (int8, zero point 0, round half to even)."""
    return torch.fake_quantize_per_tensor_affine(t, float(s), 0, -128, 127)


def test_per_tensor_weights_in_fake_and_fixed_mode():
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    plat = dataclasses.replace(load_platform("j6m"), weight_per_channel=False)
    model = _conv_model()
    sim = _calibrated(model, plat, x)
    rq = sim.qconfig_of(CONV)
    sx = sim.act_scale(CONV, "in0", DType.INT8, rq)
    so = sim.act_scale(CONV, "out", DType.INT8, rq)
    w, b = model[0].weight.detach(), model[0].bias.detach()
    sw = torch.tensor(float(w.abs().max()) / 127.5, dtype=torch.float32)  # one scale (s.1)

    fake = sim.trace(x, mode=Mode.FAKE).outputs[CONV]
    want = _fq(F.conv2d(_fq(x, sx), _fq(w, sw), b, padding=1), so)
    assert_bits_equal(fake, want)

    info = sim.trace(x, mode=Mode.FIXED).qinfo[CONV]
    xc = reference.quantize(x, sx, DType.INT8)
    wc = reference.quantize(w, sw, DType.INT8)
    acc = reference.int_conv2d(xc, wc, padding=1)
    acc = acc + reference.quantize_bias(b, sx, sw).reshape(1, -1, 1, 1)
    acc, _ = reference.accumulate(acc)
    real = float(requant_scale(sx, sw, so, plat.requant))
    codes = reference.requantize(
        acc, real, plat.requant, DType.INT8, plat.requant_round, mult_bits=plat.requant_mult_bits
    )
    assert_bits_equal(info.codes.to(torch.int64), torch.from_numpy(codes))

    per_channel = _calibrated(_conv_model(), "j6m", x).trace(x, mode=Mode.FIXED).qinfo[CONV]
    assert not torch.equal(per_channel.codes, info.codes)  # the field changed the weights


def _linear_model() -> nn.Module:
    torch.manual_seed(2)
    model = nn.Linear(16, 6).eval()
    with torch.no_grad():
        model.bias.uniform_(-0.3, 0.3)
    return model


def test_bias_float_decides_the_bias_of_fake_mode():
    """A GEMM feeding the model output (high-precision output, float in FAKE mode): with
    bias_float=False FAKE adds the int32 bias codes' value, with True the float bias; FIXED
    adds the same int32 codes either way."""
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
    name = ":linear#0"
    runs = {}
    for flag in (True, False):
        model = _linear_model()
        plat = dataclasses.replace(load_platform("j6m"), bias_float=flag)
        sim = _calibrated(model, plat, x)
        rq = sim.qconfig_of(name)
        assert rq.high_precision_output
        sx = sim.act_scale(name, "in0", DType.INT8, rq)
        _, sw = sim.weight_q(name, model.weight, DType.INT8, True)
        wq = torch.fake_quantize_per_channel_affine(
            model.weight.detach(), sw, torch.zeros(6, dtype=torch.int32), 0, -128, 127
        )
        b = model.bias.detach()
        if not flag:
            codes = reference.quantize_bias(b, sx, sw).astype(np.float32)
            unit = np.float32(float(sx)) * sw.numpy().astype(np.float32)
            b = torch.from_numpy(codes * unit)
            assert not torch.equal(b, model.bias.detach())
        assert_bits_equal(sim.run(x, mode=Mode.FAKE), F.linear(_fq(x, sx), wq, b))
        runs[flag] = sim.run(x, mode=Mode.FIXED)
    assert_bits_equal(runs[False], runs[True])


def _mobilenet_stem() -> nn.Module:
    """MobileNetV2's first block at 192x192: conv 3->32 stride 2 -> relu6, depthwise 3x3 ->
    relu6, 1x1 projection 32->16 (int8 output: the pooling head reads it); every conv with a
    bias. Its 96x96 maps put 32 channels over more than one requantization chunk."""
    torch.manual_seed(4)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, stride=2, padding=1),
        nn.ReLU6(),
        nn.Conv2d(32, 32, 3, padding=1, groups=32),
        nn.ReLU6(),
        nn.Conv2d(32, 16, 1),
        nn.AdaptiveAvgPool2d(1),
    ).eval()


def test_per_tensor_weights_over_many_channel_chunks_match_the_integer_reference():
    """weight_per_channel=false on j6m, FIXED mode, MobileNetV2-shaped: each conv's output
    codes equal the integer reference (conv, int32 bias, accumulator, MUL_SHIFT requant, the
    fused relu6 as a code clamp) on every channel at sampled positions."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 3, 192, 192, generator=g)
    plat = dataclasses.replace(load_platform("j6m"), weight_per_channel=False)
    model = _mobilenet_stem()
    sim = _calibrated(model, plat, x)
    trace = sim.trace(x, mode=Mode.FIXED)
    ops = sim.ops.set_index("name")
    convs = [n for n in trace.order if ops.loc[n, "op_type"] == "conv2d"]
    assert len(convs) == 3
    prev = None
    for name, conv, relu6 in zip(convs, (model[0], model[2], model[4]), (True, True, False)):
        rq = sim.qconfig_of(name)
        if prev is None:
            sx = sim.act_scale(name, "in0", DType.INT8, rq)
            xc = reference.quantize(x, sx, DType.INT8)
        else:
            sx, xc = prev.scale, prev.codes.numpy()
        so = sim.act_scale(name, "out", DType.INT8, rq)
        w, b = conv.weight.detach(), conv.bias.detach()
        sw = torch.tensor(float(w.abs().max()) / 127.5, dtype=torch.float32)  # one scale
        acc = reference.int_conv2d(
            xc, reference.quantize(w, sw, DType.INT8), conv.stride, conv.padding, 1, conv.groups
        )
        acc = acc + reference.quantize_bias(b, sx, sw).reshape(1, -1, 1, 1)
        acc, _ = reference.accumulate(acc)
        # every channel at the first, last and 300 random positions
        hw = acc.shape[2] * acc.shape[3]
        pos = np.concatenate([[0, hw - 1], torch.randint(0, hw, (300,), generator=g).numpy()])
        sel = acc.reshape(acc.shape[1], hw)[:, pos]
        real = float(requant_scale(sx, sw, so, plat.requant))
        want = reference.requantize(
            sel,
            real,
            plat.requant,
            DType.INT8,
            plat.requant_round,
            mult_bits=plat.requant_mult_bits,
        )
        if relu6:
            hi = reference.round_fraction(Fraction(6.0) / Fraction(float(so)), Round.HALF_EVEN)
            want = np.clip(want, 0, hi)
        info = trace.qinfo[name]
        got = info.codes.to(torch.int64).reshape(acc.shape[1], hw)[:, pos]
        assert_bits_equal(got, torch.from_numpy(want))
        prev = info
