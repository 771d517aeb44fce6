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

``binary(op, x, other, rf, sf, lo, hi)`` fuses the sum or product before it: ``fq(x + other)``
or ``fq(x * other)``, the sum or product one float32 operation as torch's CPU kernel computes
it (``add`` with no ``alpha`` is ``a + b`` rounded once; a Python number enters as its float32
value, as torch's opmath does), ``other`` a float32 tensor that broadcasts to ``x`` over
leading dims or a number. So one pass replaces the op's pass and the fake quant's.
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

/* thread i's run [*start, *end) of n values: one equal run per thread (a multiple of 16
   values), as torch splits an elementwise op's output, so that each thread reads what its core
   just wrote */
static inline void thread_run(int i, int threads, int64_t n, int64_t *start, int64_t *end) {
  const int64_t run = ((n + threads - 1) / threads + 15) / 16 * 16;
  *start = i * run < n ? i * run : n;
  *end = n - *start < run ? n : *start + run;
}

void fq_reciprocal(const float *x, float *y, int64_t n, float rf, float sf, float lo, float hi,
                   int threads) {
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int i = 0; i < threads; ++i) {
    int64_t start, end;
    thread_run(i, threads, n, &start, &end);
    fq_block(x + start, y + start, end - start, rf, sf, lo, hi);
  }
}

/* y = fq(x + b) or fq(x * b) over one run, b read along it (restrict: y is a new tensor; x
   and b are only read) */
CLONES static void fq_add_run(const float *restrict x, const float *restrict b,
                              float *restrict y, int64_t n, float rf, float sf, float lo,
                              float hi) {
  for (int64_t j = 0; j < n; ++j) y[j] = round_clamped((x[j] + b[j]) * rf, lo, hi) * sf + 0.0f;
}

CLONES static void fq_mul_run(const float *restrict x, const float *restrict b,
                              float *restrict y, int64_t n, float rf, float sf, float lo,
                              float hi) {
  for (int64_t j = 0; j < n; ++j) y[j] = round_clamped((x[j] * b[j]) * rf, lo, hi) * sf + 0.0f;
}

CLONES static void fq_add_scalar_run(const float *restrict x, float c, float *restrict y,
                                     int64_t n, float rf, float sf, float lo, float hi) {
  for (int64_t j = 0; j < n; ++j) y[j] = round_clamped((x[j] + c) * rf, lo, hi) * sf + 0.0f;
}

CLONES static void fq_mul_scalar_run(const float *restrict x, float c, float *restrict y,
                                     int64_t n, float rf, float sf, float lo, float hi) {
  for (int64_t j = 0; j < n; ++j) y[j] = round_clamped((x[j] * c) * rf, lo, hi) * sf + 0.0f;
}

/* y[i] = fq(x[i] op b[i mod nb]) for i < n (nb divides n), or fq(x[i] op c) where b is NULL;
   op 0 adds, 1 multiplies; each thread its thread_run */
void fq_binary(const float *x, const float *b, int64_t nb, float c, int op, float *y,
               int64_t n, float rf, float sf, float lo, float hi, int threads) {
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int i = 0; i < threads; ++i) {
    int64_t at, end;
    thread_run(i, threads, n, &at, &end);
    if (b == 0) {
      if (op == 0)
        fq_add_scalar_run(x + at, c, y + at, end - at, rf, sf, lo, hi);
      else
        fq_mul_scalar_run(x + at, c, y + at, end - at, rf, sf, lo, hi);
      continue;
    }
    while (at < end) {
      const int64_t off = at % nb;
      const int64_t len = end - at < nb - off ? end - at : nb - off;
      if (op == 0)
        fq_add_run(x + at, b + off, y + at, len, rf, sf, lo, hi);
      else
        fq_mul_run(x + at, b + off, y + at, len, rf, sf, lo, hi);
      at += len;
    }
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
    i64, p = ctypes.c_int64, ctypes.c_void_p
    lib.fq_binary.argtypes = [p, p, i64, f32, ctypes.c_int, p, i64, f32, f32, f32, f32]
    lib.fq_binary.argtypes += [ctypes.c_int]
    lib.fq_binary.restype = None


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
        threads = _threads(n)
        lib.fq_reciprocal(x.data_ptr(), y.data_ptr(), n, rf, sf, lo, hi, threads)
        return y


def _threads(n: int) -> int:
    """Threads for a pass over ``n`` values: torch's count, a second one from 2**15 values on
    (where torch runs more than one)."""
    return min(torch.get_num_threads(), n >> 14) or 1


_OPS = {"add": 0, "mul": 1}
_EXACT_INT = 1 << 24  # an int of smaller magnitude is its own float32 value


def binary(
    op: str, x: Tensor, other: Tensor | float, rf: float, sf: float, lo: int, hi: int
) -> Tensor | None:
    """``fq(x + other)`` (op "add") or ``fq(x * other)`` (op "mul") in one C pass, a new
    float32 tensor of ``x``'s shape: the same bits as torch's op (no ``alpha``) followed by
    ``reciprocal``'s fake quant (module docstring). ``other``: a float32 tensor that
    broadcasts to ``x`` over leading dims (its shape, leading ones aside, is the trailing
    dims of ``x``'s), or a Python float or int (below 2**24 in magnitude). None where the pass
    does not apply (then nothing was computed): both operands plain (not subclassed)
    contiguous float32 CPU tensors without gradient, code bounds within 2**16."""
    if (
        type(x) is not Tensor
        or x.dtype != torch.float32
        or not x.is_cpu
        or not x.is_contiguous()
        or x.requires_grad
        or abs(lo) > MAX_CODE
        or abs(hi) > MAX_CODE
    ):
        return None
    b, c = None, 0.0
    if type(other) is Tensor:
        if (
            other.dtype != torch.float32
            or not other.is_cpu
            or not other.is_contiguous()
            or other.requires_grad
            or not _broadcasts_over_leading(other.shape, x.shape)
        ):
            return None
        b = other
    elif type(other) is float or (type(other) is int and abs(other) < _EXACT_INT):
        c = float(other)
    else:
        return None
    lib = KERNELS.lib()
    if lib is None:
        return None
    with torch._C.DisableTorchFunction():
        y = torch.empty(x.shape, dtype=torch.float32)
        n = x.numel()
        if n == 0:
            return y
        threads = _threads(n)
        nb = 1 if b is None else max(b.numel(), 1)
        lib.fq_binary(
            x.data_ptr(), None if b is None else b.data_ptr(), nb, c, _OPS[op], y.data_ptr(),
            n, rf, sf, lo, hi, threads,
        )  # fmt: skip
        return y


def _broadcasts_over_leading(small: torch.Size, full: torch.Size) -> bool:
    """Whether a tensor of shape ``small`` broadcast to ``full`` repeats its values in order:
    ``small`` without its leading ones is the trailing dims of ``full`` (and no longer)."""
    k = 0
    while k < len(small) and small[k] == 1:
        k += 1
    tail = tuple(small[k:])
    return len(small) <= len(full) and tuple(full[len(full) - len(tail) :]) == tail
