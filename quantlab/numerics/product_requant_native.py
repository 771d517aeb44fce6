"""``product_requant.requantize_product`` in one C pass, for contiguous CPU codes.

``requantize_product`` forms out = clamp(round(((x - zx) * (y - zy)) * m), lo, hi) + zo by
seven torch passes in its form's float dtype. Every step there is one IEEE operation: the codes
and their differences are exact, the product of the centred codes is exact by the bound the
caller proved (``ProductForm``), ``* m`` rounds once, and the rounding is either floor(. + 1/2)
(``half_up``: the sum rounds once) or half to even (torch's ``round``). The C loop
(``quantlab.numerics.native``: no fast-math, no contraction) does the same operations in the
same order in the same dtype (float or double), C's ``floor`` / ``rint`` being those roundings
(``rint`` in the default rounding mode is half to even), then the clamp, the zero point and the
conversion of an integer-valued float to the output dtype, which is exact. The bits are
therefore those of the torch passes; the tests check them on random and extreme codes.

It covers int8 / int16 codes and outputs, y a tensor that either has the output's shape or
repeats along its leading dims (``pair_table_native.repeat_shape``; either operand may be the
repeating one) or one integer, and the forms ``product_form`` makes with these roundings
(float32 or float64 half to even, float64 floor(. + 1/2)). ``requantize_product_native``
declines (None) anything else, and the torch passes serve it. The loop is compiled for AVX-512,
for AVX2 and for the baseline and chosen at load; OpenMP on torch's intra-op thread count, each
thread a contiguous share of the output.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from quantlab.numerics import native
from quantlab.numerics.dtypes import DType
from quantlab.numerics.pair_table_native import repeat_shape
from quantlab.numerics.rounding import Round

MIN_ELEMENTS = 1  # one C call beats the torch passes at every size (empty: torch)

_CODES = {torch.int8: "i8", torch.int16: "i16"}
_C_TYPES = {"i8": "int8_t", "i16": "int16_t"}
_FLOATS = {torch.float32: "f32", torch.float64: "f64"}


def _kernel(tx: str, ty: str, to: str, f: str, half_up: bool) -> str:
    """C of one kernel: codes tx, ty -> to, computed in f, rounded half up or half to even."""
    name = _name(tx, ty, to, f, half_up)
    ft = "float" if f == "f32" else "double"
    sfx = "f" if f == "f32" else ""
    rnd = f"floor{sfx}(v + 0.5{sfx})" if half_up else f"rint{sfx}(v)"
    X, Y, O = _C_TYPES[tx], _C_TYPES[ty], _C_TYPES[to]  # noqa: N806 (C type names)
    return f"""
CLONES static void seg_{name}(const {X} *restrict x, const {Y} *restrict y, {ft} zx, {ft} zy,
                              {ft} yc, {ft} m, {ft} lo, {ft} hi, {ft} zo, {O} *restrict out,
                              int64_t len) {{
  if (y) {{
    for (int64_t j = 0; j < len; ++j) {{
      {ft} v = ((({ft})x[j] - zx) * (({ft})y[j] - zy)) * m;
      v = {rnd};
      v = v < lo ? lo : v;
      v = v > hi ? hi : v;
      out[j] = ({O})(v + zo);
    }}
  }} else {{
    for (int64_t j = 0; j < len; ++j) {{
      {ft} v = ((({ft})x[j] - zx) * yc) * m;
      v = {rnd};
      v = v < lo ? lo : v;
      v = v > hi ? hi : v;
      out[j] = ({O})(v + zo);
    }}
  }}
}}

/* out[i] for i in [0, n): x[i % nx] with y[i % ny] (or the integer yc when y is NULL) */
void {name}(const {X} *x, int64_t nx, const {Y} *y, int64_t ny, double zx, double zy,
            double yc, double m, double lo, double hi, double zo, {O} *out, int64_t n,
            int threads) {{
  #pragma omp parallel num_threads(threads)
  {{
    const int64_t t = omp_get_thread_num(), k = omp_get_num_threads();
    const int64_t end = (t + 1) * n / k;
    int64_t i = t * n / k, jx = i % nx, jy = y ? i % ny : 0;
    while (i < end) {{  /* runs along which both operands advance by one */
      int64_t len = end - i;
      if (nx - jx < len) len = nx - jx;
      if (y && ny - jy < len) len = ny - jy;
      seg_{name}(x + jx, y ? y + jy : 0, ({ft})zx, ({ft})zy, ({ft})yc, ({ft})m, ({ft})lo,
                 ({ft})hi, ({ft})zo, out + i, len);
      i += len;
      jx += len;
      if (jx == nx) jx = 0;
      if (y) {{
        jy += len;
        if (jy == ny) jy = 0;
      }}
    }}
  }}
}}
"""


def _name(tx: str, ty: str, to: str, f: str, half_up: bool) -> str:
    return f"prq_{tx}_{ty}_{to}_{f}_{'hu' if half_up else 'he'}"


# the forms product_form makes: float32 or float64 half to even, float64 floor(. + 1/2)
_FORMS = (("f32", False), ("f64", False), ("f64", True))
_VARIANTS = [
    (tx, ty, to, f, hu) for tx in _C_TYPES for ty in _C_TYPES for to in _C_TYPES for f, hu in _FORMS
]

_SOURCE = (
    native.PRELUDE
    + r"""
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
static int omp_get_num_threads(void) { return 1; }
#endif
"""
    + "".join(_kernel(*v) for v in _VARIANTS)
)


def configure(lib: ctypes.CDLL) -> None:
    """Set the argument types of the kernels in ``lib``."""
    p, i64, d = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
    for v in _VARIANTS:
        fn = getattr(lib, _name(*v))
        fn.argtypes = [p, i64, p, i64, d, d, d, d, d, d, d, p, i64, ctypes.c_int]
        fn.restype = None


KERNELS = native.Kernels("product_requant", _SOURCE, configure, "product requantization")


def requantize_product_native(
    x: Tensor,
    zx: int,
    y: Tensor | int,
    zy: int,
    form: object,
    out: DType,
    zero_point: int = 0,
) -> Tensor | None:
    """``requantize_product(x, zx, y, zy, form, out, zero_point)`` by the C pass (the same
    codes; ``form``: a ``product_requant.ProductForm``), or None where it does not apply
    (module docstring; no outputs, another dtype or rounding, strided
    codes, no kernel)."""
    f = _FLOATS.get(form.dtype)
    to = _CODES.get(out.torch_dtype)
    tx = _CODES.get(x.dtype)
    if f is None or to is None or tx is None or x.device.type != "cpu" or not x.is_contiguous():
        return None
    if (f, form.half_up) not in _FORMS or not (form.half_up or form.rounding is Round.HALF_EVEN):
        return None
    if isinstance(y, Tensor) and y.dim():
        ty = _CODES.get(y.dtype)
        if ty is None or y.device.type != "cpu" or not y.is_contiguous():
            return None
        shape = repeat_shape(x, y)
        if shape is None:
            return None
        if x.numel() < y.numel():  # the product commutes exactly: x the full operand
            x, zx, y, zy, tx, ty = y, zy, x, zx, ty, tx
        yc = 0.0
    else:
        shape, ty, yc = tuple(x.shape), tx, float(int(y) - zy)
    n = x.numel()
    if n < MIN_ELEMENTS:
        return None
    lib = KERNELS.lib()
    if lib is None:
        return None
    with torch._C.DisableTorchFunction():  # not the model's ops
        result = torch.empty(shape, dtype=out.torch_dtype)
        threads = max(1, min(torch.get_num_threads(), n >> 14))
        fn = getattr(lib, _name(tx, ty, to, f, form.half_up))
        y_ptr, ny = (y.data_ptr(), y.numel()) if isinstance(y, Tensor) and y.dim() else (None, 1)
        lo, hi = out.qmin - zero_point, out.qmax - zero_point
        fn(
            x.data_ptr(), n, y_ptr, ny, float(zx), float(zy), yc, form.multiplier,
            float(lo), float(hi), float(zero_point), result.data_ptr(), n, threads,
        )  # fmt: skip
        return result
