"""``norm_fixed``'s folded steps (``NormShifts``) for rows over the trailing dims (LayerNorm)
in C.

Every element-wise step runs in two C loops per row (``quantlab.numerics.native``: C99, no
fast-math), the same int64 operations as ``norm_integer._norm_shifted``:

- diff: ``d = clamp((mu * A + off + x * B) >> n, lo, hi)`` with ``A = -my * q``, ``B = mx * q``
  (the add rule's multipliers folded into the step's multiplier q);
- square: ``sq = clamp((off + q * d * d) >> n, lo, hi)``, summed per row in int64;
- normed: ``y = clamp((d * rq + off) >> n, lo, hi)`` with ``rq = r * q`` per row;
- scaled (gamma): ``y = clamp((y * g[j] + off) >> n, lo, hi)`` with ``g = gamma * q`` per
  channel;
- out add (beta): ``y = clamp((b[j] + y * M) >> n, lo, hi)`` with ``M = mx * q`` and
  ``b = beta * my * q + off`` per channel.

The per-row terms between them, one value per row, run in C as well (``ni_rows``, one pass
per row) where the mean's and the variance's requantizations have the half-up multiply-and-
shift form (``Int32Requant.fast``: ``clamp(floor((acc * m + 2**(n-1)) / 2**n), lo, hi)``,
exact in int64 as ``requantize_int32`` computes it): the row's int64 sum, both
requantizations, the eps codes' add clamped at the intermediate dtype's maximum, and the rsqrt
table as its code map (``SegmentLut.code_map``: its output for every intermediate code read as
unsigned, which is what ``evaluate`` gathers), times normed's q. Elsewhere they stay torch's,
between the two loops.

Exactness: every value is an exact int64; ``norm_shifts`` admits these steps only when every
partial value stays below 2**62 in magnitude, so no sum or product wraps, and the order of
exact integer operations does not change a value. ``>>`` of a negative int64 is the floor
(arithmetic shift: GCC and Clang define it so, as torch's ``bitwise_right_shift`` does), and
the clamps are the same comparisons. The last step's bounds lie within the output dtype, whose
codes are written directly (int8 or int16). So the codes are ``_norm_shifted``'s, bit for bit;
the tests check that on random and adversarial rows in all three builds (as the CPU loads it,
which on a CPU with AVX-512 DQ is the DQ copy below; the AVX2 code alone; the baseline).
"""

from __future__ import annotations

import ctypes
import weakref

import torch
from torch import Tensor

from quantlab.numerics import native
from quantlab.numerics.dtypes import DType
from quantlab.numerics.norm import EpsMode, NormAxes, NormLayout
from quantlab.numerics.requant import requantize_int32

# The row loops multiply int64 values, which AVX-512 vectorizes only with its DQ extension
# (vpmullq; about 4x the plain AVX-512 clone's speed here): on a CPU that has it (checked when
# called) the loops run a copy compiled for AVX-512 DQ, else the per-CPU clones of the rest.
_DQ = r"""
#if defined(__x86_64__) && defined(__GNUC__) && !defined(QL_NO_CLONES) && !defined(QL_ONLY_AVX2)
#define QL_DQ 1
#define DQ __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw")))
static int has_dq(void) { return __builtin_cpu_supports("avx512dq"); }
#else
static int has_dq(void) { return 0; }
#endif
"""

_ROW1 = r"""
/* diff and square of one row; returns the row's sum of sq (c: A, off, B, n, lo, hi of diff;
   q, off, n, lo, hi of square) */
ATTR static int64_t k1_row_NAME(const X *restrict x, int64_t mu, int64_t n,
                                const int64_t *restrict c, int32_t *restrict d) {
  const int64_t base = mu * c[0] + c[1], b = c[2], dlo = c[4], dhi = c[5];
  const int dn = (int)c[3];
  const int64_t sq_q = c[6], sq_off = c[7], slo = c[9], shi = c[10];
  const int sn = (int)c[8];
  int64_t sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    int64_t v = (base + (int64_t)x[j] * b) >> dn;
    v = v < dlo ? dlo : v;
    v = v > dhi ? dhi : v;
    d[j] = (int32_t)v;
    int64_t s = (sq_off + sq_q * v * v) >> sn;
    s = s < slo ? slo : s;
    s = s > shi ? shi : s;
    sum += s;
  }
  return sum;
}
"""

_ROW2 = r"""
/* normed, scaled and out add of one row (c: off, n, lo, hi of normed; off, n, lo, hi of
   scaled; M, n, lo, hi of the out add); g, b: per channel, or NULL without that step */
ATTR static void k2_row_NAME(const int32_t *restrict d, int64_t rq, int64_t n,
                             const int64_t *restrict c, const int64_t *restrict g,
                             const int64_t *restrict b, Y *restrict o) {
  const int64_t noff = c[0], nlo = c[2], nhi = c[3];
  const int nn = (int)c[1];
  const int64_t soff = c[4], slo = c[6], shi = c[7];
  const int sn = (int)c[5];
  const int64_t m = c[8], olo = c[10], ohi = c[11];
  const int on = (int)c[9];
  for (int64_t j = 0; j < n; ++j) {
    int64_t y = ((int64_t)d[j] * rq + noff) >> nn;
    y = y < nlo ? nlo : y;
    y = y > nhi ? nhi : y;
    if (g) {
      y = (y * g[j] + soff) >> sn;
      y = y < slo ? slo : y;
      y = y > shi ? shi : y;
    }
    if (b) {
      y = (b[j] + y * m) >> on;
      y = y < olo ? olo : y;
      y = y > ohi ? ohi : y;
    }
    o[j] = (Y)y;
  }
}
"""

_CALLS = r"""
void ni_k1_T(const X *x, const int64_t *mu, int64_t rows, int64_t n, const int64_t *c,
             int32_t *d, int64_t *sqsum, int threads) {
  const int dq = has_dq();
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    sqsum[r] = dq ? k1_row_dq_T(x + r * n, mu[r], n, c, d + r * n)
                  : k1_row_T(x + r * n, mu[r], n, c, d + r * n);
}

void ni_k2_T(const int32_t *d, const int64_t *rq, int64_t rows, int64_t n, const int64_t *c,
             const int64_t *g, const int64_t *b, Y *out, int threads) {
  const int dq = has_dq();
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    if (dq) k2_row_dq_T(d + r * n, rq[r], n, c, g, b, out + r * n);
    else k2_row_T(d + r * n, rq[r], n, c, g, b, out + r * n);
  }
}
"""

_ROWS = r"""
/* one row's integer sum */
CLONES static int64_t row_sum_NAME(const X *restrict x, int64_t n) {
  int64_t s = 0;
  for (int64_t j = 0; j < n; ++j) s += x[j];
  return s;
}
"""

_FUSED = r"""
/* floor((acc * m + off) / 2**sh) clamped to [lo, hi] (p: m, off, sh, lo, hi) */
static inline int64_t rq_half_up(int64_t acc, const int64_t *p) {
  int64_t v = (acc * p[0] + p[1]) >> (int)p[2];
  v = v < p[3] ? p[3] : v;
  return v > p[4] ? p[4] : v;
}

/* the whole composite per row: p holds the mean's requantization (5), the variance's (5),
   eps (add, codes, the intermediate dtype's qmax), the table's code bits and normed's q;
   rmap: the rsqrt table's outputs by the intermediate code read as unsigned */
void ni_rows_TI_TO(const XI *x, int64_t rows, int64_t n, const int64_t *p, const int64_t *c1,
                   const int64_t *c2, const int64_t *g, const int64_t *b, const int64_t *rmap,
                   int32_t *d, YO *out, int threads) {
  const int dq = has_dq();
  const int64_t mask = p[13] == 16 ? 0xffff : 0xff;
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const XI *xr = x + r * n;
    int32_t *dr = d + r * n;
    const int64_t mu = rq_half_up(row_sum_TI(xr, n), p);
    const int64_t sq = dq ? k1_row_dq_TI(xr, mu, n, c1, dr) : k1_row_TI(xr, mu, n, c1, dr);
    int64_t v = rq_half_up(sq, p + 5);
    if (p[10]) {
      v += p[11];
      v = v > p[12] ? p[12] : v;
    }
    const int64_t rq = rmap[v & mask] * p[14];
    if (dq) k2_row_dq_TO(dr, rq, n, c2, g, b, out + r * n);
    else k2_row_TO(dr, rq, n, c2, g, b, out + r * n);
  }
}
"""

_TYPES = {"i8": "int8_t", "i16": "int16_t"}


def _source() -> str:
    """The kernels' C: per code type t, the row loops (per-CPU clones, and the AVX-512 DQ copy
    where the build has one; else its name stands for the clones) and the entry points
    ``ni_k1_t`` (reads t codes) and ``ni_k2_t`` (writes t codes)."""
    parts = [native.PRELUDE, _DQ]
    for t, ctype in _TYPES.items():
        for template, type_name, loop in ((_ROW1, "X", "k1_row"), (_ROW2, "Y", "k2_row")):
            one = template.replace(type_name, ctype)
            parts.append(one.replace("ATTR", "CLONES").replace("_NAME(", f"_{t}("))
            parts.append("#ifdef QL_DQ\n")
            parts.append(one.replace("ATTR", "DQ").replace("_NAME(", f"_dq_{t}("))
            parts.append(f"#else\n#define {loop}_dq_{t} {loop}_{t}\n#endif\n")
        parts.append(_CALLS.replace("_T(", f"_{t}(").replace("X", ctype).replace("Y", ctype))
        parts.append(_ROWS.replace("X", ctype).replace("_NAME(", f"_{t}("))
    parts.append(_FUSED.split("void ni_rows")[0])
    fused = "void ni_rows" + _FUSED.split("void ni_rows")[1]
    for ti, ci in _TYPES.items():
        for to, co in _TYPES.items():
            one = fused.replace("TI_TO(", f"{ti}_{to}(").replace("XI", ci).replace("YO", co)
            parts.append(one.replace("_TI(", f"_{ti}(").replace("_TO(", f"_{to}("))
    return "".join(parts)


SOURCE = _source()

_SUFFIX = {torch.int8: "i8", torch.int16: "i16"}


def configure(lib: ctypes.CDLL) -> None:
    """Set the argument types of the kernels in ``lib``."""
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    for t in _TYPES:
        k1, k2 = getattr(lib, f"ni_k1_{t}"), getattr(lib, f"ni_k2_{t}")
        k1.argtypes = [p, p, i64, i64, p, p, p, i32]
        k2.argtypes = [p, p, i64, i64, p, p, p, p, i32]
        k1.restype = k2.restype = None
        for to in _TYPES:
            fused = getattr(lib, f"ni_rows_{t}_{to}")
            fused.argtypes = [p, i64, i64, p, p, p, p, p, p, p, p, i32]
            fused.restype = None


KERNELS = native.Kernels("norm_integer", SOURCE, configure, "integer LayerNorm kernel")


def _i64(values) -> Tensor:
    return torch.tensor(values, dtype=torch.int64)


def norm_shifted_rows(
    codes: Tensor, layout: NormLayout, k, c, out_dtype: DType, kernels: native.Kernels = KERNELS
) -> Tensor | None:
    """``_norm_shifted(codes, layout, k, c).to(out_dtype)`` for a LAST layout by the C loops
    (module docstring), or None where they do not apply (another layout, codes that are not a
    contiguous int8/int16 CPU tensor, an output step whose bounds leave ``out_dtype``, a diff
    step whose bounds leave int32, no kernel). ``k``: the ``NormConstants`` (with ``shifts``),
    ``c``: the ``NormContract``."""
    f = k.shifts
    last = f.out_add or f.scaled or f.normed
    if (
        layout.axes is not NormAxes.LAST
        or codes.dtype not in _SUFFIX
        or codes.device.type != "cpu"
        or not codes.is_contiguous()
        or out_dtype.torch_dtype not in _SUFFIX
        or last.lo < out_dtype.qmin
        or last.hi > out_dtype.qmax
        or f.diff.lo < -(1 << 31)
        or f.diff.hi >= 1 << 31  # d is kept as int32
    ):
        return None
    lib = kernels.lib()
    if lib is None:
        return None
    dt = c.inter_dtype
    with torch._C.DisableTorchFunction():
        rows = layout.rows(codes)
        n_rows, n = rows.shape
        c1, c2, g, b = _constants(k, layout, codes)
        threads = max(1, min(torch.get_num_threads(), n_rows))
        per_row = _per_row(k, c)
        if per_row is not None:  # every step in C, the per-row terms too
            p, rmap = per_row
            d = torch.empty((n_rows, n), dtype=torch.int32)
            out = torch.empty((n_rows, n), dtype=out_dtype.torch_dtype)
            getattr(lib, f"ni_rows_{_SUFFIX[codes.dtype]}_{_SUFFIX[out.dtype]}")(
                rows.data_ptr(), n_rows, n, p.data_ptr(), c1.data_ptr(), c2.data_ptr(),
                None if g is None else g.data_ptr(), None if b is None else b.data_ptr(),
                rmap.data_ptr(), d.data_ptr(), out.data_ptr(), threads,
            )  # fmt: skip
            return out.reshape(codes.shape)
        mu = requantize_int32(rows.sum(1, dtype=torch.int64), k.mean).contiguous()
        d = torch.empty((n_rows, n), dtype=torch.int32)
        sqsum = torch.empty(n_rows, dtype=torch.int64)
        getattr(lib, f"ni_k1_{_SUFFIX[codes.dtype]}")(
            rows.data_ptr(), mu.data_ptr(), n_rows, n, c1.data_ptr(), d.data_ptr(),
            sqsum.data_ptr(), threads,
        )  # fmt: skip
        v = requantize_int32(sqsum, k.var)
        if c.eps_mode is EpsMode.ADD_CODES:
            v = (v + k.eps_codes).clamp_max(dt.qmax)
        r = k.rsqrt.evaluate(v.to(dt.torch_dtype)).to(torch.int64)
        rq = (r * f.normed.q).contiguous()
        out = torch.empty((n_rows, n), dtype=out_dtype.torch_dtype)
        getattr(lib, f"ni_k2_{_SUFFIX[out.dtype]}")(
            d.data_ptr(), rq.data_ptr(), n_rows, n, c2.data_ptr(),
            None if g is None else g.data_ptr(), None if b is None else b.data_ptr(),
            out.data_ptr(), threads,
        )  # fmt: skip
        return out.reshape(codes.shape)


# id(NormConstants) -> (a weak reference to it, {what: the constants made from it})
_KEPT: dict[int, tuple] = {}


def _kept(k, what, make):
    """``make()`` once per ``NormConstants`` object ``k`` and ``what``, kept while k lives."""
    key = id(k)
    hit = _KEPT.get(key)
    if hit is None or hit[0]() is not k:
        hit = _KEPT[key] = (weakref.ref(k, lambda _, key=key: _KEPT.pop(key, None)), {})
    if what not in hit[1]:
        hit[1][what] = make()
    return hit[1][what]


def _per_row(k, c) -> tuple | None:
    """(p, rmap) of ``ni_rows`` (module docstring) for ``k`` and contract ``c`` (of which they
    read the intermediate dtype and the eps mode), made once per ``NormConstants`` object and
    those two, or None where the per-row terms stay torch's: a mean or variance requantization
    without the half-up multiply-and-shift form (``Int32Requant.fast``), or an rsqrt table that
    does not read the intermediate dtype's codes."""
    return _kept(k, ("per row", c.inter_dtype, c.eps_mode), lambda: _make_per_row(k, c))


def _make_per_row(k, c) -> tuple | None:
    dt, lut = c.inter_dtype, k.rsqrt
    if not (k.mean.fast and k.var.fast and lut.in_dtype is dt and dt.bits in (8, 16)):
        return None
    rq = [
        [int(r.params.multiplier), int(r.offset), int(r.shift), r.out.qmin, r.out.qmax]
        for r in (k.mean, k.var)
    ]
    eps = [int(c.eps_mode is EpsMode.ADD_CODES), int(k.eps_codes), dt.qmax]
    p = _i64(rq[0] + rq[1] + eps + [dt.bits, int(k.shifts.normed.q)])
    rmap = lut.code_map().to(torch.int64).contiguous()
    return (p, rmap) if rmap.numel() == 1 << dt.bits else None


def _constants(k, layout: NormLayout, codes: Tensor) -> tuple:
    """(diff and square constants, normed / scaled / out-add constants, gamma * q per channel
    or None, the out add's per-channel term or None) as the kernels read them (int64,
    contiguous), made once per ``NormConstants`` object (kept while it lives)."""
    return _kept(k, "kernels", lambda: _make_constants(k, layout, codes))


def _make_constants(k, layout: NormLayout, codes: Tensor) -> tuple:
    f = k.shifts
    mx, my = f.diff_m
    d_, s_, sc, oa = f.diff, f.square, f.scaled, f.out_add
    c1 = _i64(
        [-my * d_.q, d_.offset, mx * d_.q, d_.n, d_.lo, d_.hi, s_.q, s_.offset, s_.n, s_.lo, s_.hi]
    )
    zeros = [0, 0, 0, 0]
    c2 = _i64(
        [f.normed.offset, f.normed.n, f.normed.lo, f.normed.hi]
        + ([sc.offset, sc.n, sc.lo, sc.hi] if sc is not None else zeros)
        + ([f.out_m[0] * oa.q, oa.n, oa.lo, oa.hi] if oa is not None else zeros)
    )
    g = b = None
    if sc is not None:
        g = layout.affine(f.gamma_q, codes, "weight").reshape(-1).to(torch.int64).contiguous()
    if oa is not None:
        b = layout.affine(f.beta_term, codes, "bias").reshape(-1).to(torch.int64).contiguous()
    return c1, c2, g, b
