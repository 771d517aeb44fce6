"""Inference BatchNormalization as onnxruntime's CPU kernel computes it in float32.

Per channel c, from the float32 statistics and affine parameters:

    s_c = fl32(fl32(1 / fl32(sqrt(fl32(var_c + eps)))) * gamma_c)
    t_c = fl32(beta_c - fl32(mean_c * s_c))
    y   = fl32(fl32(x * s_c) + t_c)

each step one IEEE float32 operation (sqrt and the quotient correctly rounded, no fused
multiply-add). torch's ``F.batch_norm`` rounds otherwise: on 20160 random values it differed
from onnxruntime in the last bit on 6728.
"""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics.ieee32 import sqrt32


def ort_batch_norm(
    x: Tensor,
    mean: Tensor,
    var: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
) -> Tensor:
    """float32 ``y`` of eval-mode batch norm of float32 ``x`` (channels on dim 1), as above;
    ``weight`` / ``bias`` None stand for 1 / 0."""
    f32, f64 = torch.float32, torch.float64
    var, mean = var.detach().to(f32), mean.detach().to(f32)
    # the correctly rounded square root (``numerics.ieee32.sqrt32``: torch's is not on every
    # build), the quotient formed in float64 and rounded once: the IEEE float32 operations
    root = sqrt32(var + torch.tensor(eps, dtype=f32))
    inv = torch.reciprocal(root.to(f64)).to(f32)
    s = inv * weight.detach().to(f32) if weight is not None else inv
    t = -(mean * s) if bias is None else bias.detach().to(f32) - mean * s
    shape = [1, -1] + [1] * (x.dim() - 2)
    return x.to(f32) * s.reshape(shape) + t.reshape(shape)
