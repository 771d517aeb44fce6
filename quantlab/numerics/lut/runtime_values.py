"""Direct-table entries as ONNX Runtime computes them (``TableValues.RUNTIME_FLOAT32``): the
exporter writes a table op as DequantizeLinear -> float op(s) -> QuantizeLinear, which
onnxruntime evaluates on each code in float32. For every input code q:

    x = fl32(s_in * (q - z_in))                  DequantizeLinear
    y = the float32 op(s) on x                   ``runtime_float32``
    T[q] = sat(rne(fl32(y / s_out)) + z_out)     QuantizeLinear

The float ops, as the exported graph computes them (no domain clamps, no LutSpec floors):
  * tanh, sigmoid, exp, erf, gelu: MLAS's float32 kernels (``numerics.mlas_float32``; gelu:
    the AVX-512F kernel, whose bits onnxruntime 1.32 also gives on CPUs with AVX2 / FMA3 and
    no AVX-512F; on others it computes gelu another way: the tests hold it to one code there);
  * silu: Sigmoid then Mul, fl32(x * logistic(x));
  * hardsigmoid: HardSigmoid(alpha = fl32(1/6), beta = 0.5), min(max(fl32(fl32(alpha x) +
    beta), 0), 1) (a product and a sum, each rounded: no fused multiply-add); hardswish:
    HardSwish, fl32(x * hardsigmoid(x)); leaky_relu: LeakyRelu, x >= 0 ? x : fl32(alpha x),
    alpha = fl32(negative_slope);
  * sqrt, reciprocal, rsqrt (Sqrt then Reciprocal): IEEE float32 operations (each formed in
    float64 and rounded once, which is correctly rounded for them): NaN below 0, 1/0 = inf;
  * log, sin, cos: Eigen's vectorized float32 forms (``numerics.eigen_float32``; log: NaN
    below 0, -inf at 0), which onnxruntime's Log / Sin / Cos compute on all but the last
    (n mod 4) elements of a tensor (those take the C library's, which can differ in the last
    bit);
  * inverse_sigmoid: the exporter's Clip(x, eps), Sub(1, x), Clip(eps), Div, Log: x1 =
    max(x, e), x2 = max(fl32(1 - x), e), fl32(x1 / x2), then Eigen's log (e = fl32(eps));
  * elu: Elu(alpha = fl32(alpha)), x >= 0 ? x : fl32(alpha fl32(exp(x) - 1)), and softplus:
    Softplus (beta 1), x > 0 ? fl32(x + log1p(exp(-x))) : log1p(exp(x)), exp and log1p Eigen's
    vectorized forms (``numerics.eigen_float32``), with the same caveat for the last (n mod 4)
    elements as log; a softplus with another beta or a threshold below 15, which ONNX's
    Softplus cannot express (the exporter refuses it), torch's float64 function rounded to
    float32;
  * pow: Pow with a scalar exponent e = fl32(exponent): fl32(x * x) for e = 2, fl32(fl32(x *
    x) * x) for e = 3, the C library's powf otherwise (onnxruntime calls std::pow; measured
    bit-identical on x86-64 Linux, where both use the system's libm).
QuantizeLinear maps NaN to the lowest code (``QuantizeCast.NAN_TO_LOWEST``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.eigen_float32 import eigen_cos, eigen_exp, eigen_log, eigen_log1p, eigen_sin
from quantlab.numerics.ieee32 import sqrt32
from quantlab.numerics.lut.functions import get_function, softplus_in_onnx
from quantlab.numerics.lut.spec import LutSpec
from quantlab.numerics.mlas_float32 import mlas_erf, mlas_exp, mlas_gelu, mlas_logistic, mlas_tanh
from quantlab.numerics.quantize import QuantizeCast, dequantize, quantize
from quantlab.numerics.rounding import Round


def _silu(x: Tensor, spec: LutSpec) -> Tensor:
    return x * mlas_logistic(x)


HARDSIGMOID_ALPHA = torch.tensor(1.0 / 6.0, dtype=torch.float32)  # the exporter's attribute


def _hardsigmoid(x: Tensor, spec: LutSpec) -> Tensor:
    return (x * HARDSIGMOID_ALPHA + 0.5).clamp(0.0, 1.0)  # float32 tensor ops: IEEE, unfused


def _hardswish(x: Tensor, spec: LutSpec) -> Tensor:
    return x * _hardsigmoid(x, spec)


def _leaky_relu(x: Tensor, spec: LutSpec) -> Tensor:
    alpha = torch.tensor(spec.negative_slope, dtype=torch.float32)
    return torch.where(x >= 0, x, x * alpha)


def _elu(x: Tensor, spec: LutSpec) -> Tensor:
    alpha = torch.tensor(spec.alpha, dtype=torch.float32)
    return torch.where(x >= 0, x, alpha * (eigen_exp(x) - 1.0))


def _softplus(x: Tensor, spec: LutSpec) -> Tensor:
    if not softplus_in_onnx(spec.beta, spec.threshold):
        # no ONNX counterpart (the exporter refuses it): the function itself
        return get_function("softplus").target(x.to(torch.float64), spec).to(torch.float32)
    return torch.where(x > 0, x + eigen_log1p(eigen_exp(-x)), eigen_log1p(eigen_exp(x)))


def _inverse_sigmoid(x: Tensor, spec: LutSpec) -> Tensor:
    eps = torch.tensor(spec.eps, dtype=torch.float32)
    x1 = torch.maximum(x, eps)
    x2 = torch.maximum(1.0 - x, eps)  # float32 tensor ops: each IEEE-rounded
    return eigen_log(x1 / x2)


@lru_cache(maxsize=1)
def _libm_powf():
    lib = ctypes.CDLL(ctypes.util.find_library("m"))
    powf = lib.powf
    powf.restype, powf.argtypes = ctypes.c_float, (ctypes.c_float, ctypes.c_float)
    return powf


def _pow(x: Tensor, spec: LutSpec) -> Tensor:
    e = float(torch.tensor(spec.exponent, dtype=torch.float32))
    if e == 2.0:
        return x * x
    if e == 3.0:
        return x * x * x
    powf = _libm_powf()
    y = [powf(v, e) for v in x.reshape(-1).tolist()]  # float32 in and out: exact conversions
    return torch.tensor(y, dtype=torch.float32).reshape(x.shape)


def _rounded(op):
    """``op`` formed in float64 and rounded once to float32: the IEEE float32 operation for
    a reciprocal (float64 has more than 2 * 24 + 2 significand bits)."""
    return lambda x, spec: op(x.to(torch.float64)).to(torch.float32)


def _sqrt(x: Tensor, spec: LutSpec) -> Tensor:
    """The correctly rounded float32 square root (``numerics.ieee32.sqrt32``: torch's float64
    sqrt is itself off by an ulp now and then on some builds)."""
    return sqrt32(x.to(torch.float32))


def _rsqrt(x: Tensor, spec: LutSpec) -> Tensor:
    if spec.eps:
        x = x + spec.eps
    return _rounded(torch.reciprocal)(_sqrt(x, spec), spec)


_KERNELS = {
    "tanh": lambda x, spec: mlas_tanh(x),
    "sigmoid": lambda x, spec: mlas_logistic(x),
    "exp": lambda x, spec: mlas_exp(x),
    "erf": lambda x, spec: mlas_erf(x),
    "gelu": lambda x, spec: mlas_gelu(x),
    "silu": _silu,
    "hardsigmoid": _hardsigmoid,
    "hardswish": _hardswish,
    "leaky_relu": _leaky_relu,
    "elu": _elu,
    "softplus": _softplus,
    "sqrt": _sqrt,
    "reciprocal": _rounded(torch.reciprocal),
    "rsqrt": _rsqrt,
    "log": lambda x, spec: eigen_log(x),
    "sin": lambda x, spec: eigen_sin(x),
    "cos": lambda x, spec: eigen_cos(x),
    "inverse_sigmoid": _inverse_sigmoid,
    "pow": _pow,
}


def runtime_float32(func: str, x: Tensor, spec: LutSpec) -> Tensor:
    """float32 ``func`` of float32 ``x`` as onnxruntime evaluates the exporter's ops for it
    (module doc)."""
    kernel = _KERNELS.get(func)
    if kernel is not None:
        return kernel(x, spec)
    return get_function(func).target(x.to(torch.float64), spec).to(torch.float32)


def runtime_codes(func: str, spec: LutSpec, codes: Tensor, in_scale, in_zero_point: int,
                  out_dtype: DType, out_scale, out_zero_point: int) -> Tensor:  # fmt: skip
    """int64 output codes of integer input ``codes`` as onnxruntime computes each (module
    doc; scales as float32)."""
    x = dequantize(codes, torch.tensor(in_scale, dtype=torch.float32), zero_point=in_zero_point)
    y = runtime_float32(func, x, spec)
    so = torch.tensor(out_scale, dtype=torch.float32)
    codes = quantize(
        y,
        so,
        out_dtype,
        Round.HALF_EVEN,
        zero_point=out_zero_point,
        cast=QuantizeCast.NAN_TO_LOWEST,
    )
    return codes.to(torch.int64)
