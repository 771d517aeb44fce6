"""Measuring sin/cos beyond one period: error sources, workloads and the wrapped toy model.

Three treatments of a sin/cos input x (float) on its way to the segment LUT:
  NONE:     x is quantized over its whole range (scale from max|x|, HALF_RANGE rule) and the
            LUT covers that range (what QAT trains and what deploys without the fix);
  EXPORTER: the same quantized input, reduced to one period by the exporter's steps
            (``period_reduce``, each step re-quantized) when ``needs_period_reduction``, and a
            LUT on [0, 2pi] (j6-numerics s.5);
  WRAP:     x is wrapped to [-pi, pi) in float upstream (``wrap_to_pi``), then quantized with
            range pi and looked up in a LUT on that range.
Errors, all in output units (sin/cos values), per sample: (a) the table's own error, LUT output
minus exact f of the quantized input it was given; (b) the input error, f of that quantized
input minus f(x); total = LUT output minus f(x). The QAT gap is the LUT output minus what QAT
computes for the same sample: exact f of the quantized input, output fake-quantized; QAT sees
the full-range input for NONE and EXPORTER (the exporter changes only the deployed graph) and the
wrapped input for WRAP (the model itself changed).
"""

from __future__ import annotations

import dataclasses
import enum
import math

import pandas as pd
import torch
from torch import Tensor, nn

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import InputHistogram, LutFormat, Strategy, build_lut, default_spec
from quantlab.numerics.periodic import needs_period_reduction, period_reduce, wrap_to_pi
from quantlab.numerics.quantize import ScaleRule, compute_scale, quantize
from quantlab.numerics.rounding import Round

FUNCS = {"sin": torch.sin, "cos": torch.cos}


class Treatment(enum.Enum):
    """What happens to a wide sin/cos input (module docstring)."""

    NONE = "none"
    EXPORTER = "exporter"
    WRAP = "wrap"


@dataclasses.dataclass(frozen=True)
class LutInput:
    """The codes a LUT sees, their scale and dtype, and whether the exporter reduced them."""

    codes: Tensor
    scale: float
    dtype: DType
    reduced: bool


def lut_input(
    x: Tensor,
    treatment: Treatment,
    dtype: DType,
    rounding: Round = Round.HALF_EVEN,
    amax: float | None = None,
) -> LutInput:
    """Codes reaching the table for float inputs ``x`` under ``treatment``.

    The input scale is ``compute_scale(amax, dtype)`` (HALF_RANGE, j6-numerics s.1) with
    ``amax`` = max|x| by default (pi for WRAP); rounding ``rounding``, saturating.
    """
    if treatment is Treatment.WRAP:
        x = wrap_to_pi(x.to(torch.float64))
        amax = math.pi
    amax = float(x.abs().max()) if amax is None else amax
    scale = float(compute_scale(amax, dtype, ScaleRule.HALF_RANGE))
    codes = quantize(x.to(torch.float32), scale, dtype, rounding)
    if treatment is Treatment.EXPORTER and needs_period_reduction(scale, dtype):
        codes, scale = period_reduce(codes, scale, dtype, rounding)
        return LutInput(codes, scale, dtype, True)
    return LutInput(codes, scale, dtype, False)


DATA_BINS = 512  # bins of DATA's histogram of the table inputs (error_sources)


def _table_input_histogram(xq: Tensor) -> InputHistogram:
    lo, hi = float(xq.min()), float(xq.max())
    if not hi > lo:
        hi = lo + 1.0
    counts = torch.histc(xq, DATA_BINS, lo, hi)
    return InputHistogram(lo, hi, tuple(counts.tolist()))


def error_sources(
    func: str,
    x: Tensor,
    treatment: Treatment,
    in_dtype: DType,
    out_dtype: DType,
    strategy: Strategy,
    fmt: LutFormat,
    rounding: Round = Round.HALF_EVEN,
) -> dict:
    """Max and mean |error| of (a) the table, (b) the input, the total and the QAT gap.

    ``x``: float samples of the op's input (float64 recommended). Output scale: full range
    [-1, 1] in ``out_dtype`` (HALF_RANGE). LUT: ``build_lut`` with ``default_spec(func)`` and
    ``strategy``, on the input's code range (on [0, 2pi] after the exporter's reduction); DATA's
    histogram is that of the table's own inputs (the samples as the table sees them, reduced if
    so, on their codes), in DATA_BINS equal bins over their range.
    Returns floats: a_max, a_mean, b_max, b_mean, total_max, total_mean, qat_gap_max,
    qat_gap_mean, input_step (rad), reduced (bool).
    """
    f = FUNCS[func]
    x64 = x.to(torch.float64)
    li = lut_input(x64, treatment, in_dtype, rounding)
    out_scale = float(compute_scale(1.0, out_dtype, ScaleRule.HALF_RANGE))
    spec = dataclasses.replace(default_spec(func), strategy=strategy, dividing_points=None)
    # the exporter builds the reduced op's table on [0, 2pi] (j6-numerics s.5)
    table_range = (0.0, 2 * math.pi) if li.reduced else None
    xq = li.codes.to(torch.float64) * li.scale
    hist = _table_input_histogram(xq) if strategy is Strategy.DATA else None
    lut = build_lut(func, li.dtype, li.scale, out_dtype, out_scale, spec, fmt, table_range, hist)
    y = lut.evaluate(li.codes).to(torch.float64) * out_scale
    a = (y - f(xq)).abs()
    b = (f(xq) - f(x64)).abs()
    tot = (y - f(x64)).abs()
    qat_treatment = Treatment.WRAP if treatment is Treatment.WRAP else Treatment.NONE
    qat_in = lut_input(x64, qat_treatment, in_dtype, rounding)
    qat_x = qat_in.codes.to(torch.float64) * qat_in.scale
    qat = quantize(f(qat_x).to(torch.float32), out_scale, out_dtype, rounding)
    gap = (y - qat.to(torch.float64) * out_scale).abs()
    return {
        "a_max": float(a.max()),
        "a_mean": float(a.mean()),
        "b_max": float(b.max()),
        "b_mean": float(b.mean()),
        "total_max": float(tot.max()),
        "total_mean": float(tot.mean()),
        "qat_gap_max": float(gap.max()),
        "qat_gap_mean": float(gap.mean()),
        "input_step": li.scale,
        "reduced": li.reduced,
    }


# --------------------------------------------------------------------------- workloads


def detr_angles(width: int = 1920, height: int = 1080, num_feats: int = 16) -> Tensor:
    """DETR sine embedding angles of every pixel coordinate of a width x height image:
    ``c / 10000^(2i/num_feats)`` for c in 0..width-1 and 0..height-1, i < num_feats/2 (float64,
    one tensor: the op sees all frequencies at once; the largest angle is width - 1 rad)."""
    c = torch.cat([torch.arange(width), torch.arange(height)]).to(torch.float64)
    i = torch.arange(num_feats // 2, dtype=torch.float64)
    return (c[:, None] * 10000.0 ** (-2 * i / num_feats)).flatten()


def rotary_angles(max_pos: int = 4096, dim: int = 64, base: float = 10000.0) -> Tensor:
    """Rotary embedding angles ``p * base^(-2i/dim)`` for positions 0..max_pos-1 (float64)."""
    p = torch.arange(max_pos, dtype=torch.float64)
    i = torch.arange(dim // 2, dtype=torch.float64)
    return (p[:, None] * base ** (-2 * i / dim)).flatten()


def nerf_angles(coords: Tensor, num_freqs: int = 10) -> Tensor:
    """NeRF frequency-encoding angles ``2^k pi x`` of normalized coordinates x in [-1, 1]
    (k < num_freqs: up to 2^(num_freqs-1) periods), float64, flattened."""
    k = torch.arange(num_freqs, dtype=torch.float64)
    return (coords.to(torch.float64).reshape(-1, 1) * (2.0**k) * math.pi).flatten()


# --------------------------------------------------------------------------- toy model


class WrappedPosEnc(nn.Module):
    """quantlab.models' PosEnc with every sin/cos angle computed and wrapped to [-pi, pi)
    upstream, in float, outside the quantized model: it takes the wrapped angles as inputs
    (``wrapped_inputs``) and shares the PosEnc's layers, so only the angle path differs."""

    def __init__(self, posenc: nn.Module):
        super().__init__()
        self.posenc = posenc

    def forward(self, sine_ang: Tensor, nerf_ang: Tensor, rot_ang: Tensor) -> Tensor:
        pe = self.posenc
        sine = torch.cat([torch.sin(sine_ang), torch.cos(sine_ang)], -1).flatten(-2)
        nerf = torch.cat([torch.sin(nerf_ang), torch.cos(nerf_ang)], -1).flatten(-2)
        h = torch.relu(pe.embed(torch.cat([sine, nerf], -1)))
        q, k = pe.qk(h).chunk(2, dim=-1)
        c, s = torch.cos(rot_ang), torch.sin(rot_ang)
        q, k = _rotate(q, c, s), _rotate(k, c, s)
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))
        return pe.out(torch.softmax(scores, -1) @ h)


def _rotate(x: Tensor, c: Tensor, s: Tensor) -> Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).flatten(-2)


def wrapped_inputs(posenc: nn.Module, coords: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The PosEnc's three angle tensors for ``coords`` (B, N, 2) pixels, from its frequency
    buffers (``sine_freq``, ``nerf_freq``, ``rotary_freq``), each computed in float64, wrapped
    to [-pi, pi) and returned as float32 (the inputs of ``WrappedPosEnc``)."""
    c = coords.to(torch.float64)
    sine = c.unsqueeze(-1) * posenc.sine_freq.to(torch.float64)
    norm = c / posenc.size.to(torch.float64) * 2 - 1
    nerf = norm.unsqueeze(-1) * posenc.nerf_freq.to(torch.float64)
    rot = c[..., 0].unsqueeze(-1) * posenc.rotary_freq.to(torch.float64)
    return tuple(wrap_to_pi(a).to(torch.float32) for a in (sine, nerf, rot))


# --------------------------------------------------------------------------- model study


def _posenc_simulator(posenc: nn.Module, platform, treatment: Treatment, qconfig=None):
    """(Simulator, batch preparation) of the PosEnc under ``treatment`` (``posenc_study``)."""
    from quantlab.simulate import Simulator

    plat = dataclasses.replace(platform, sincos_period_reduction=treatment is Treatment.EXPORTER)
    model: nn.Module = posenc
    prep = list
    if treatment is Treatment.WRAP:
        model = WrappedPosEnc(posenc)

        def prep(bs):
            return [wrapped_inputs(posenc, b[0]) for b in bs]

    return Simulator(model, plat, qconfig), prep


def posenc_outputs(
    posenc: nn.Module,
    platform,
    treatment: Treatment,
    calib: list[tuple[Tensor, ...]],
    batches: list[tuple[Tensor, ...]],
    qconfig=None,
    progress: bool = True,
) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """Per evaluation batch: the float PosEnc's outputs on the original coordinates, and the
    fake and fixed outputs of the PosEnc under ``treatment`` (calibrated on ``calib``)."""
    from quantlab.simulate import Mode

    sim, prep = _posenc_simulator(posenc, platform, treatment, qconfig)
    sim.calibrate(prep(calib), progress)
    runs = prep(batches)
    with torch.no_grad():
        ref = [posenc(*b) for b in batches]
        fake = [sim.run(*b, mode=Mode.FAKE) for b in runs]
        fixed = [sim.run(*b, mode=Mode.FIXED) for b in runs]
    return ref, fake, fixed


def posenc_study(
    posenc: nn.Module,
    platform,
    treatment: Treatment,
    calib: list[tuple[Tensor, ...]],
    batches: list[tuple[Tensor, ...]],
    qconfig=None,
    progress: bool = True,
) -> tuple[dict, pd.DataFrame]:
    """Run the PosEnc toy model under ``treatment`` on ``platform`` (a PlatformConfig).

    NONE: ``platform.sincos_period_reduction`` off; EXPORTER: on; WRAP: ``WrappedPosEnc`` fed
    with ``wrapped_inputs``. Returns output SQNRs (dB) against the float PosEnc on the original
    coordinates (fake, fixed) and fixed against fake (the QAT-to-deployed gap), each with its
    95% interval and item count (``<key>_ci_low``, ``<key>_ci_high``, ``<key>_n``), plus the
    sensitivity table (quantlab.analysis.sensitivity, ACTIVATION and FIXED passes, SQNR).
    """
    from quantlab.analysis.confidence import sqnr_estimate
    from quantlab.analysis.sensitivity import Metric, SensitiveType, sensitivity
    from quantlab.simulate import Mode

    sim, prep = _posenc_simulator(posenc, platform, treatment, qconfig)
    sim.calibrate(prep(calib), progress)
    runs = prep(batches)
    with torch.no_grad():
        ref = torch.cat([posenc(*b) for b in batches])
        fake = torch.cat([sim.run(*b, mode=Mode.FAKE) for b in runs])
        fixed = torch.cat([sim.run(*b, mode=Mode.FIXED) for b in runs])
    sens = sensitivity(
        sim,
        runs,
        kinds=[SensitiveType.ACTIVATION, SensitiveType.FIXED],
        metrics=[Metric.SQNR],
        progress=progress,
    )
    out = {}
    for key, (a, b) in {
        "fake_sqnr_db": (ref, fake),
        "fixed_sqnr_db": (ref, fixed),
        "gap_sqnr_db": (fake, fixed),
    }.items():
        out.update(sqnr_estimate([a], [b]).as_columns(key))
    return out, sens.table
