"""``platform.weight_per_channel`` and ``platform.bias_float`` decide what the simulator does,
checked against torch's fake-quant kernels and the integer reference (numerics.reference)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from torch import nn

from quantlab.numerics import reference
from quantlab.numerics.dtypes import DType
from quantlab.numerics.requant import requant_scale
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
