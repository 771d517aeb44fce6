"""Reference of the look-up tables on codes with zero points
(``quantlab.numerics.lut.zero_point``): every output computed on its own from the definition.

Direct mode: f((x - zx) s_in) in float64 (the product is exact: |x - zx| < 2**9 and a float32
scale), the float64 quotient by s_out, rounded with the reference's exact rational rounding,
plus zo, saturated. Segment mode: the segment reference (``evaluate_lut``) on x - zx, plus zo,
saturated.

RUNTIME_FLOAT32 tables: each entry from onnxruntime's float32 steps (float32 scales), every
rounding on exact rationals: fl32(s_in (x - zx)); tanh / sigmoid / exp / gelu by MLAS's twin
(``reference.mlas_float32``), log, sin, cos, and the exp and log1p of elu and softplus by
Eigen's (``reference.eigen_float32``), silu as
fl32(x * logistic(x)), reciprocal and the steps of rsqrt exactly rounded (sqrt from float64's
correctly rounded root), the other functions torch's float64 function rounded to float32;
fl32(y / s_out) rounded half to even, plus zo, saturated; NaN to the lowest code.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch
from torch import Tensor

from quantlab.numerics.lut.formats import TableValues
from quantlab.numerics.lut.functions import get_function, softplus_in_onnx
from quantlab.numerics.reference.eigen_float32 import (
    eigen_exp_value,
    eigen_log1p_value,
    eigen_log_value,
    eigen_sincos_value,
)
from quantlab.numerics.reference.lut import evaluate_lut
from quantlab.numerics.reference.mlas_float32 import mlas_value, to_float32
from quantlab.numerics.reference.rounding import round_fraction
from quantlab.numerics.rounding import Round


def evaluate_zero_point_lut(zlut, codes: Tensor) -> Tensor:
    """Output codes (``zlut.out_dtype``'s torch dtype) of input ``codes`` (integer tensor of
    ``zlut.in_dtype`` codes); same contract as ``ZeroPointLut.evaluate``."""
    x = codes.reshape(-1).to(torch.int64).numpy()
    lo, hi = zlut.out_dtype.qmin, zlut.out_dtype.qmax
    if zlut.fmt.values is TableValues.RUNTIME_FLOAT32:
        out = {c: _runtime_entry(zlut, c) for c in np.unique(x).tolist()}
        y = np.array([out[c] for c in x.tolist()], dtype=np.int64)
    elif zlut.direct:
        fn = get_function(zlut.func)
        out = {}
        for c in np.unique(x).tolist():
            arg = torch.tensor([(c - zlut.in_zero_point) * zlut.in_scale], dtype=torch.float64)
            y = float(fn.target(arg, zlut.spec)[0])
            q = float(np.float64(y) / np.float64(zlut.out_scale))
            code = round_fraction(Fraction(q), zlut.fmt.table_round) + zlut.out_zero_point
            out[c] = min(max(code, lo), hi)
        y = np.array([out[c] for c in x.tolist()], dtype=np.int64)
    else:
        centred = torch.from_numpy(x - zlut.in_zero_point).to(zlut.lut.in_dtype.torch_dtype)
        y = evaluate_lut(zlut.lut, centred).to(torch.int64).numpy() + zlut.out_zero_point
        y = np.clip(y, lo, hi)
    return torch.from_numpy(y.reshape(tuple(codes.shape))).to(zlut.out_dtype.torch_dtype)


_MLAS = {"tanh": "tanh", "sigmoid": "logistic", "exp": "exp", "gelu": "gelu"}


def _runtime_value(func: str, spec, x: float) -> float:
    """float32 ``func`` of the float32 value ``x`` as onnxruntime computes it (module doc)."""
    if func in _MLAS:
        return mlas_value(_MLAS[func], x)
    if func == "silu":
        return to_float32(Fraction(x) * Fraction(mlas_value("logistic", x)))
    if func in ("hardsigmoid", "hardswish"):
        alpha = Fraction(to_float32(Fraction(1, 6)))
        h = min(max(to_float32(Fraction(to_float32(alpha * Fraction(x))) + Fraction(1, 2)), 0), 1)
        return h if func == "hardsigmoid" else to_float32(Fraction(x) * Fraction(h))
    if func == "leaky_relu":
        return x if x >= 0 else to_float32(Fraction(to_float32(Fraction(spec.negative_slope))) * x)
    if func == "elu":
        if x >= 0:
            return x
        alpha = Fraction(to_float32(Fraction(spec.alpha)))
        return to_float32(alpha * Fraction(to_float32(Fraction(eigen_exp_value(x)) - 1)))
    if func == "softplus" and softplus_in_onnx(spec.beta, spec.threshold):
        if x > 0:
            return to_float32(Fraction(x) + Fraction(eigen_log1p_value(eigen_exp_value(-x))))
        return eigen_log1p_value(eigen_exp_value(x))
    if func == "reciprocal":
        return math.copysign(math.inf, x) if x == 0 else to_float32(1 / Fraction(x))
    if func in ("sqrt", "rsqrt"):
        if func == "rsqrt" and spec.eps:
            x = to_float32(Fraction(x) + Fraction(spec.eps))
        if x < 0:
            return math.nan
        r = to_float32(Fraction(math.sqrt(x)))  # float64's root is correctly rounded
        if func == "sqrt":
            return r
        return math.inf if r == 0 else to_float32(1 / Fraction(r))
    if func == "log":
        return eigen_log_value(x)
    if func in ("sin", "cos"):
        return eigen_sincos_value(x, sine=func == "sin")
    arg = torch.tensor([x], dtype=torch.float64)
    return to_float32(Fraction(float(get_function(func).target(arg, spec)[0])))


def _runtime_entry(zlut, c: int) -> int:
    """The output code of input code ``c`` of a RUNTIME_FLOAT32 table."""
    lo, hi = zlut.out_dtype.qmin, zlut.out_dtype.qmax
    s_in, s_out = (Fraction(float(np.float32(s))) for s in (zlut.in_scale, zlut.out_scale))
    x = to_float32(Fraction(c - zlut.in_zero_point) * s_in)
    y = _runtime_value(zlut.func, zlut.spec, x)
    if math.isnan(y):
        return lo
    if math.isinf(y):
        return hi if y > 0 else lo
    q = to_float32(Fraction(y) / s_out)
    if math.isinf(q):
        return hi if q > 0 else lo
    code = round_fraction(Fraction(q), Round.HALF_EVEN) + zlut.out_zero_point
    return min(max(code, lo), hi)
