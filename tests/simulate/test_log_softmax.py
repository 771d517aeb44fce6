"""log_softmax on J6 as the vendor plugin composes its LogSoftmax: the segment-LUT softmax to
codes of the op's output dtype at a calibrated scale of its own (``<op>/softmax``), then the
log table (hard_log, floored at -10). FIXED is checked against that composition built from
the numerics functions, FAKE against torch's own fake quant of the QAT forms; the runtime
profiles keep it in float (``platform.float_fallback_ops``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from program_switch import build_in_first_run
from torch import nn

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import build_lut, lut_softmax
from quantlab.numerics.lut.composite import qat_softmax
from quantlab.numerics.quantize import Divide, quantize
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator
from quantlab.simulate.fixed_log_softmax import LOG_SOFTMAX_KEY
from quantlab.simulate.fixed_softmax import inner_point_rq

NAME = ":log_softmax#0"


class _LogSoftmax(nn.Module):
    def forward(self, x):
        return F.log_softmax(x, dim=-1)


def _calibrated(platform: str, dtype: DType, **kw) -> tuple[Simulator, torch.Generator]:
    rule = OpQConfig(input_dtype=dtype, output_dtype=dtype)
    sim = Simulator(_LogSoftmax(), platform, QConfigSpec(global_=rule), **kw)
    g = torch.Generator().manual_seed(11)
    sim.calibrate([(torch.randn(16, 12, generator=g) * 3,) for _ in range(2)], progress=False)
    return sim, g


def _inputs(g: torch.Generator) -> torch.Tensor:
    """Rows of logits, one with a far outlier (its other probabilities below one code)."""
    x = torch.randn(8, 12, generator=g) * 3
    x[0] = torch.tensor([9.0] + [-9.0] * 11)
    return x


def _scales(sim, dtype):
    rq = sim.qconfig_of(NAME)
    s_in = float(sim.act_scale(NAME, "in0", dtype, rq))
    s_mid = float(sim.act_scale(NAME, LOG_SOFTMAX_KEY, dtype, inner_point_rq(rq)))
    s_out = float(sim.act_scale(NAME, "out", dtype, rq))
    return s_in, s_mid, s_out


def _sum_scale(sim) -> float:
    """The inner softmax's row-sum scale: int16, calibrated at ``<op>/sum``."""
    rq = inner_point_rq(sim.qconfig_of(NAME))
    return float(sim.act_scale(NAME, "sum", DType.INT16, rq))


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_fixed_log_softmax_is_the_lut_softmax_then_the_log_table(dtype):
    sim, g = _calibrated("j6m", dtype)
    plat = sim.platform
    x = _inputs(g)
    s_in, s_mid, s_out = _scales(sim, dtype)
    xc = quantize(x, s_in, dtype, plat.fake_round).to(dtype.torch_dtype)
    fmt = plat.lut_format()
    mid = lut_softmax(xc, s_in, dtype, -1, s_mid, dtype, fmt, sum_scale=_sum_scale(sim))
    observed = sim.observed_range(NAME, LOG_SOFTMAX_KEY)
    table = build_lut(
        "log", dtype, s_mid, dtype, s_out, plat.lut_spec("log"), plat.lut_format(), observed
    )
    want = table.evaluate(mid).to(torch.float32) * s_out
    got = sim.run(x, mode=Mode.FIXED)
    assert_bits_equal(got, want)
    assert_bits_equal(sim.run(x, mode=Mode.HYBRID), got)  # the deployed form is FIXED's
    # the inner softmax's scale covers [0, 1]; the output's, hard_log's floor (-10): the
    # calibration observed log_softmax floored, not the -18 and below of the outlier rows
    assert s_mid * (dtype.qmax + 0.5) == pytest.approx(1.0, rel=0.05)
    assert s_out * (dtype.qmax + 0.5) <= 10.0 * (1 + 1e-6)
    # the outlier row's tiny probabilities share one code of the LUT softmax (0 at int8),
    # so one output value
    assert (mid[0, 1:] == mid[0, 1]).all() and (got[0, 1:] == got[0, 1]).all()
    assert dtype is DType.INT16 or mid[0, 1] == 0
    ref = F.log_softmax(x, dim=-1)
    close = ref > torch.log(torch.tensor(8 * s_mid))  # several inner codes: a close log
    assert (got - ref)[close].abs().max() < 0.25


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_fake_log_softmax_is_the_plugins_qat_logsoftmax(dtype):
    """FAKE: fq_out(hard_log(fq_s(qat_softmax(fq_in(x))))) by torch's fake quant, with the
    float log_softmax's gradient."""
    sim, g = _calibrated("j6m", dtype)
    x = _inputs(g)
    s_in, s_mid, s_out = _scales(sim, dtype)

    def fq(v, s):
        return torch.fake_quantize_per_tensor_affine(v, s, 0, dtype.qmin, dtype.qmax)

    divide, ss = Divide.BY_RECIPROCAL, _sum_scale(sim)
    p = fq(qat_softmax(fq(x, s_in), -1, s_in, divide=divide, sum_scale=ss), s_mid)
    want = fq(torch.log(p).clamp_min(-10.0), s_out)
    got = sim.run(x, mode=Mode.FAKE)
    assert_bits_equal(got, want)
    xg = x.clone().requires_grad_()
    out = sim.train_forward(xg)
    assert_bits_equal(out.detach(), got)
    out[:, 0].sum().backward()
    assert torch.isfinite(xg.grad).all() and xg.grad.abs().sum() > 0


@pytest.mark.parametrize("platform", ["onnxruntime", "tflite"])
def test_the_runtime_profiles_keep_log_softmax_in_float(platform):
    """Their own log_softmax kernels are not modelled (``float_fallback_ops``): the
    op runs in float (not supported there), as before it was modelled."""
    sim = Simulator(_LogSoftmax(), platform)
    g = torch.Generator().manual_seed(12)
    sim.calibrate([(torch.randn(16, 12, generator=g) * 3,)], progress=False)
    ops = sim.ops.set_index("name")
    assert ops.loc[NAME, "category"] == "LOG_SOFTMAX" and not ops.loc[NAME, "supported"]
    x = _inputs(g)
    for mode in (Mode.FAKE, Mode.FIXED):
        assert_bits_equal(sim.run(x, mode=mode), F.log_softmax(x, dim=-1))


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED, Mode.HYBRID])
def test_log_softmax_keeps_its_bits_in_steady_runs(monkeypatch, mode):
    build_in_first_run(monkeypatch)
    fast, g = _calibrated("j6m", DType.INT8, steady_programs=True)
    captured, _ = _calibrated("j6m", DType.INT8, steady_programs=False)
    xs = [_inputs(g) for _ in range(2)]
    for x in xs * 3:
        assert_bits_equal(fast.run(x, mode=mode), captured.run(x, mode=mode))
    state = fast.steady_programs.status((xs[0],), mode)
    assert state.program is not None and state.program.fallbacks == 0
