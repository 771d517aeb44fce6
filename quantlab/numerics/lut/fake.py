"""The QAT counterpart of a LUT op: the exact float function, then output fake quant."""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.functions import default_spec, get_function
from quantlab.numerics.lut.spec import LutSpec
from quantlab.numerics.rounding import Round, round_float
from quantlab.numerics.scales import check_scale_float


def lut_fake_codes(
    x: Tensor,
    func: str,
    out_dtype: DType,
    out_scale: float,
    rounding: Round = Round.HALF_EVEN,
    spec: LutSpec | None = None,
) -> Tensor:
    """Output codes of the exact function: saturate(round(f(x) / out_scale)), int64.

    f is the table's target (clamp rules, symmetric mirroring) evaluated in float64; the
    division and rounding are float64 (the same arithmetic that fills a direct int8 table).
    Non-finite inputs: +-inf follow the function's limits and saturate; NaN gives code 0.
    """
    out_scale = check_scale_float(out_scale, "out_scale")
    spec = default_spec(func) if spec is None else spec
    y = get_function(func).target(x.to(torch.float64), spec)
    r = round_float(y / out_scale, rounding)
    r = torch.nan_to_num(r, nan=0.0)  # NaN inputs -> code 0, as quantize does
    return r.clamp(out_dtype.qmin, out_dtype.qmax).to(torch.int64)


def lut_fake(
    x: Tensor,
    func: str,
    out_dtype: DType,
    out_scale: float,
    rounding: Round = Round.HALF_EVEN,
    spec: LutSpec | None = None,
) -> Tensor:
    """QAT numerics of a LUT op: the exact float function, then output fake quant (float32).

    This is what QAT/calibration computes (horizon-plugin.md s.1.6): no table error at all; the
    difference to ``SegmentLut.evaluate`` is the op-level QAT-to-deployed gap.
    """
    out_dtype = DType.parse(out_dtype)
    if not out_dtype.is_int:
        raise ValueError(f"lut_fake out_dtype must be INT8 or INT16, got {out_dtype.name}")
    codes = lut_fake_codes(x, func, out_dtype, out_scale, rounding, spec)
    return (codes.to(torch.float64) * float(out_scale)).to(torch.float32)
