"""FAKE sqrt, reciprocal and log on J6 as the vendor's QAT modules compute them: sqrt and
reciprocal clip their input (sqrt: x >= 1 code of x; reciprocal: |x| >= 1 code (int8) or 32
codes (int16), the sign kept), log is hard_log (max(log x, -10), also what calibration
observes), so inputs at and near 0 give finite values and gradients; the runtime profiles
keep the float functions. Checked bit for bit against torch's own fake quant."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal
from program_switch import build_in_first_run
from torch import nn

from quantlab.numerics.dtypes import DType
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator


class _SqrtReciprocal(nn.Module):
    def forward(self, x):
        return torch.sqrt(x), torch.reciprocal(x)


class _Clipped(nn.Module):
    def forward(self, x):
        return torch.sqrt(x), torch.reciprocal(x), torch.log(x)


def _calibrated(
    platform: str, dtype: DType | None, module=None, **kw
) -> tuple[Simulator, torch.Generator]:
    """``module`` (default ``_SqrtReciprocal``) calibrated at ``dtype`` everywhere (None: the
    platform's own qconfig)."""
    spec = (
        None
        if dtype is None
        else QConfigSpec(global_=OpQConfig(input_dtype=dtype, output_dtype=dtype))
    )
    sim = Simulator(module or _SqrtReciprocal(), platform, spec, **kw)
    g = torch.Generator().manual_seed(7)
    sim.calibrate([(torch.rand(4, 256, generator=g) * 3 + 0.05,)], progress=False)
    return sim, g


def _fq(sim, name: str, key: str, v: torch.Tensor, dtype: DType) -> tuple[torch.Tensor, float]:
    rq = sim.qconfig_of(name)
    s = float(sim.act_scale(name, key, dtype, rq))
    zp = sim.act_zero_point(name, key, dtype, rq)
    return torch.fake_quantize_per_tensor_affine(v, s, zp, dtype.qmin, dtype.qmax), s


def _near_zero(sim, dtype: DType, g: torch.Generator) -> torch.Tensor:
    """Positive inputs with, in row 0, every code inside the int16 clip, 0, -0 and negatives."""
    s = float(sim.act_scale(":sqrt#0", "in0", dtype, sim.qconfig_of(":sqrt#0")))
    x = torch.rand(4, 256, generator=g) * 3 + 0.05
    x[0, :64] = torch.arange(-32, 32) * s
    x[0, 64:72] = torch.tensor([0.0, -0.0, 0.4 * s, -0.6 * s, 31 * s, -33 * s, -1.5, 1e-9])
    return x


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_fake_sqrt_and_reciprocal_clip_their_input_as_the_vendors_qat(dtype):
    sim, g = _calibrated("j6m", dtype)
    x = _near_zero(sim, dtype, g)
    got_sqrt, got_recip = sim.run(x, mode=Mode.FAKE)

    xq, s = _fq(sim, ":sqrt#0", "in0", x, dtype)
    want_sqrt, _ = _fq(sim, ":sqrt#0", "out", torch.sqrt(xq.clamp_min(s)), dtype)
    xq, s = _fq(sim, ":reciprocal#0", "in0", x, dtype)
    floor = (32 if dtype is DType.INT16 else 1) * s
    mag = torch.reciprocal(xq.abs().clamp_min(floor))
    want_recip, _ = _fq(sim, ":reciprocal#0", "out", torch.where(xq < 0, -mag, mag), dtype)
    assert_bits_equal(got_sqrt, want_sqrt)
    assert_bits_equal(got_recip, want_recip)
    assert torch.isfinite(got_sqrt).all() and torch.isfinite(got_recip).all()
    # the float functions differ there: NaN below 0, infinite at 0
    assert torch.isnan(torch.sqrt(xq)).any() and torch.isinf(torch.reciprocal(xq)).any()
    # training's forward: the same bits, finite gradients (sqrt's is infinite at 0 unclipped)
    xg = x.clone().requires_grad_()
    a, b = sim.train_forward(xg)
    assert_bits_equal(a.detach(), got_sqrt)
    assert_bits_equal(b.detach(), got_recip)
    (a.sum() + b.sum()).backward()
    assert torch.isfinite(xg.grad).all() and xg.grad.abs().sum() > 0


def test_the_runtime_profiles_fake_sqrt_and_reciprocal_are_the_float_functions():
    sim, g = _calibrated("onnxruntime", None)
    rq = sim.qconfig_of(":sqrt#0")
    dt = rq.input_dtype or rq.output_dtype
    x = torch.rand(4, 256, generator=g) * 3 + 0.05
    s = float(sim.act_scale(":sqrt#0", "in0", dt, rq))
    x[0, :4] = torch.tensor([0.0, 0.4 * s, s, 2 * s])  # 0, 0, 1 and 2 steps of the scale
    got_sqrt, got_recip = sim.run(x, mode=Mode.FAKE)
    xq, _ = _fq(sim, ":sqrt#0", "in0", x, dt)
    assert_bits_equal(got_sqrt, _fq(sim, ":sqrt#0", "out", torch.sqrt(xq), rq.output_dtype)[0])
    xq, _ = _fq(sim, ":reciprocal#0", "in0", x, dt)
    want = _fq(sim, ":reciprocal#0", "out", torch.reciprocal(xq), rq.output_dtype)[0]
    assert_bits_equal(got_recip, want)
    assert got_sqrt[0, 0] == 0  # sqrt(0), where J6's QAT gives sqrt(1 code)


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.HYBRID])
def test_the_clipped_forms_keep_their_bits_in_steady_runs(monkeypatch, mode):
    """Kept as prepared calls and in a traced program, the clipped forms (FAKE) and the
    deployed tables (HYBRID) give the bits of a simulator that captures every run (log's NaN
    below 0 included)."""
    build_in_first_run(monkeypatch)
    fast, g = _calibrated("j6m", DType.INT16, _Clipped(), steady_programs=True)
    captured, _ = _calibrated("j6m", DType.INT16, _Clipped(), steady_programs=False)
    xs = [_near_zero(fast, DType.INT16, g) for _ in range(2)]
    for x in xs * 3:
        for a, b in zip(fast.run(x, mode=mode), captured.run(x, mode=mode), strict=True):
            assert_bits_equal(a, b)
    state = fast.steady_programs.status((xs[0],), mode)
    assert state.program is not None and state.program.fallbacks == 0


class _Log(nn.Module):
    def forward(self, x):
        return torch.log(x)


def _log_sim(platform: str, top: float = 2.0) -> Simulator:
    """int16 log, MINMAX scales, calibrated on inputs from 1e-8 (log -18.4) to 10**top."""
    rule = OpQConfig(input_dtype=DType.INT16, output_dtype=DType.INT16, observer="MINMAX")
    sim = Simulator(_Log(), platform, QConfigSpec(global_=rule))
    x = torch.logspace(-8, top, 512).reshape(4, 128)
    sim.calibrate([(x,)], progress=False)
    return sim


def test_fake_log_is_the_vendors_hard_log_and_calibrates_on_it():
    """J6's QAT log is hard_log, max(log(x), -10): calibration observes it (the output scale
    covers 10, not the 18.4 of log(1e-8)) and FAKE computes it, with a finite gradient at 0;
    the runtime profiles keep the float log."""
    sim = _log_sim("j6m")
    rq = sim.qconfig_of(":log#0")
    s_out = float(sim.act_scale(":log#0", "out", DType.INT16, rq))
    assert s_out * 32767.5 == pytest.approx(10.0, rel=1e-6)
    g = torch.Generator().manual_seed(8)
    x = torch.rand(4, 128, generator=g) * 50
    x[0, :6] = torch.tensor([0.0, 1e-9, 1e-6, 4.5e-5, 4.6e-5, 1e-3])  # log -inf .. -6.9
    xq, _ = _fq(sim, ":log#0", "in0", x, DType.INT16)
    want, _ = _fq(sim, ":log#0", "out", torch.log(xq).clamp_min(-10.0), DType.INT16)
    got = sim.run(x, mode=Mode.FAKE)
    assert_bits_equal(got, want)
    xg = x.clone().requires_grad_()
    out = sim.train_forward(xg)
    assert_bits_equal(out.detach(), got)
    out.sum().backward()
    assert torch.isfinite(xg.grad).all()
    kept = torch.log(xq) > -10
    assert (xg.grad[~kept] == 0).all() and (xg.grad[kept] != 0).all()
    # an output scale wide enough to hold log values below -10 (calibrated up to log 12.7):
    # hard_log's floor, not the float log, reaches the output
    wide = _log_sim("j6m", top=5.5)
    xq, _ = _fq(wide, ":log#0", "in0", x, DType.INT16)
    want, s_wide = _fq(wide, ":log#0", "out", torch.log(xq).clamp_min(-10.0), DType.INT16)
    got = wide.run(x, mode=Mode.FAKE)
    assert_bits_equal(got, want)
    assert s_wide * 32767.5 > 12 and got.min() >= -10 > torch.log(xq[0, 2])

    ort = _log_sim("onnxruntime")
    rq = ort.qconfig_of(":log#0")
    s_ort = float(ort.act_scale(":log#0", "out", DType.INT16, rq))
    assert s_ort * 32767.5 == pytest.approx(-torch.log(torch.tensor(1e-8)).item(), rel=1e-4)
