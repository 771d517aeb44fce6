"""The fast forms of requantization in one C pass over the exact GEMM sums
(``finish.finish_gemm``): each reads the sums (int32, int64, or float32/float64 holding exact
integers) and writes the output codes (int8, uint8 or int16) and, when asked, their float32
values ``fl32((code - zero_point) * scale)`` (``fixed_common.emit``'s product) in the same pass.

``requantize_shift``: the multiply-and-shift form (gemmlowp's, the J6's)
``clamp(floor((acc * q + offset) / 2**n), lo, hi)``, per channel ``q`` (0 <= q < 2**31), ``n``
(1 <= n <= 62) and ``offset`` (int64). The product and the sum are int64 and exact because the
caller guarantees ``|acc * q + offset| < 2**63`` (``finish_gemm`` has |acc| + |bias| < 2**31,
or |acc| <= 2**31 after the accumulator contract, with q < 2**31 and |offset| <= |bias| * q +
2**61); the floor division by ``2**n`` is ``((v + 2**63) >> n) - 2**(63 - n)`` on the unsigned
representation (C's shift of a negative signed value is implementation-defined; this one is
not); a float sum converts exactly through int32, being an integer below 2**31 in magnitude.

``requantize_rescale``: the float32 form (ONNX Runtime's QLinearConv, ``rescale32``)
``clamp(round_half_even(fl32(fl32(acc + b) * m)) + z, lo, hi)``, per channel float32 ``m`` and
``b``. The caller guarantees |acc| <= 2**24 (or a float32 acc) and float32 bias codes
(``rescale32.exact_bound``), so ``fl32(acc)`` is exact and ``+ b`` and ``* m`` are the same two
IEEE float32 operations (no contraction, no fast-math: ``native``); the clamp to the integer
bounds ``[lo - z, hi - z]`` comes before the rounding (monotone: the same code) and the
rounding adds and subtracts 1.5 * 2**23.

Both clamp to integer bounds with lo <= hi before storing the code. The loops are compiled for
x86-64-v4 (AVX-512 with DQ, by GCC) or AVX-512F, for AVX2 and for the baseline, on x86-64 and
chosen at load; tests check the loaded build, the baseline and the code a CPU with AVX2 and no
AVX-512 runs against the torch forms and the numpy reference on random and adversarial sums.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from quantlab.numerics import native

_IN = {torch.int32: "i32", torch.int64: "i64", torch.float32: "f32", torch.float64: "f64"}
_OUT = {torch.int8: "i8", torch.uint8: "u8", torch.int16: "i16"}
_C_IN = {"i32": "int32_t", "i64": "int64_t", "f32": "float", "f64": "double"}
_C_OUT = {"i8": "int8_t", "u8": "uint8_t", "i16": "int16_t"}
BLOCK = 16384  # elements per parallel task

# x86-64-v4 (AVX-512 F, BW, DQ, VL) has the int64 products and the float-to-int64 conversions in
# vector lanes (three to five times the AVX-512F clone's speed here); GCC 11 and later name it.
# AVX2 has no int64 product, but a sum of at most 32 bits times q (< 2**31) is a product of
# two int32 values, which it computes in vector lanes (vpmuldq): the shift loops' AVX2 clone
# took 0.44 ms against the baseline's 1.66 ms on 1.2M int32 sums in rows of one channel
# (2 threads, AMD EPYC). With a channel per value the loop reads back = 2**(63 - n) per
# channel: GCC vectorizes no shift of a constant by a lane's count, and computing it there
# kept the whole loop scalar (1.18 ms against 0.42 ms now on 1.2M sums in rows of 384
# channels). Under QL_ONLY_AVX2 (tests) each loop is built as a CPU with AVX2 and no AVX-512
# would run it.
_CLONES = r"""
#if defined(__x86_64__) && defined(__GNUC__) && (defined(QL_NO_CLONES) || defined(QL_ONLY_AVX2))
#define CLONES_SHIFT CLONES
#define CLONES_RESCALE CLONES
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define CLONES_SHIFT __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#define CLONES_RESCALE __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#elif defined(__x86_64__) && defined(__GNUC__)
#define CLONES_SHIFT CLONES
#define CLONES_RESCALE CLONES
#else
#define CLONES_SHIFT
#define CLONES_RESCALE
#endif
"""

_TEMPLATE = r"""
/* one row of a channel: its q, offset and shift fixed */
CLONES_SHIFT static void requant_rows_IN_OUT(const CIN *a, COUT *c, float *y, int64_t len,
                                          int64_t q, int64_t off, uint64_t n, int64_t back,
                                          int64_t lo, int64_t hi, float s) {
  const uint64_t sign = (uint64_t)1 << 63;
  const FACTOR qq = (FACTOR)q;
  #pragma omp simd
  for (int64_t j = 0; j < len; ++j) {
    int64_t v = (int64_t)WIDEN(a[j]) * (int64_t)qq + off;
    int64_t r = (int64_t)(((uint64_t)v ^ sign) >> n) - back;
    r = r < lo ? lo : r;
    r = r > hi ? hi : r;
    const int32_t code = (int32_t)r;
    c[j] = (COUT)code;
    if (y) y[j] = (float)code * s;
  }
}

/* one outer index of a tensor whose last axis is the channel axis: q, offset, shift and
   back = 2**(63 - n) per value (given, not computed: GCC vectorizes no shift of a constant by
   a lane's count, and with it the loop runs scalar) */
CLONES_SHIFT static void requant_cols_IN_OUT(const CIN *a, COUT *c, float *y, int64_t len,
                                          const int64_t *q, const int64_t *off, const uint64_t *n,
                                          const int64_t *back, int64_t lo, int64_t hi, float s) {
  const uint64_t sign = (uint64_t)1 << 63;
  #pragma omp simd
  for (int64_t j = 0; j < len; ++j) {
    int64_t v = (int64_t)WIDEN(a[j]) * (int64_t)(FACTOR)q[j] + off[j];
    int64_t r = (int64_t)(((uint64_t)v ^ sign) >> n[j]) - back[j];
    r = r < lo ? lo : r;
    r = r > hi ? hi : r;
    const int32_t code = (int32_t)r;
    c[j] = (COUT)code;
    if (y) y[j] = (float)code * s;
  }
}
"""

_RESCALE = r"""
/* one row of a channel: its b and m fixed; r = code - z in float */
CLONES_RESCALE static void rescale_rows_IN_OUT(const CIN *a, COUT *c, float *y, int64_t len,
                                          float b, float m, float lo, float hi, int32_t z,
                                          float s) {
  #pragma omp simd
  for (int64_t j = 0; j < len; ++j) {
    const float r = round_clamped(((float)a[j] + b) * m, lo, hi);
    c[j] = (COUT)((int32_t)r + z);
    if (y) y[j] = r * s;
  }
}

CLONES_RESCALE static void rescale_cols_IN_OUT(const CIN *a, COUT *c, float *y, int64_t len,
                                          const float *b, const float *m, float lo, float hi,
                                          int32_t z, float s) {
  #pragma omp simd
  for (int64_t j = 0; j < len; ++j) {
    const float r = round_clamped(((float)a[j] + b[j]) * m[j], lo, hi);
    c[j] = (COUT)((int32_t)r + z);
    if (y) y[j] = r * s;
  }
}
"""

# the entry point of each kernel: a tensor whose channel axis is last (inner 1) runs a row of
# channels per outer index; any other runs rows of one channel in blocks of BLOCK values
_DRIVER = r"""
void ql_KIND_IN_OUT(const CIN *a, COUT *c, float *y, int64_t outer, int64_t chans,
                    int64_t inner, PARAMS, float s, int threads) {
  if (inner == 1 && chans > 1) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      const int64_t at = o * chans;
      KIND_cols_IN_OUT(a + at, c + at, y ? y + at : 0, chans, COL_ARGS, s);
    }
    return;
  }
  const int64_t per_row = (inner + BLOCK - 1) / BLOCK;
  const int64_t tasks = outer * chans * per_row;
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t row = t / per_row, part = t % per_row;
    const int64_t ch = chans > 1 ? row % chans : 0;
    const int64_t start = part * BLOCK;
    const int64_t len = inner - start < BLOCK ? inner - start : BLOCK;
    const int64_t at = row * inner + start;
    KIND_rows_IN_OUT(a + at, c + at, y ? y + at : 0, len, ROW_ARGS, s);
  }
}
"""

# kernel -> (its rows and cols loops, the driver's parameters, its cols and rows arguments)
_KERNELS = {
    "requant": (
        _TEMPLATE,
        "const int64_t *q, const int64_t *off, const uint64_t *n, const int64_t *back, "
        "int64_t lo, int64_t hi",
        "q, off, n, back, lo, hi",
        "q[ch], off[ch], n[ch], back[ch], lo, hi",
    ),
    "rescale": (
        _RESCALE,
        "const float *b, const float *m, float lo, float hi, int32_t z",
        "b, m, lo, hi, z",
        "b[ch], m[ch], lo, hi, z",
    ),
}


def _source() -> str:
    parts = [native.PRELUDE, _CLONES, f"#define BLOCK {BLOCK}\n"]
    for i, cin in _C_IN.items():
        for o, cout in _C_OUT.items():
            # a float sum converts through int32 (it is an integer below 2**31 in magnitude):
            # AVX-512F converts float to int32 in vector lanes, to int64 only with AVX-512DQ
            widen = "(int32_t)" if i.startswith("f") else ""
            # a sum of at most 32 bits times q (< 2**31) as a product of two int32 values,
            # which AVX2 computes in vector lanes (vpmuldq); an int64 sum times an int64 q
            factor = "int64_t" if i == "i64" else "int32_t"
            for kind, (loops, params, col_args, row_args) in _KERNELS.items():
                body = loops + _DRIVER.replace("PARAMS", params)
                body = body.replace("COL_ARGS", col_args).replace("ROW_ARGS", row_args)
                body = body.replace("KIND", kind).replace("IN_OUT", f"{i}_{o}")
                body = body.replace("CIN", cin).replace("COUT", cout)
                parts.append(body.replace("WIDEN", widen).replace("FACTOR", factor))
    return "".join(parts)


SOURCE = _source()


def configure(lib: ctypes.CDLL) -> None:
    """Set the argument types of the kernels in ``lib``."""
    p, i64, f32, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
    for i in _C_IN:
        for o in _C_OUT:
            f = getattr(lib, f"ql_requant_{i}_{o}")
            f.argtypes = [p, p, p, i64, i64, i64, p, p, p, p, i64, i64, f32, i32]
            f.restype = None
            f = getattr(lib, f"ql_rescale_{i}_{o}")
            f.argtypes = [p, p, p, i64, i64, i64, p, p, f32, f32, i32, f32, i32]
            f.restype = None


KERNELS = native.Kernels("requant", SOURCE, configure, "requantization")


def channel_constants(q: Tensor, offset: Tensor, n: Tensor, channels: int) -> tuple | None:
    """(q, offset, n, back) as contiguous int64 arrays of ``channels`` values (1 when q, offset
    and n are all per tensor), back = 2**(63 - n) (the kernel's unsigned-shift correction), or
    None when they do not fit the kernel (a length other than 1 or ``channels``, q outside
    [0, 2**31), n outside [1, 62])."""
    sizes = {t.numel() for t in (q, offset, n)}
    if not sizes <= {1, channels}:
        return None
    if int(q.min()) < 0 or int(q.max()) >= 1 << 31 or int(n.min()) < 1 or int(n.max()) > 62:
        return None
    length = max(sizes)
    q, offset, n = (
        t.reshape(-1).to(torch.int64).expand(length).contiguous() for t in (q, offset, n)
    )
    return q, offset, n, torch.bitwise_left_shift(torch.ones_like(n), 63 - n)


def requantize_shift(
    acc: Tensor,
    constants: tuple,
    axis: int,
    lo: int,
    hi: int,
    out_dtype: torch.dtype,
    value_scale: float | None = None,
) -> Tensor | tuple[Tensor, Tensor] | None:
    """Codes ``clamp(floor((acc * q + offset) / 2**n), lo, hi)`` in ``out_dtype`` (module
    docstring), with ``constants`` from ``channel_constants`` along ``axis`` of ``acc``; with
    ``value_scale`` also their float32 values ``fl32(code * value_scale)``, as (codes,
    values). None where the pass does not apply (no kernel, acc not a contiguous CPU tensor of
    a supported dtype, an unsupported output dtype). The caller guarantees ``|acc * q +
    offset| < 2**63``, ``lo <= hi`` and that a float ``acc`` holds integers."""
    q, off, n, back = constants
    args = (q.data_ptr(), off.data_ptr(), n.data_ptr(), back.data_ptr(), lo, hi)
    return _launch("requant", acc, q.numel(), axis, out_dtype, value_scale, args)


def rescale_constants(m: Tensor, b: Tensor | None, channels: int) -> tuple | None:
    """(m, b) as contiguous float32 arrays of ``channels`` values (1 when both are per
    tensor; b zeros when None), or None for a length other than 1 or ``channels``."""
    b = torch.zeros((), dtype=torch.float32) if b is None else b
    sizes = {m.numel(), b.numel()}
    if not sizes <= {1, channels} or m.dtype != torch.float32 or b.dtype != torch.float32:
        return None
    length = max(sizes)
    return tuple(t.reshape(-1).expand(length).contiguous() for t in (m, b))


def requantize_rescale(
    acc: Tensor,
    constants: tuple,
    axis: int,
    lo: int,
    hi: int,
    zero_point: int,
    out_dtype: torch.dtype,
    value_scale: float | None = None,
) -> Tensor | tuple[Tensor, Tensor] | None:
    """Codes ``clamp(round_half_even(fl32(fl32(acc + b) * m)) + zero_point, lo, hi)`` in
    ``out_dtype`` (module docstring), with ``constants`` from ``rescale_constants`` along
    ``axis``; with ``value_scale`` also their float32 values ``fl32((code - zero_point) *
    value_scale)``, as (codes, values). None where the pass does not apply (as
    ``requantize_shift``). The caller guarantees |acc| <= 2**24 or a float32 ``acc`` of
    integers, bias codes that are float32 values, and integer bounds with lo <= hi."""
    m, b = constants
    args = (b.data_ptr(), m.data_ptr(), float(lo - zero_point), float(hi - zero_point), zero_point)
    return _launch("rescale", acc, m.numel(), axis, out_dtype, value_scale, args)


def _launch(kernel, acc, chans, axis, out_dtype, value_scale, args):
    """Run ``ql_<kernel>_<in>_<out>`` over ``acc`` (outer, channels, inner) with ``args``."""
    kind = _IN.get(acc.dtype), _OUT.get(out_dtype)
    if None in kind or acc.device.type != "cpu" or not acc.is_contiguous() or acc.dim() == 0:
        return None
    ax = axis % acc.dim()
    if chans > 1 and acc.shape[ax] != chans:
        return None
    lib = KERNELS.lib()
    if lib is None:
        return None
    shape = acc.shape
    outer, inner = shape[:ax].numel(), shape[ax + 1 :].numel()
    if chans == 1:  # per tensor: one row of every value
        outer, inner = 1, acc.numel()
    with torch._C.DisableTorchFunction():
        codes = torch.empty(shape, dtype=out_dtype)
        values = torch.empty(shape, dtype=torch.float32) if value_scale is not None else None
        threads = max(1, min(torch.get_num_threads(), acc.numel() >> 14))
        getattr(lib, f"ql_{kernel}_{kind[0]}_{kind[1]}")(
            acc.data_ptr(),
            codes.data_ptr(),
            values.data_ptr() if values is not None else None,
            outer,
            chans,
            inner,
            *args,
            0.0 if value_scale is None else value_scale,
            threads,
        )
    return codes if values is None else (codes, values)
