"""Depthwise convolutions of integer codes in C with int32 sums (the INT32_DEPTHWISE path).

``depthwise_conv_int32(x, w, stride, padding, dilation)``: x (N, C, H, W) int8/int16 codes,
w (C * m, 1, kh, kw) int8/int16 codes (m output channels per input channel), zero padding;
returns the int32 sums ``out[b, o, i, j] = sum_{u, v} w[o, 0, u, v] * x[b, o // m, i * sy +
u * dy - py, j * sx + v * dx - px]`` (zero outside x), F.conv2d with ``groups = C``.

Exact under the caller's bound ``kh * kw * max|x| * max|w| <= 2**31 - 1`` (``plan``): every
product has magnitude at most 2**30 (codes within 2**15), so each is an exact int32, and every
partial sum is a sum of some of the terms, so it stays within the bound: no int32 operation
wraps. Each channel plane is copied once, widened to int32, into a per-thread buffer zeroed
once (the padding), its rows and columns stored by stride phase (padded row ``sy * a + q`` and
column ``sx * j + p`` at phase plane ``(q, p)``, row ``a``, index ``j``), so that each kernel tap
reads one phase plane at a fixed offset for every output. The sums then run over the flattened
output plane (oh rows of the phase planes' width, the columns past ow unused: they too sum
kh * kw products of codes or zeros, within the same bound), GROUP taps per pass, in long
contiguous loops, and the rows are copied out. The loops are compiled for AVX-512, for AVX2 and
for the baseline, chosen at load; tests check the loaded build, the baseline and the AVX2 code
alone against torch's int64 convolution on random and extreme codes.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from quantlab.numerics import native
from quantlab.numerics.gemm.plan import DEPTHWISE_MAX_TAPS, conv_output_size, per_axis

_C_TYPE = {torch.int8: ("i8", "int8_t"), torch.int16: ("i16", "int16_t")}

_PLANE = r"""
/* one channel plane: fill its phase planes, then each of its m output planes
   tap by tap over the flattened (oh, pwc) grid (columns ow.. of a row are not used), then copy
   the rows out as int32 */
CLONES static void dw_plane_XS_WS(const XT *src, const WT *w, int32_t *out, int32_t *buf,
                                     int32_t *acc, const int64_t *geo, const int64_t *spans,
                                     const int64_t *offsets) {
  const int64_t h = geo[0], wd = geo[1], m = geo[2], kh = geo[3], kw = geo[4], sy = geo[5],
                sx = geo[6], py = geo[7], dy = geo[9], dx = geo[10], oh = geo[11],
                ow = geo[12], phr = geo[13], pwc = geo[14];
  const int64_t plane_len = (phr + 1) * pwc; /* one zero row of slack below each phase plane */
  /* the padding and slack of buf are zero (set once per thread): only the input is copied */
  for (int64_t q = 0; q < sy; ++q) {
    const int64_t a0 = py > q ? (py - q + sy - 1) / sy : 0;
    const int64_t a1 = (h + py - q + sy - 1) / sy < phr ? (h + py - q + sy - 1) / sy : phr;
    for (int64_t p = 0; p < sx; ++p) {
      const int64_t j0 = spans[2 * p], j1 = spans[2 * p + 1];
      int32_t *dst = buf + (q * sx + p) * plane_len;
      for (int64_t a = a0; a < a1; ++a) {
        const XT *line = src + (a * sy + q - py) * wd + p - geo[8];
        int32_t *row = dst + a * pwc;
        if (sx == 1) {
          #pragma omp simd
          for (int64_t j = j0; j < j1; ++j) row[j] = (int32_t)line[j];
        } else if (sx == 2) {
          #pragma omp simd
          for (int64_t j = j0; j < j1; ++j) row[j] = (int32_t)line[2 * j];
        } else {
          for (int64_t j = j0; j < j1; ++j) row[j] = (int32_t)line[j * sx];
        }
      }
    }
  }
  const int64_t taps = kh * kw, len = oh * pwc;
  for (int64_t k = 0; k < m; ++k) {
    const WT *wk = w + k * taps;
    /* the taps in order, GROUP at a time: each pass adds GROUP products to every sum */
    const int32_t *in[GROUP];
    int32_t c[GROUP];
    int64_t got = 0;
    for (int64_t t = 0; t < taps; ++t) {
      in[got] = buf + offsets[t];
      c[got++] = (int32_t)wk[t];
      if (got < GROUP && t < taps - 1) continue;
      for (int64_t g = got; g < GROUP; ++g) {
        in[g] = in[0];
        c[g] = 0;
      }
      GROUP_OPERANDS
      if (t < GROUP) {
        #pragma omp simd
        for (int64_t j = 0; j < len; ++j) acc[j] = GROUP_SUM;
      } else {
        #pragma omp simd
        for (int64_t j = 0; j < len; ++j) acc[j] += GROUP_SUM;
      }
      got = 0;
    }
    int32_t *plane = out + k * oh * ow;
    for (int64_t i = 0; i < oh; ++i)
      memcpy(plane + i * ow, acc + i * pwc, (size_t)ow * sizeof(int32_t));
  }
}
"""

_DRIVER = r"""
/* geo: h, w, m, kh, kw, sy, sx, py, px, dy, dx, oh, ow (the caller's), phr, pwc (set here) */
int ql_dw_XS_WS(const XT *x, const WT *w, int32_t *out, int64_t batch, int64_t chans,
                int64_t *geo, int threads) {
  const int64_t h = geo[0], wd = geo[1], m = geo[2], kh = geo[3], kw = geo[4], sy = geo[5],
                sx = geo[6], px = geo[8], dy = geo[9], dx = geo[10], oh = geo[11],
                ow = geo[12];
  const int64_t rows = (oh - 1) * sy + (kh - 1) * dy + 1;
  const int64_t cols = (ow - 1) * sx + (kw - 1) * dx + 1;
  const int64_t phr = geo[13] = (rows + sy - 1) / sy, pwc = geo[14] = (cols + sx - 1) / sx;
  const int64_t plane_len = (phr + 1) * pwc;
  int64_t offsets[kh * kw]; /* of tap (u, v): its phase plane, row and column in buf */
  for (int64_t u = 0; u < kh; ++u)
    for (int64_t v = 0; v < kw; ++v) {
      const int64_t r = u * dy, s = v * dx;
      offsets[u * kw + v] = ((r % sy) * sx + s % sx) * plane_len + (r / sy) * pwc + s / sx;
    }
  int64_t spans[2 * sx]; /* per column phase p: the j with j * sx + p - px inside [0, wd) */
  for (int64_t p = 0; p < sx; ++p) {
    int64_t j0 = px > p ? (px - p + sx - 1) / sx : 0, j1 = (wd + px - p + sx - 1) / sx;
    j0 = j0 < pwc ? j0 : pwc;
    j1 = j1 < pwc ? j1 : pwc;
    spans[2 * p] = j0;
    spans[2 * p + 1] = j1 > j0 ? j1 : j0;
  }
  const int64_t planes = batch * chans;
  const size_t buf_len = (size_t)(sy * sx * (phr + 1) * pwc), acc_len = (size_t)(oh * pwc);
  int failed = 0;
  #pragma omp parallel num_threads(threads) reduction(|:failed)
  {
    int32_t *buf = (int32_t *)calloc(buf_len + acc_len, sizeof(int32_t)); /* zero padding */
    if (!buf) failed = 1;
    #pragma omp for schedule(static)
    for (int64_t q = 0; q < planes; ++q) {
      if (!buf) continue;
      const int64_t c = q % chans;
      const XT *xs = x + q * h * wd;
      const WT *ws = w + c * m * kh * kw;
      int32_t *os = out + q * m * oh * ow;
      dw_plane_XS_WS(xs, ws, os, buf, buf + buf_len, geo, spans, offsets);
    }
    free(buf);
  }
  return failed;
}
"""

GROUP = 9  # taps added per pass over a plane's sums


def _source() -> str:
    operands = " ".join(f"const int32_t *a{g} = in[{g}], c{g} = c[{g}];" for g in range(GROUP))
    plane = _PLANE.replace("GROUP_OPERANDS", operands)
    plane = plane.replace("GROUP_SUM", " + ".join(f"c{g} * a{g}[j]" for g in range(GROUP)))
    parts = [
        native.PRELUDE,
        "#include <stdlib.h>\n#include <string.h>\n",
        f"#define GROUP {GROUP}\n",
    ]
    for xs, xt in _C_TYPE.values():
        for ws, wt in _C_TYPE.values():
            parts.append(plane.replace("XS_WS", f"{xs}_{ws}").replace("XT", xt).replace("WT", wt))
            parts.append(_DRIVER.replace("XS_WS", f"{xs}_{ws}").replace("XT", xt).replace("WT", wt))
    return "".join(parts)


SOURCE = _source()


def configure(lib: ctypes.CDLL) -> None:
    """Set the argument types of the kernels in ``lib``."""
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    for xs, _ in _C_TYPE.values():
        for ws, _ in _C_TYPE.values():
            f = getattr(lib, f"ql_dw_{xs}_{ws}")
            f.argtypes = [p, p, p, i64, i64, p, ctypes.c_int]
            f.restype = ctypes.c_int


KERNELS = native.Kernels("depthwise", SOURCE, configure, "depthwise convolution")


def available() -> bool:
    """Whether the kernels are built (or can be) in this process."""
    return KERNELS.lib() is not None


def depthwise_conv_int32(x: Tensor, w: Tensor, stride=1, padding=0, dilation=1) -> Tensor:
    """The int32 sums of F.conv2d(x, w, groups=C) (module docstring) for batched int8/int16
    codes ``x`` (N, C, H, W) and ``w`` (C * m, 1, kh, kw), numeric zero ``padding``; by
    torch's int64 convolution, cast to int32, where the kernels are not built (the same
    bits; also beyond DEPTHWISE_MAX_TAPS taps or stride). The caller guarantees ``kh * kw *
    max|x| * max|w| <= 2**31 - 1``."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    (sy, sx), (py, px), (dy, dx) = (per_axis(v, 2) for v in (stride, padding, dilation))
    oh, ow = conv_output_size(tuple(x.shape), (kh, kw), stride, padding, dilation)
    if min(oh, ow) <= 0 or x.numel() == 0:
        raise ValueError(f"depthwise convolution of {tuple(x.shape)} by {tuple(w.shape)} is empty")
    lib = KERNELS.lib()
    small = kh * kw <= DEPTHWISE_MAX_TAPS and max(sy, sx) <= DEPTHWISE_MAX_TAPS
    if lib is None or x.device.type != "cpu" or not small:
        return torch.nn.functional.conv2d(
            x.to(torch.int64), w.to(torch.int64), None, stride, padding, dilation, c
        ).to(torch.int32)
    with torch._C.DisableTorchFunction():
        xc, wc = x.contiguous(), w.contiguous()
        out = torch.empty((n, o, oh, ow), dtype=torch.int32)
        threads = max(1, min(torch.get_num_threads(), n * c, (out.numel() * kh * kw) >> 15))
        kernel = getattr(lib, f"ql_dw_{_C_TYPE[x.dtype][0]}_{_C_TYPE[w.dtype][0]}")
        geo = (ctypes.c_int64 * 15)(h, wd, o // c, kh, kw, sy, sx, py, px, dy, dx, oh, ow, 0, 0)
        failed = kernel(xc.data_ptr(), wc.data_ptr(), out.data_ptr(), n, c, geo, threads)
    if failed:
        raise MemoryError("depthwise convolution: no memory for a channel buffer")
    return out
