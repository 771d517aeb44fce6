"""Fake quantization as QAT computes it: torch's own fake-quant kernels.

QAT frameworks (torch.ao and the vendor plugin built on it) fake-quantize with
``torch.fake_quantize_per_tensor_affine`` / ``..._per_channel_affine``:
``clamp(nearbyint(x * fl32(1 / s)), qmin, qmax) * s`` (round half to even, multiplying by the
float32 reciprocal of the scale). Deployed quantization (ONNX QuantizeLinear,
``quantlab.numerics.quantize``) divides by the scale instead; the two differ only where
``x / s`` lies within an ulp of a rounding tie, which is part of the fake-vs-fixed gap.
For rounding modes other than HALF_EVEN the numerics package's fake_quant is used.
"""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import fake_quant
from quantlab.numerics.rounding import Round


def qat_fake_quant(
    x: Tensor,
    scale: Tensor,
    dtype: DType,
    rounding: Round,
    axis: int | None = None,
    qmin: int | None = None,
) -> Tensor:
    """float32 fake-quantized ``x`` (symmetric, zero point 0) the way QAT computes it.

    Per-tensor (``axis`` None, one scale) or per-channel along ``axis``; range [qmin, qmax]
    (default: the full range of ``dtype``). Non-finite inputs follow torch's kernels.
    """
    lo = dtype.qmin if qmin is None else qmin
    if rounding is not Round.HALF_EVEN:
        return fake_quant(x, scale, dtype, rounding, axis=axis)
    xf = x.detach().to(torch.float32)
    s = torch.as_tensor(scale, dtype=torch.float32)
    if axis is None:
        return torch.fake_quantize_per_tensor_affine(xf, float(s), 0, lo, dtype.qmax)
    zp = torch.zeros(s.shape, dtype=torch.int32)
    return torch.fake_quantize_per_channel_affine(xf, s, zp, axis, lo, dtype.qmax)
