"""Per-tensor ``Divide.BY_RECIPROCAL`` fake quant (HALF_EVEN) of a float32 tensor in one C pass.

``reciprocal(x, rf, sf, lo, hi, out)`` gives, bit for bit, what ``fake_quant_plan._reciprocal``
computes by four torch passes: ``q = fl32(x * rf)``, rounded half to even, clamped to the
integer code bounds [lo, hi], then ``fl32(q * sf) + 0`` (code -0 -> +0); NaN stays NaN. The C
loop (``quantlab.numerics.native``) does the same float32 product, a clamp to the integer
bounds before rounding (the bounds are integers and rounding is monotone, so clamping first or
last gives the same code, and NaN passes both), the half-to-even rounding of |q| <= 2**16 by
adding and subtracting 1.5 * 2**23 (exact: the sum lies where floats are the integers, and the
subtraction is exact), and the same product and sum. Its loop is compiled for AVX-512, for
AVX2 and for the baseline on x86-64 and chosen at load; the tests check all three against the
torch passes.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from quantlab.numerics import native

MAX_CODE = 1 << 16  # the rounding's bound on |q| (module docstring)

SOURCE = (
    native.PRELUDE
    + r"""
/* y may be x (in place): each element is read before it is written, no other dependence */
CLONES void fq_block(const float *x, float *y, int64_t n, float rf, float sf, float lo,
                     float hi) {
  #pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] = round_clamped(x[j] * rf, lo, hi) * sf + 0.0f;
}

/* one equal run per thread (a multiple of 16 values), as torch splits an elementwise op's
   output, so that each thread reads what its core just wrote */
void fq_reciprocal(const float *x, float *y, int64_t n, float rf, float sf, float lo, float hi,
                   int threads) {
  const int64_t run = ((n + threads - 1) / threads + 15) / 16 * 16;
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int i = 0; i < threads; ++i) {
    const int64_t start = i * run < n ? i * run : n;
    const int64_t len = n - start < run ? n - start : run;
    fq_block(x + start, y + start, len, rf, sf, lo, hi);
  }
}
"""
)


def configure(lib: ctypes.CDLL) -> None:
    """Set the argument types of the kernels in ``lib``."""
    f32 = ctypes.c_float
    lib.fq_reciprocal.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.fq_reciprocal.argtypes += [f32, f32, f32, f32, ctypes.c_int]
    lib.fq_reciprocal.restype = None


KERNELS = native.Kernels("fake_quant", SOURCE, configure, "fake quant")


def reciprocal(
    x: Tensor, rf: float, sf: float, lo: int, hi: int, out: Tensor | None = None
) -> Tensor | None:
    """The BY_RECIPROCAL HALF_EVEN fake quant of ``x`` (module docstring) into ``out`` (may be
    ``x``; else a new tensor), or None where the C pass does not apply (not a contiguous
    float32 CPU tensor, code bounds beyond 2**16, no kernel). A pass of any size: a C call
    costs less than the four torch passes even on one value (a second thread from 2**15
    values on, where torch runs more than one)."""
    if (
        x.dtype != torch.float32
        or not x.is_cpu
        or not x.is_contiguous()
        or abs(lo) > MAX_CODE
        or abs(hi) > MAX_CODE
    ):
        return None
    lib = KERNELS.lib()
    if lib is None:
        return None
    with torch._C.DisableTorchFunction():
        y = torch.empty_like(x) if out is None else out
        n = x.numel()
        threads = min(torch.get_num_threads(), n >> 14) or 1
        lib.fq_reciprocal(x.data_ptr(), y.data_ptr(), n, rf, sf, lo, hi, threads)
        return y
