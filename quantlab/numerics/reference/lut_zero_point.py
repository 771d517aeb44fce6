"""Reference of the look-up tables on codes with zero points
(``quantlab.numerics.lut.zero_point``): every output computed on its own from the definition.

Direct mode: f((x - zx) s_in) in float64 (the product is exact: |x - zx| < 2**9 and a float32
scale), the float64 quotient by s_out, rounded with the reference's exact rational rounding,
plus zo, saturated. Segment mode: the segment reference (``evaluate_lut``) on x - zx, plus zo,
saturated.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch
from torch import Tensor

from quantlab.numerics.lut.functions import get_function
from quantlab.numerics.reference.lut import evaluate_lut
from quantlab.numerics.reference.rounding import round_fraction


def evaluate_zero_point_lut(zlut, codes: Tensor) -> Tensor:
    """Output codes (``zlut.out_dtype``'s torch dtype) of input ``codes`` (integer tensor of
    ``zlut.in_dtype`` codes); same contract as ``ZeroPointLut.evaluate``."""
    x = codes.reshape(-1).to(torch.int64).numpy()
    lo, hi = zlut.out_dtype.qmin, zlut.out_dtype.qmax
    if zlut.direct:
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
