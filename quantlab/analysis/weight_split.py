"""Per-layer precision of GEMM operand formats: int8, high/low split (k, combine mode), int16.

Given one GEMM call (its float input and weight, or its two float operands for a MatMul), each
format is run in fixed point (exact integer accumulators, requantization to the output dtype)
and compared with the float64 GEMM of the *quantized* input, so only the weight/operand format
and the output rounding differ between formats. Scales follow j6-numerics s.1: activations
per tensor, weights per output channel, amax / ((qmax - qmin) / 2).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from quantlab.capture import CaptureMode, ModuleTracker, OpCall
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import Overflow
from quantlab.numerics.quantize import compute_scale, fake_quant, quantize
from quantlab.numerics.requant import Requant
from quantlab.numerics.rounding import Round
from quantlab.numerics.split import (
    INT16_SPLIT_MAX,
    SplitCombine,
    check_split_k,
    combine_partials,
    exact_conv2d,
    exact_matmul,
    int32_accumulate,
    split_fake_weight,
    split_int16_codes,
    split_weight,
)

GEMM_KINDS = ("conv1d", "conv2d", "linear", "matmul")
CONV_KINDS = ("conv1d", "conv2d")  # a conv1d call is held as the conv2d of a height-1 image


class OperandFormat(enum.Enum):
    """How the weight (Conv/Linear) or the second operand (MatMul) is held.

    INT8:  one int8 code per value, one int8 pass.
    SPLIT: Conv/Linear: int8 high + int8 low part with shift k (two int8 passes);
           MatMul: the operand quantized to int16 and taken as hi * 256 + lo (two passes).
    INT16: one int16 code per value (native int16 operand where the platform has it).
    """

    INT8 = "int8"
    SPLIT = "split"
    INT16 = "int16"


@dataclass(frozen=True)
class FormatChoice:
    """One operand format: ``fmt``, the split shift ``k`` and the ``combine`` mode (SPLIT)."""

    fmt: OperandFormat
    k: int = 7
    combine: SplitCombine = SplitCombine.WIDE_ACCUMULATOR

    def __post_init__(self) -> None:
        if self.fmt is OperandFormat.SPLIT:
            check_split_k(self.k)

    @property
    def label(self) -> str:
        if self.fmt is OperandFormat.SPLIT:
            mode = "wide" if self.combine is SplitCombine.WIDE_ACCUMULATOR else "separate"
            return f"split_k{self.k}_{mode}"
        return self.fmt.value

    @property
    def passes(self) -> int:
        """int8 MAC passes per multiply-accumulate (an int16 operand is two int8 halves)."""
        return 1 if self.fmt is OperandFormat.INT8 else 2

    @property
    def weight_bytes_per_value(self) -> int:
        return 1 if self.fmt is OperandFormat.INT8 else 2


@dataclass(frozen=True)
class GemmCall:
    """One captured GEMM: ``kind`` conv1d / conv2d / linear / matmul, operands, conv arguments
    (a conv1d's operands and arguments in the conv2d form of a height-1 image: the same sums)."""

    name: str
    kind: str
    x: Tensor  # input (conv/linear) or left operand (matmul), float
    w: Tensor  # weight (conv: OIHW, linear: (out, in)) or right operand (matmul), float
    conv_args: tuple = ()  # (stride, padding, dilation, groups) of the conv2d form

    @property
    def macs(self) -> int:
        """Multiply-accumulates of this call."""
        if self.kind in CONV_KINDS:
            y = _conv_shape(self)
            return int(math.prod(y) * self.w[0].numel())
        if self.kind == "linear":
            return int(self.x.numel() // self.x.shape[-1] * self.w.numel())
        out = torch.broadcast_shapes(self.x.shape[:-2], self.w.shape[:-2])
        return int(math.prod(out) * self.x.shape[-2] * self.x.shape[-1] * self.w.shape[-1])

    @property
    def weight_values(self) -> int:
        """Stored weight values (0 for a MatMul of two activations)."""
        return 0 if self.kind == "matmul" else int(self.w.numel())


def _conv_shape(call: GemmCall) -> tuple[int, ...]:
    stride, padding, dilation, groups = call.conv_args
    return tuple(
        F.conv2d(
            torch.zeros(1, *call.x.shape[1:]),
            torch.zeros_like(call.w),
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
        ).shape[1:]
    ) + (call.x.shape[0],)


def _float_gemm(call: GemmCall, x: Tensor, w: Tensor) -> Tensor:
    if call.kind in CONV_KINDS:
        stride, padding, dilation, groups = call.conv_args
        return F.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    if call.kind == "linear":
        return F.linear(x, w)
    return torch.matmul(x, w)


def _int_gemm(call: GemmCall, xc: Tensor, wc: Tensor) -> Tensor:
    if call.kind in CONV_KINDS:
        stride, padding, dilation, groups = call.conv_args
        return exact_conv2d(
            xc, wc, stride=stride, padding=padding, dilation=dilation, groups=groups
        )
    if call.kind == "linear":
        return exact_matmul(xc, wc.transpose(0, 1))
    return exact_matmul(xc, wc)


def evaluate_formats(
    call: GemmCall,
    formats: list[FormatChoice],
    in_dtype: DType = DType.INT8,
    out_dtype: DType = DType.INT16,
    rounding: Round = Round.HALF_UP,
    scheme: Requant = Requant.MUL_SHIFT,
    overflow: Overflow = Overflow.SATURATE,
) -> list[dict]:
    """One row per format: output SQNR (dB), error in output LSBs (max, mean), saturations,
    and ``acc_bits``: signed bits the exact combined accumulator needs (a wide accumulator).

    Reference: float64 GEMM of the dequantized ``in_dtype`` input and the float weight. Each
    format: exact integer accumulators (int32 per pass, ``overflow``), partials combined by
    ``combine_partials`` (a single partial for INT8/INT16), requantized to ``out_dtype`` with
    the per-tensor output scale amax(reference) / ((qmax - qmin) / 2); a FLOAT16/FLOAT32
    ``out_dtype`` (J6H/P) rounds s_x * s_w * acc to that format, errors in its spacing.
    """
    x = call.x.to(torch.float32)
    w = call.w.to(torch.float32)
    sx = compute_scale(x.abs().max(), in_dtype)
    xc = quantize(x, sx, in_dtype)
    per_channel = call.kind != "matmul"
    waxis = 0 if per_channel else None
    if per_channel:
        wamax = w.abs().reshape(w.shape[0], -1).amax(1)
    else:
        wamax = w.abs().max()
    ref = _float_gemm(call, xc.double() * float(sx), w.double())
    # integer out: requantize to amax/((qmax - qmin)/2); float out (J6H/P): s_x * s_w floats
    so = compute_scale(ref.abs().max(), out_dtype) if out_dtype.is_int else torch.tensor(1.0)
    caxis = 1 if call.kind in CONV_KINDS else (-1 if call.kind == "linear" else None)
    rows = []
    seen = set()
    for f in formats:
        label = f.label
        if call.kind == "matmul" and f.fmt is OperandFormat.SPLIT:
            label = "split16_" + label.split("_")[-1]  # byte split: k does not apply
        if label in seen:
            continue
        seen.add(label)
        wdt = DType.INT8 if f.fmt is OperandFormat.INT8 else DType.INT16
        if f.fmt is OperandFormat.SPLIT and per_channel:
            sw = compute_scale(wamax, DType.INT8)
            hi, lo = split_weight(w, sw, f.k, axis=0)
            parts = [(_int_gemm(call, xc, hi), 0), (_int_gemm(call, xc, lo), -f.k)]
        else:
            sw = compute_scale(wamax, wdt)
            qmax = None
            if f.fmt is OperandFormat.SPLIT:  # MatMul operand: int16 in the splittable range,
                qmax = INT16_SPLIT_MAX  # scale coarsened by 32767/32639 as the plugin does
                sw = (sw.double() * (32767 / INT16_SPLIT_MAX)).to(torch.float32)
            wc = quantize(w, sw, wdt, axis=waxis, qmax=qmax)
            if f.fmt is OperandFormat.SPLIT:
                bh, bl = split_int16_codes(wc)
                parts = [(_int_gemm(call, xc, bh), 8), (_int_gemm(call, xc, bl), 0)]
            else:
                parts = [(_int_gemm(call, xc, wc), 0)]
        e_min = min(e for _, e in parts)
        exact = sum(torch.bitwise_left_shift(a, e - e_min) for a, e in parts)
        amax = int(exact.abs().max()) if exact.numel() else 0
        sat = 0
        held = []
        for acc, e in parts:
            a32 = int32_accumulate(acc, overflow)
            sat += int((a32 != acc).sum())
            held.append((a32, e))
        real = float(sx) * sw.double() / float(so)
        axis = caxis if (per_channel and real.numel() > 1) else None
        codes = combine_partials(
            held, real, out_dtype, f.combine, rounding=rounding, scheme=scheme, axis=axis
        )
        y = codes.double() * float(so)
        if out_dtype.is_int:
            err_lsb = (codes.double() - ref / float(so)).abs()
            n_sat = int((codes.long().abs() >= out_dtype.qmax).sum())
        else:  # in units of the output format's spacing at the reference value
            err_lsb = (y - ref).abs() / _float_spacing(ref, out_dtype)
            n_sat = int((y.abs() >= out_dtype.max_finite).sum())
        noise = (y - ref).norm()
        sqnr = float(20 * torch.log10(ref.norm() / noise)) if float(noise) > 0 else math.inf
        rows.append(
            {
                "layer": call.name,
                "op_type": call.kind,
                "format": label,
                "in_dtype": in_dtype.name,
                "out_dtype": out_dtype.name,
                "sqnr_db": sqnr,
                "max_err_lsb": float(err_lsb.max()),
                "mean_err_lsb": float(err_lsb.mean()),
                "out_saturated": n_sat,
                "acc_saturated": sat,
                "acc_bits": amax.bit_length() + 1,  # signed bits of the exact combined sum
                "macs": call.macs,
                "int8_passes": call.macs * f.passes,
                "weight_bytes": call.weight_values * f.weight_bytes_per_value,
            }
        )
    return rows


def _float_spacing(ref: Tensor, dtype: DType) -> Tensor:
    """Spacing of ``dtype`` (FLOAT16/FLOAT32) at |ref|: one output LSB of a float format."""
    np_dtype = np.float16 if dtype is DType.FLOAT16 else np.float32
    a = np.abs(ref.numpy()).astype(np_dtype)
    return torch.from_numpy(np.spacing(a).astype(np.float64))


def capture_gemm_calls(model: nn.Module, inputs: tuple, kinds=GEMM_KINDS) -> list[GemmCall]:
    """Run ``model(*inputs)`` in float and record every conv2d / linear / matmul call (named as
    ``Simulator.ops`` names them: ``<module path>:<op_type>#<k>``) with its float operands."""
    calls: list[GemmCall] = []

    def handler(call: OpCall):
        out = call.result if call.result is not None else call.run()
        if call.op_type in kinds:
            args = list(call.args)
            kw = call.kwargs
            if call.op_type in CONV_KINDS:
                names = ("stride", "padding", "dilation", "groups")
                defaults = (1, 0, 1, 1)
                conv = tuple(
                    kw.get(n, args[3 + i] if len(args) > 3 + i else d)
                    for i, (n, d) in enumerate(zip(names, defaults))
                )
                x, w = args[0].detach(), args[1].detach()
                if call.op_type == "conv1d":  # the conv2d of a height-1 image
                    x, w, conv = x.unsqueeze(-2), w.unsqueeze(-2), _conv1d_as_2d(*conv)
                calls.append(GemmCall(call.name, call.op_type, x, w, conv))
            elif call.op_type == "linear":
                w = kw.get("weight", args[1] if len(args) > 1 else None)
                calls.append(GemmCall(call.name, "linear", args[0].detach(), w.detach()))
            elif getattr(call.func, "__name__", "") != "__rmatmul__":
                calls.append(GemmCall(call.name, "matmul", args[0].detach(), args[1].detach()))
        return out

    with torch.no_grad(), ModuleTracker(model) as tracker, CaptureMode(tracker, handler):
        model(*inputs)
    return calls


def _conv1d_as_2d(stride, padding, dilation, groups) -> tuple:
    """A conv1d's (stride, padding, dilation, groups) as its conv2d form's over a height-1
    image (a padding by name, "same" or "valid", stays the name)."""

    def two(v, fill: int):
        return v if isinstance(v, str) else (fill, v[0] if isinstance(v, list | tuple) else v)

    return two(stride, 1), two(padding, 0), two(dilation, 1), groups


def crop_conv_input(call: GemmCall, max_hw: int) -> GemmCall:
    """The same call on the central window of at most max_hw x max_hw input pixels, or the
    kernel's dilated extent where that is wider (convolutions only; others unchanged).
    Per-element statistics keep their meaning; the cost drops."""
    if call.kind not in CONV_KINDS or max_hw < 1:
        return call
    h, w = call.x.shape[-2:]
    dilation = call.conv_args[2] if len(call.conv_args) > 2 else 1
    dh, dw = (dilation, dilation) if isinstance(dilation, int) else dilation
    kh, kw = call.w.shape[-2:]
    ch = min(h, max(max_hw, (kh - 1) * dh + 1))
    cw = min(w, max(max_hw, (kw - 1) * dw + 1))
    top, left = (h - ch) // 2, (w - cw) // 2
    x = call.x[..., top : top + ch, left : left + cw]
    return GemmCall(call.name, call.kind, x, call.w, call.conv_args)


def fake_weight(w: Tensor, fmt: FormatChoice) -> Tensor:
    """Float32 weight a format represents (QAT numerics), per-channel scales on axis 0:
    INT8 / INT16 fake quant at amax/((qmax - qmin)/2); SPLIT s * (w_hi + w_lo / 2**k)."""
    wamax = w.detach().abs().reshape(w.shape[0], -1).amax(1)
    if fmt.fmt is OperandFormat.SPLIT:
        return split_fake_weight(w.detach(), compute_scale(wamax, DType.INT8), fmt.k, axis=0)
    dt = DType.INT8 if fmt.fmt is OperandFormat.INT8 else DType.INT16
    return fake_quant(w.detach(), compute_scale(wamax, dt), dt, axis=0)


def weight_sensitivity(
    model: nn.Module, batches: list[tuple], fmt: FormatChoice | None = None
) -> pd.DataFrame:
    """The vendor's "weight" sensitivity pass (j6-numerics s.9) for every Conv1d, Conv2d and
    Linear module: only that module's weight in ``fmt`` (default int8), everything else float;
    output SQNR (dB) against the float outputs. Sorted ascending (most sensitive first),
    ``rank`` from 1."""
    fmt = fmt or FormatChoice(OperandFormat.INT8)
    with torch.no_grad():
        ref = [_first_tensor(model(*b)) for b in batches]
    rows = []
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Conv1d | nn.Conv2d | nn.Linear):
            continue
        orig = mod.weight.data
        mod.weight.data = fake_weight(orig, fmt)
        try:
            with torch.no_grad():
                out = [_first_tensor(model(*b)) for b in batches]
        finally:
            mod.weight.data = orig
        r = torch.cat([o.double().reshape(-1) for o in ref])
        t = torch.cat([o.double().reshape(-1) for o in out])
        noise = float(((r - t) ** 2).sum())
        sqnr = math.inf if noise == 0 else 10 * math.log10(float((r**2).sum()) / noise)
        rows.append({"module": name, "kind": type(mod).__name__, "sqnr_db": sqnr})
    df = pd.DataFrame(rows).sort_values("sqnr_db", kind="stable").reset_index(drop=True)
    df["rank"] = range(1, len(df) + 1)
    return df


def _sqnr_estimate(ref: list, test: list):
    """Output SQNR (dB) of the outputs' first tensors, over every element, with its item count
    and 95% interval over the items (``confidence.sqnr_estimate``)."""
    from quantlab.analysis.confidence import sqnr_estimate

    return sqnr_estimate([_first_tensor(o) for o in ref], [_first_tensor(o) for o in test])


def _first_tensor(out) -> Tensor:
    if isinstance(out, Tensor):
        return out
    if isinstance(out, dict):
        out = list(out.values())
    for o in out:
        if isinstance(o, Tensor):
            return o
    raise ValueError(f"model output holds no tensor: {type(out).__name__}")


FIXED_SCHEMES = ("int8", "split_topk", "split_all")


def _weight_values(module: nn.Module) -> int:
    """A layer's stored weight values: its ``weight``, or every ``weight_*`` parameter of its
    own (a recurrent layer's input and hidden projections)."""
    w = getattr(module, "weight", None)
    if isinstance(w, Tensor):
        return int(w.numel())
    own = module.named_parameters(recurse=False)
    return sum(int(p.numel()) for n, p in own if n.startswith("weight"))


def splittable_ops(ops: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``Simulator.ops`` the high/low split applies to: supported conv1d / conv2d /
    linear calls with an INT8 weight (the platform template's weight dtype)."""
    keep = (
        ops["op_type"].isin(["conv1d", "conv2d", "linear"])
        & ops["has_weight"].astype(bool)
        & ops["supported"].astype(bool)
        & (ops["weight_dtype"] == DType.INT8.name)
    )
    return ops[keep]


def fixed_split_study(
    module: nn.Module,
    platform,
    calib: list[tuple],
    batches: list[tuple],
    metrics: list,
    labels=None,
    top_modules: list[str] = (),
    k: int = 7,
    combines: list[SplitCombine] = (SplitCombine.WIDE_ACCUMULATOR, SplitCombine.SEPARATE_REQUANT),
    progress: bool = True,
) -> pd.DataFrame:
    """The high/low weight split through the simulator in FIXED mode (activations, LUTs and
    requantization as the ``platform`` template deploys them), against the float model.

    Schemes: ``int8`` (the template), ``split_topk`` (the Conv/Linear ops of ``top_modules``,
    ``OpQConfig(weight_split=k)``) and ``split_all`` (every splittable op), the split ones once
    per combine mode (``platform.weight_split_combine``). One row per run: each task metric of
    ``metrics`` with its item count and 95% bootstrap interval (``<name>_n``, ``<name>_ci_low``,
    ``<name>_ci_high``; quantlab.analysis.confidence), ``sqnr_db`` of the outputs vs float (its
    first tensor, over every element; with its interval over the items likewise), the
    cost model's int8-MAC equivalents (``quantlab.analysis.cost``; it does not depend on the
    combine mode), weight bytes and the MACs of the second int8 pass."""
    import dataclasses

    from quantlab.analysis.confidence import estimate_metrics
    from quantlab.analysis.cost import model_cost
    from quantlab.qconfig import OpQConfig, QConfigSpec
    from quantlab.simulate import Mode, Simulator

    check_split_k(k)
    with torch.no_grad():
        ref = [module(*b) for b in batches]
    sim = Simulator(module, platform)
    sim.calibrate(calib, progress)
    ops = sim.ops
    cand = splittable_ops(ops)
    top = set(top_modules)
    chosen = {
        "int8": [],
        "split_topk": [n for n, m in zip(cand["name"], cand["module"]) if m in top],
        "split_all": list(cand["name"]),
    }
    mods = dict(module.named_modules())
    gemm = ops[ops["op_type"].isin(["conv1d", "conv2d", "linear"]) & ops["has_weight"].astype(bool)]
    wvals = {m: _weight_values(mods[m]) for m in dict.fromkeys(gemm["module"])}
    module_of = dict(zip(ops["name"], ops["module"]))
    macs = dict(zip(ops["name"], ops["flops"].astype(float) / 2))
    runs = [("int8", None)] + [(s, c) for c in combines for s in ("split_topk", "split_all")]
    rows = []
    try:
        for scheme, combine in runs:
            split = chosen[scheme]
            sim.platform = dataclasses.replace(
                platform, weight_split_combine=combine or platform.weight_split_combine
            )
            sim.set_qconfig(QConfigSpec(by_name={n: OpQConfig(weight_split=k) for n in split}))
            with torch.no_grad():
                outs = [sim.run(*b, mode=Mode.FIXED) for b in batches]
            cost_ops = ops.copy()
            cost_ops["weight_split"] = [k if n in set(split) else 0 for n in ops["name"]]
            row = {
                "scheme": scheme,
                "combine": "-" if combine is None else combine.name,
                "k": k if split else 0,
                "layers_split": len(split),
            }
            for name, est in estimate_metrics(metrics, ref, outs, labels).items():
                row.update(est.as_columns(name))
            row.update(_sqnr_estimate(ref, outs).as_columns("sqnr_db"))
            row["cost_int8_mac_eq"] = model_cost(cost_ops, platform.lut_direct_int8)
            split_mods = {module_of[n] for n in split}
            row["weight_bytes"] = sum(v * (2 if m in split_mods else 1) for m, v in wvals.items())
            row["extra_int8_macs"] = sum(macs[n] for n in split)
            rows.append(row)
    finally:
        sim.platform = platform
    df = pd.DataFrame(rows)
    df["cost_rel_int8"] = df["cost_int8_mac_eq"] / float(df["cost_int8_mac_eq"].iloc[0])
    return df
