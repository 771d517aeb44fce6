"""Error analysis of a built LUT over every representable input code.

Errors are measured against the exact function saturated to the output range,
``clamp(f(x), qmin s_out, qmax s_out)`` (the best any output code can do), in output LSBs
(units of ``out_scale``) and in float. Three measurements per code x = q s_in:
  * fixed:  the integer LUT output (what the deployed model computes);
  * fake:   the exact fake counterpart round(f(x) / s_out) (what QAT computes);
  * interp: the LUT output against f at the position the hardware interpolates at
            (``x_hat``, the table index with its F fraction bits mapped back to the input axis);
            this isolates interpolation + rounding from the index quantization, and is bounded
            by ``h^2/8 max|f''| + 1 LSB`` per table (table entry and output rounding, 0.5 each).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.fake import lut_fake_codes
from quantlab.numerics.lut.functions import default_spec, get_function
from quantlab.numerics.lut.segment import SegmentLut, all_codes, evaluate_codes_int
from quantlab.numerics.lut.segments import target_values
from quantlab.numerics.lut.spec import LutSpec

BOUND_PROBES_PER_STEP = 32  # grid density for max|f''| of a table (finite differences)


@dataclass(frozen=True)
class Profile:
    """Per-code arrays (float64 numpy) over every input code, ascending."""

    codes: np.ndarray
    x: np.ndarray  # float input value
    fixed: np.ndarray  # LUT output codes
    fake: np.ndarray  # exact fake-quant output codes
    exact: np.ndarray  # f(x) saturated, in output LSB units (float)
    region: np.ndarray  # "left tail", "table i", "right tail", or "direct"
    x_hat: np.ndarray  # interpolation position (float input units; = x outside tables)


def _target_sat(lut: SegmentLut, x: Tensor) -> Tensor:
    """f(x) saturated to the output range (float64), evaluated like the table entries
    (``segments.target_values``: the same bits whatever the batch and thread count)."""
    lo = lut.out_dtype.qmin * lut.out_scale
    hi = lut.out_dtype.qmax * lut.out_scale
    y = target_values(lambda t: lut.function.target(t, lut.spec), x)
    return torch.from_numpy(y).clamp(lo, hi)


def _regions_and_positions(lut: SegmentLut, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Region label of each code, and the interpolation position x_hat in input codes
    (signed: mirrored back for negative inputs in symmetric mode)."""
    if lut.direct:
        return np.full(codes.shape, "direct", dtype=object), codes.astype(np.float64)
    fmt = lut.fmt
    f = fmt.index_frac_bits
    neg = (codes < 0) if lut.symmetric else np.zeros(codes.shape, dtype=bool)
    a = np.where(neg, np.minimum(-codes, lut.in_dtype.qmax), codes)
    d = np.asarray(lut.points, dtype=np.int64)
    region = np.empty(codes.shape, dtype=object)
    pos = a.astype(np.float64)
    i = np.clip(np.searchsorted(d, a, side="right") - 1, 0, len(d) - 2)
    in_tab = (a >= d[0]) & (a <= d[-1])
    mult = np.asarray(lut.index_mult, dtype=np.int64)[i]
    shift = np.asarray(lut.index_shift, dtype=np.int64)[i]
    idx = np.minimum(((a - d[i]) * mult) >> shift, (fmt.entries - 1) << f)
    width = (d[i + 1] - d[i]).astype(np.float64)
    hat = d[i] + idx / float((fmt.entries - 1) << f) * width
    pos = np.where(in_tab, hat, pos)
    region[:] = [f"table {k}" for k in i]
    region[a < d[0]] = "left tail"
    region[a > d[-1]] = "right tail"
    region[neg & (codes == lut.in_dtype.qmin)] = "mirror edge"  # -qmin saturates to qmax
    pos = np.where(neg, -pos, pos)
    return region, pos


def profile(lut: SegmentLut) -> Profile:
    """Evaluate every input code: fixed, fake, exact (see the module docstring)."""
    return _profile(lut)


def _profile(lut: SegmentLut) -> Profile:
    codes_t = all_codes(lut.in_dtype)
    fixed = evaluate_codes_int(lut, codes_t).numpy()
    x = codes_t.to(torch.float64) * lut.in_scale
    fake = lut_fake_codes(x, lut.func, lut.out_dtype, lut.out_scale, lut.fmt.table_round, lut.spec)
    exact = (_target_sat(lut, x) / lut.out_scale).numpy()
    codes = codes_t.numpy()
    region, pos = _regions_and_positions(lut, codes)
    return Profile(codes, x.numpy(), fixed, fake.numpy(), exact, region, pos * lut.in_scale)


def max_error_lsb(lut: SegmentLut) -> float:
    """Largest |LUT output - saturated f| over every input code, in output LSBs."""
    return _max_error_lsb(lut)


def exact_lsb(lut: SegmentLut) -> np.ndarray:
    """f(x) saturated to the output range, in output LSBs, for every input code (float64)."""
    codes = all_codes(lut.in_dtype)
    return (_target_sat(lut, codes.to(torch.float64) * lut.in_scale) / lut.out_scale).numpy()


def _max_error_lsb(lut: SegmentLut, exact: np.ndarray | None = None) -> float:
    exact = exact_lsb(lut) if exact is None else exact
    fixed = evaluate_codes_int(lut, all_codes(lut.in_dtype)).numpy()
    return float(np.abs(fixed - exact).max())


def mean_error_lsb(lut: SegmentLut, weights: np.ndarray) -> float:
    """Mean |LUT output - saturated f| in output LSBs under input-code weights (one per input
    code, ascending, e.g. ``InputHistogram.code_weights``): the error the data sees."""
    w = np.asarray(weights, dtype=np.float64)
    fixed = evaluate_codes_int(lut, all_codes(lut.in_dtype)).numpy()
    return float((w * np.abs(fixed - exact_lsb(lut))).sum() / w.sum())


def table_bounds(lut: SegmentLut) -> list[dict]:
    """Per table: width h of one step (float input units), max|f''| on the table (finite
    differences on a grid of BOUND_PROBES_PER_STEP points per step) and the bound
    ``h^2/8 max|f''|`` in float and in output LSBs."""
    if lut.direct:
        return []
    return _table_bounds(lut)


def _table_bounds(lut: SegmentLut) -> list[dict]:
    rows = []
    n = lut.fmt.entries
    for i, (d0, d1) in enumerate(zip(lut.points[:-1], lut.points[1:])):
        a, b = d0 * lut.in_scale, d1 * lut.in_scale
        h = (b - a) / (n - 1)
        m = (n - 1) * BOUND_PROBES_PER_STEP
        delta = (b - a) / m
        x = torch.linspace(a - delta, b + delta, m + 3, dtype=torch.float64)
        y = lut.function.target(x, lut.spec)
        d2 = ((y[2:] - 2 * y[1:-1] + y[:-2]) / (delta * delta)).abs()
        fpp = float(d2.max()) if bool(torch.isfinite(d2).all()) else float("inf")
        bound = h * h / 8 * fpp
        rows.append(
            {
                "region": f"table {i}",
                "h": h,
                "max_abs_f2": fpp,
                "bound": bound,
                "bound_lsb": bound / lut.out_scale,
            }
        )
    return rows


def analyze(lut: SegmentLut) -> pd.DataFrame:
    """One row per region (left tail, table i, right tail, all): input range, number of codes,
    max/mean abs error of the LUT (LSB and float), of the fake counterpart, the LUT-vs-fake gap
    (LSB), the interpolation error at x_hat and the analytic bound (tables only)."""
    p = profile(lut)
    err = np.abs(p.fixed - p.exact)
    fake_err = np.abs(p.fake - p.exact)
    gap = np.abs(p.fixed - p.fake)
    if lut.direct:
        interp = err
    else:
        xh = torch.from_numpy(p.x_hat)
        interp = np.abs(p.fixed - (_target_sat(lut, xh) / lut.out_scale).numpy())
    bounds = {r["region"]: r for r in table_bounds(lut)}
    rows = []
    order = ["left tail"] + [f"table {i}" for i in range(len(lut.points) - 1)] + ["right tail"]
    order = ["direct"] if lut.direct else order + ["mirror edge"]
    for name in order + ["all"]:
        sel = np.ones(p.codes.shape, dtype=bool) if name == "all" else (p.region == name)
        if not sel.any():
            continue
        b = bounds.get(name)
        rows.append(
            {
                "region": name,
                "x_lo": float(p.x[sel].min()),
                "x_hi": float(p.x[sel].max()),
                "codes": int(sel.sum()),
                "max_err_lsb": float(err[sel].max()),
                "mean_err_lsb": float(err[sel].mean()),
                "max_err": float(err[sel].max() * lut.out_scale),
                "mean_err": float(err[sel].mean() * lut.out_scale),
                "fake_max_err_lsb": float(fake_err[sel].max()),
                "fake_mean_err_lsb": float(fake_err[sel].mean()),
                "gap_max_lsb": float(gap[sel].max()),
                "gap_mean_lsb": float(gap[sel].mean()),
                "interp_max_err_lsb": float(interp[sel].max()),
                "bound_lsb": b["bound_lsb"] if b else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def sample_scales(
    func: str, in_dtype: DType, out_dtype: DType, spec: LutSpec | None = None
) -> tuple[float, float]:
    """(in_scale, out_scale) for a study of ``func``: the registry's ``sample_range`` and
    ``sample_out_amax`` (or max |f| on 4097 points of the range) with the J6 scale rule
    amax / ((qmax - qmin) / 2) (j6-numerics s.1)."""
    fn = get_function(func)
    spec = default_spec(func) if spec is None else spec
    lo, hi = fn.sample_range
    in_scale = max(abs(lo), abs(hi)) / ((in_dtype.qmax - in_dtype.qmin) / 2)
    if fn.sample_out_amax is not None:
        amax = fn.sample_out_amax
    else:
        x = torch.linspace(lo, hi, 4097, dtype=torch.float64)
        amax = float(fn.target(x, spec).abs().max())
    return in_scale, amax / ((out_dtype.qmax - out_dtype.qmin) / 2)
