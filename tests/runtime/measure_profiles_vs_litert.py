"""How far quantlab's profiles are from LiteRT, per op family: outputs compared and differing.

Runs the same seeded one-op cases as the LiteRT tests, with zero points 0 (the profiles have
no zero points), through LiteRT and through quantlab's public numerics (``qconv2d``,
``qlinear``, ``add_float_rescale`` with the profile's requantization) followed by the
simulator's fused-activation clamp (``clamp_output``), and prints two markdown tables: the
``tflite`` profile against the reference kernels (``Kernels.REFERENCE``), and the
``onnxruntime`` profile (float32 rescale, ties to even) against the default interpreter's
XNNPACK delegate (int8 families). Run from the repository root:

    PYTHONPATH=$PWD python tests/runtime/measure_profiles_vs_litert.py [cases per family]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import litert_cases as C  # noqa: E402
import litert_models as L  # noqa: E402
from litert_models import Activation  # noqa: E402

from quantlab.numerics import DType, add_float_rescale, qconv2d, qlinear, quantize_bias  # noqa: E402
from quantlab.platforms import load_platform  # noqa: E402
from quantlab.simulate.fixed_common import clamp_output  # noqa: E402
from quantlab.simulate.qtensor import QInfo  # noqa: E402

_DTYPE = {np.dtype(np.int8): DType.INT8, np.dtype(np.int16): DType.INT16}
_BOUNDS = {Activation.NONE: None, Activation.RELU: (0.0, None), Activation.RELU6: (0.0, 6.0)}


class BiasNotExpressible(Exception):
    """No float32 bias that ``quantize_bias`` (quantlab's only bias input) maps back to the
    case's integer bias (|bias| near or above 2**24, or a division that does not round back)."""


def _float_bias(bias: np.ndarray, sx, sw) -> torch.Tensor:
    """A float32 bias that ``quantize_bias`` turns back into exactly ``bias``."""
    b = torch.from_numpy(bias.astype(np.float64))
    s = torch.as_tensor(sx, dtype=torch.float32) * torch.from_numpy(np.asarray(sw, np.float32))
    f = (b * s.to(torch.float64)).to(torch.float32)
    if not torch.equal(quantize_bias(f, float(sx), torch.from_numpy(np.asarray(sw))), b.long()):
        raise BiasNotExpressible
    return f


def _clamp(codes: torch.Tensor, scale, dtype: DType, act: Activation) -> torch.Tensor:
    bounds = _BOUNDS[act]
    if bounds is None:
        return codes
    value = codes.to(torch.float32) * float(scale)
    _, info = clamp_output((value, QInfo(dtype, torch.tensor(scale), codes)), bounds)
    return info.codes


def quantlab_conv(c: L.ConvCase, platform) -> np.ndarray:
    dt = _DTYPE[c.x.dtype]
    hw, k = c.x.shape[1:3], c.w.shape[1:3]
    out_hw = L.conv_output_size(hw, k, c.stride, c.dilation, c.padding)
    ph, pw = L.same_padding_before(hw, k, c.stride, c.dilation, c.padding)
    x = torch.from_numpy(c.x).permute(0, 3, 1, 2)
    x = torch.nn.functional.pad(
        x,
        (
            pw,
            k[1] * c.dilation[1] + c.stride[1] * out_hw[1],
            ph,
            k[0] * c.dilation[0] + c.stride[0] * out_hw[0],
        ),
    )
    if c.depth_multiplier:
        w = torch.from_numpy(c.w[0]).permute(2, 0, 1).unsqueeze(1)
        groups = c.x.shape[3]
    else:
        w = torch.from_numpy(c.w).permute(0, 3, 1, 2)
        groups = c.x.shape[3] // c.w.shape[3]
    sw = torch.from_numpy(np.broadcast_to(c.w_scale, (w.shape[0],)).copy())
    bias = _float_bias(c.bias, c.xq.scale, sw.numpy())
    y, _ = qconv2d(
        x.contiguous(),
        float(c.xq.scale),
        w.contiguous(),
        sw,
        bias,
        float(c.yq.scale),
        dt,
        platform.gemm_contract(),
        stride=c.stride,
        dilation=c.dilation,
        groups=groups,
    )
    y = y[:, :, : out_hw[0], : out_hw[1]]
    y = _clamp(y.to(torch.int64), c.yq.scale, dt, c.activation)
    return y.permute(0, 2, 3, 1).numpy().astype(c.x.dtype)


def quantlab_fc(c: L.FullyConnectedCase, platform) -> np.ndarray:
    dt = _DTYPE[c.x.dtype]
    sw = torch.from_numpy(np.broadcast_to(c.w_scale, (c.w.shape[0],)).copy())
    bias = None if c.bias is None else _float_bias(c.bias, c.xq.scale, sw.numpy())
    y, _ = qlinear(
        torch.from_numpy(c.x),
        float(c.xq.scale),
        torch.from_numpy(c.w),
        sw,
        bias,
        float(c.yq.scale),
        dt,
        platform.gemm_contract(),
    )
    return _clamp(y.to(torch.int64), c.yq.scale, dt, c.activation).numpy().astype(c.x.dtype)


def quantlab_add(c: L.AddCase, platform) -> np.ndarray:
    dt = _DTYPE[c.a.dtype]
    y = add_float_rescale(
        torch.from_numpy(c.a),
        float(c.aq.scale),
        torch.from_numpy(c.b),
        float(c.bq.scale),
        float(c.yq.scale),
        dt,
        platform.requant_round,
    )
    return _clamp(y.to(torch.int64), c.yq.scale, dt, c.activation).numpy().astype(c.a.dtype)


def families(n: int, int8_only: bool = False):
    """(label, cases, model builder, quantlab function, inputs) per op family, zero points 0."""
    i8, i16, i32, i64 = np.int8, np.int16, np.int32, np.int64
    conv = (L.conv2d_model, quantlab_conv, lambda c: [c.x])
    fc = (L.fully_connected_model, quantlab_fc, lambda c: [c.x])
    add = (L.add_model, quantlab_add, lambda c: [c.a, c.b])
    seeds = range(n)
    yield "CONV_2D int8", [C.conv_case(s, False, i8, i32, False) for s in seeds], *conv
    yield "DEPTHWISE_CONV_2D int8", [C.conv_case(s, True, i8, i32, False) for s in seeds], *conv
    fc8 = [C.fully_connected_case(s, i8, i32, False, False) for s in seeds]
    yield "FULLY_CONNECTED int8 per-tensor", fc8, *fc
    fc8 = [C.fully_connected_case(s, i8, i32, True, False) for s in seeds]
    yield "FULLY_CONNECTED int8 per-channel", fc8, *fc
    yield "ADD int8", [C.add_case(s, i8, False) for s in seeds], *add
    if int8_only:
        return
    yield "CONV_2D 16x8 int64 bias", [C.conv_case(s, False, i16, i64) for s in seeds], *conv
    yield "CONV_2D 16x8 int32 bias", [C.conv_case(s, False, i16, i32) for s in seeds], *conv
    dw16 = [C.conv_case(s, True, i16, i64) for s in seeds]
    yield "DEPTHWISE_CONV_2D 16x8 int64 bias", dw16, *conv
    fc16 = [C.fully_connected_case(s, i16, i64, s % 2 == 0) for s in seeds]
    yield "FULLY_CONNECTED 16x8 int64 bias", fc16, *fc
    fc16 = [C.fully_connected_case(s, i16, i32, s % 2 == 0) for s in seeds]
    yield "FULLY_CONNECTED 16x8 int32 bias", fc16, *fc
    yield "ADD int16", [C.add_case(s, i16) for s in seeds], *add


def table(title: str, platform, kernels: L.Kernels, rows) -> None:
    """Print one markdown table: per family, outputs compared and differing (by case variant)."""
    print(f"\n{title}\n")
    variants = list(C.Variant)
    head = " | ".join(f"differing, {v.value} cases" for v in variants)
    print(f"| op family | cases | outputs | differing | cases with a difference | {head} |")
    print("|---" * (5 + len(variants)) + "|")
    for label, cases, build, ours, inputs in rows:
        outputs = differing = bad_cases = skipped = 0
        by_variant = dict.fromkeys(variants, 0)
        for seed, c in enumerate(cases):
            try:
                mine = ours(c, platform)
            except BiasNotExpressible:
                skipped += 1
                continue
            theirs = L.run(build(c), inputs(c), kernels).y
            d = int((mine != theirs).sum())
            outputs += theirs.size
            differing += d
            bad_cases += d > 0
            by_variant[C.variant_of(seed, not label.startswith("ADD"))] += d
        note = f" ({skipped} skipped: bias not reachable from float32)" if skipped else ""
        cols = " | ".join(str(by_variant[v]) for v in variants)
        print(
            f"| {label} | {len(cases) - skipped}{note} | {outputs} | {differing} | {bad_cases} "
            f"| {cols} |"
        )


def main(n: int) -> None:
    table(
        f"quantlab `tflite` profile vs LiteRT reference kernels ({n} cases per family)",
        load_platform("tflite"),
        L.Kernels.REFERENCE,
        families(n),
    )
    table(
        f"quantlab `onnxruntime` profile vs LiteRT default interpreter, XNNPACK ({n} cases)",
        load_platform("onnxruntime"),
        L.Kernels.DEFAULT,
        families(n, int8_only=True),
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
