"""LiteRT's integer resize kernels (``numerics.litert_resize``): RESIZE_NEAREST_NEIGHBOR's
indices under both interpreters (torch maps some sizes otherwise); RESIZE_BILINEAR, its own
kernel's codes (reference kernels, and the builtin kernel the default interpreter runs for int16) on
int8 and int16 codes with any zero point, and XNNPACK's (the default interpreter's int8
resize), on up- and downsampling, half-pixel centres, align_corners and neither, one row or
column, and the extreme codes; the two kernels differ. The tflite and litert_xnnpack
profiles' fixed mode computes each bilinear and linear ``F.interpolate`` of a model as
LiteRT's reference kernels and its default interpreter do, at the input's scale, with no float
fallback, and nearest and nearest-exact as RESIZE_NEAREST_NEIGHBOR; fake mode quantizes each
at the input's scale too."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("ai_edge_litert")

import litert_models as L  # noqa: E402
from bits import assert_bits_equal  # noqa: E402
from float_fallbacks import record_float_fallbacks  # noqa: E402

from quantlab.numerics import DType  # noqa: E402
from quantlab.numerics.litert_resize import (  # noqa: E402
    axis_positions,
    tflite_nearest_indices,
    tflite_resize_bilinear,
    tflite_resize_nearest,
    xnnpack_axis,
    xnnpack_resize_bilinear,
)
from quantlab.qconfig import OpQConfig, QConfigSpec  # noqa: E402
from quantlab.simulate import Mode, Simulator  # noqa: E402

_DTYPES = {np.int8: DType.INT8, np.int16: DType.INT16}
_MAPPINGS = [(False, True), (True, False), (False, False)]  # (align_corners, half_pixel)
_SIZES = [(5, 7, 10, 14), (8, 8, 3, 5), (4, 6, 9, 13), (1, 5, 3, 11), (7, 3, 7, 3),
          (6, 1, 17, 2), (3, 4, 1, 1), (9, 10, 4, 25)]  # fmt: skip


def _ours(c: L.ResizeCase) -> np.ndarray:
    x = torch.from_numpy(c.x).permute(0, 3, 1, 2)
    y = tflite_resize_bilinear(x, _DTYPES[c.x.dtype.type], c.out_hw, c.align_corners,
                               c.half_pixel_centers)  # fmt: skip
    return y.permute(0, 2, 3, 1).numpy()


@pytest.mark.parametrize("dtype", [np.int8, np.int16])
@pytest.mark.parametrize(("align", "half"), _MAPPINGS)
def test_tflite_resize_gives_litert_codes(dtype, align, half):
    rng = np.random.default_rng(_MAPPINGS.index((align, half)) + 10 * (dtype is np.int16))
    info = np.iinfo(dtype)
    for h, w, oh, ow in _SIZES:
        if align and half:
            continue
        x = rng.integers(info.min, info.max + 1, (2, h, w, 3)).astype(dtype)
        x[0, 0, 0, :] = info.min  # the extreme codes
        x[-1, -1, -1, :] = info.max
        zp = 0 if dtype is np.int16 else int(rng.integers(-128, 128))
        c = L.ResizeCase(x, L.QParams(np.float32(0.05), zp), (oh, ow), align, half)
        model = L.resize_model(c)
        want = L.run(model, [x], L.Kernels.REFERENCE).y
        assert_bits_equal(torch.from_numpy(_ours(c)), torch.from_numpy(want))
        if dtype is np.int16:  # the default interpreter runs LiteRT's own kernel for int16
            default = L.run(model, [x], L.Kernels.DEFAULT)
            assert not default.delegated
            assert_bits_equal(torch.from_numpy(default.y), torch.from_numpy(want))


@pytest.mark.parametrize(("align", "half"), _MAPPINGS)
def test_xnnpack_resize_gives_the_default_interpreters_int8_codes(align, half):
    """XNNPACK takes every int8 case, and its codes are not LiteRT's own kernel's."""
    rng = np.random.default_rng(20 + _MAPPINGS.index((align, half)))
    differ = 0
    for _ in range(40):
        h, w = (int(v) for v in rng.integers(1, 12, 2))
        out_hw = tuple(int(v) for v in rng.integers(1, 30, 2))
        x = rng.integers(-128, 128, (2, h, w, 3)).astype(np.int8)
        x[0, 0, 0, :], x[-1, -1, -1, :] = -128, 127
        c = L.ResizeCase(x, L.QParams(np.float32(0.05), int(rng.integers(-128, 128))), out_hw,
                         align, half)  # fmt: skip
        default = L.run(L.resize_model(c), [x], L.Kernels.DEFAULT)
        assert default.delegated
        got = xnnpack_resize_bilinear(torch.from_numpy(x).permute(0, 3, 1, 2), out_hw, align,
                                      half).permute(0, 2, 3, 1)  # fmt: skip
        assert_bits_equal(got, torch.from_numpy(default.y))
        differ += int((default.y != _ours(c)).sum())
    assert differ > 0


def test_positions_and_weights():
    """2x upsampling with half-pixel centres: scale 512, positions 512 i - 256; the first
    output reads the first pixel with weights 1280 and -256 (the two neighbours coincide)."""
    lo, hi, w_lo, w_hi = axis_positions(4, 8, False, True)
    assert lo.tolist() == [0, 0, 0, 1, 1, 2, 2, 3]
    assert hi.tolist() == [0, 1, 1, 2, 2, 3, 3, 3]
    assert (w_lo + w_hi).eq(1024).all() and (w_lo[0], w_hi[0]) == (1280, -256)
    with pytest.raises(ValueError, match="read past the input"):
        axis_positions(1, 2000, False, True)
    with pytest.raises(ValueError, match="not both"):
        axis_positions(4, 8, True, True)
    with pytest.raises(ValueError, match="int8 or int16"):
        tflite_resize_bilinear(torch.zeros(1, 1, 2, 2, dtype=torch.int32), DType.INT32, (4, 4))
    # XNNPACK: ratio fl32(4 / 8) = 0.5, positions 0.5 i - 0.25 clamped at 0, weights in 1/2048
    lo, hi, a = xnnpack_axis(4, 8, False, True)
    assert lo.tolist() == [0, 0, 0, 1, 1, 2, 2, 3] and hi.tolist() == [1, 1, 1, 2, 2, 3, 3, 3]
    assert a.tolist() == [0, 512, 1536, 512, 1536, 512, 1536, 0]


_NEAREST_MAPPINGS = [(False, False), (False, True), (True, False)]  # (align, half_pixel)


@pytest.mark.parametrize("dtype", [np.int8, np.int16])
@pytest.mark.parametrize(("align", "half"), _NEAREST_MAPPINGS)
def test_tflite_nearest_gives_litert_codes(dtype, align, half):
    """RESIZE_NEAREST_NEIGHBOR under both interpreters (XNNPACK takes none) on sizes up to
    40 -> 80 pixels per axis."""
    rng = np.random.default_rng(30 + _NEAREST_MAPPINGS.index((align, half)))
    info = np.iinfo(dtype)
    for _ in range(30):
        h, w = (int(v) for v in rng.integers(1, 40, 2))
        out_hw = tuple(int(v) for v in rng.integers(1, 80, 2))
        x = rng.integers(info.min, info.max + 1, (1, h, w, 2)).astype(dtype)
        c = L.ResizeCase(x, L.QParams(np.float32(0.05), 0), out_hw, align, half, nearest=True)
        got = tflite_resize_nearest(torch.from_numpy(x).permute(0, 3, 1, 2), out_hw, align, half)
        for kernels in L.Kernels:
            r = L.run(L.resize_model(c), [x], kernels)
            assert not r.delegated
            assert_bits_equal(got.permute(0, 2, 3, 1), torch.from_numpy(r.y))


def test_torch_nearest_maps_some_sizes_otherwise():
    """Why LiteRT's mapping is emulated: torch's "nearest" by a scale factor, and its 1-d
    "nearest-exact" by size, read other pixels than LiteRT's for some sizes."""
    by_factor = by_exact = 0
    for n_in in range(1, 40):
        x = torch.arange(n_in, dtype=torch.float64).view(1, 1, 1, n_in)
        t = F.interpolate(x, scale_factor=(1.0, 1.7), mode="nearest").long().view(-1)
        by_factor += not torch.equal(t, tflite_nearest_indices(n_in, t.numel()))
        for n_out in range(1, 80):  # torch's 1-d kernel (its 2-d one agrees with LiteRT here)
            t = F.interpolate(x[0], size=n_out, mode="nearest-exact").long().view(-1)
            by_exact += not torch.equal(t, tflite_nearest_indices(n_in, n_out, False, True))
    assert by_factor > 0 and by_exact > 0


CALLS = [  # F.interpolate keyword arguments
    dict(mode="bilinear", scale_factor=2.0),
    dict(mode="bilinear", size=(5, 9), align_corners=True),
    dict(mode="bilinear", scale_factor=(0.6, 1.5)),
    dict(mode="bilinear", scale_factor=1.7, recompute_scale_factor=True),
    dict(mode="nearest", scale_factor=1.7),  # torch maps by 1 / 1.7, LiteRT by 7 / 11
    dict(mode="nearest", size=(4, 9)),
    dict(mode="nearest-exact", size=(12, 3)),
]
ROWS = [
    dict(mode="linear", scale_factor=2.5),
    dict(mode="linear", size=3, align_corners=True),
    dict(mode="nearest", size=11),
]


class _Resized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = torch.tanh(self.conv(x))
        outs = [F.interpolate(y, **kw) for kw in CALLS]
        outs += [F.interpolate(y[:, :, 0, :], **kw) for kw in ROWS]
        return [o.mean(-1) for o in outs]


_PROFILES = {"tflite": L.Kernels.REFERENCE, "litert_xnnpack": L.Kernels.DEFAULT}


@pytest.mark.parametrize("platform", list(_PROFILES))
@pytest.mark.parametrize(("symmetry", "dtype"), [("ASYMMETRIC", "INT8"), ("SYMMETRIC", "INT16")])
def test_litert_profiles_resize_as_litert(platform, symmetry, dtype, monkeypatch):
    """Each interpolate's codes are LiteRT's RESIZE_BILINEAR or RESIZE_NEAREST_NEIGHBOR of the
    codes it received (run in LiteRT at the input's scale and zero point, the size the call
    gives; bilinear with half-pixel centres or align_corners as torch's align_corners says,
    nearest-exact with half-pixel centres; the reference kernels for ``tflite``, the default
    interpreter for ``litert_xnnpack``), a 1-d input as one row."""
    torch.manual_seed(0)
    spec = QConfigSpec(global_=OpQConfig(activation_symmetry=symmetry,
                                         output_dtype=DType.parse(dtype)))  # fmt: skip
    sim = Simulator(_Resized().eval(), platform, spec)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 7, 5, generator=g),) for _ in range(2)], progress=False)
    fell_back = record_float_fallbacks(monkeypatch)
    seen = {}

    def record(oc):
        if oc.call.op_type == "interpolate":
            seen[oc.call.name] = (oc.incoming[0], oc.call.args[0], oc.call.kwargs)

    trace = sim.trace(torch.randn(2, 3, 7, 5, generator=g), mode=Mode.FIXED, on_call=record)
    assert fell_back == [] and len(seen) == len(CALLS) + len(ROWS)
    for name, (xi, x, kw) in seen.items():
        codes = xi.codes_of(x).to(xi.dtype.torch_dtype)
        got = trace.qinfo[name]
        assert (got.dtype, float(got.scale), got.zero_point) == (
            xi.dtype, float(xi.scale), xi.zero_point)  # fmt: skip
        one_row = codes.dim() == 3
        nhwc = (codes.unsqueeze(2) if one_row else codes).permute(0, 2, 3, 1).numpy()
        out = got.codes.unsqueeze(2) if one_row else got.codes
        align, mode = bool(kw.get("align_corners")), kw["mode"]
        nearest = mode.startswith("nearest")
        half = mode == "nearest-exact" if nearest else not align
        c = L.ResizeCase(np.ascontiguousarray(nhwc), L.QParams(np.float32(xi.scale),
                         xi.zero_point), tuple(out.shape[2:]), align, half, nearest)  # fmt: skip
        want = L.run(L.resize_model(c), [c.x], _PROFILES[platform]).y
        assert_bits_equal(out.permute(0, 2, 3, 1), torch.from_numpy(want))
    kernel = sim.ops.fixed_kernel[sim.ops.op_type == "interpolate"].iloc[0]
    assert ("XNNPACK" in kernel) == (platform == "litert_xnnpack") and "10-bit" in kernel


@pytest.mark.parametrize("platform", list(_PROFILES))
def test_fake_mode_holds_the_resize_at_its_inputs_quantization(platform):
    """Fake mode fake-quantizes each interpolate at its input's scale and zero point, where
    fixed mode's codes are (not at a scale calibrated for its output), as the platform
    quantizes (``quantize_codes``)."""
    from quantlab.numerics.quantize import dequantize

    torch.manual_seed(0)
    spec = QConfigSpec(global_=OpQConfig(activation_symmetry="ASYMMETRIC"))
    sim = Simulator(_Resized().eval(), platform, spec)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 7, 5, generator=g),) for _ in range(2)], progress=False)
    seen = {}

    def record(oc):
        if oc.call.op_type == "interpolate":
            seen[oc.call.name] = (oc.incoming[0], oc.call.args[0], oc.call.kwargs, oc.output)

    x = torch.randn(2, 3, 7, 5, generator=g)
    sim.trace(x, mode=Mode.FAKE, on_call=record)
    p = sim.platform
    for xi, v, kw, out in seen.values():
        y = F.interpolate(v, **kw)
        want = dequantize(p.quantize_codes(y, xi.scale, xi.dtype, xi.zero_point),
                          xi.scale, zero_point=xi.zero_point)  # fmt: skip
        assert_bits_equal(out, want)
