"""Average pools whose windows hold different numbers of values (padding with or without
count_include_pad, ceil_mode, divisor_override, adaptive sizes that do not divide, their 1-d
forms, and area interpolation, which torch computes as adaptive pooling) run their integer
kernel on platforms that sum windows exactly (``INTEGER_SUM``): each
window's sum of centred codes requantized by the ratio of scales over its own count, checked
code for code against a slow loop over the windows and the requantization reference, with
zero points (tflite) and without (j6m, int8 and int16 outputs)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from float_fallbacks import record_float_fallbacks
from pool_reference import slow_adaptive, slow_avg_pool
from program_switch import build_in_first_run
from torch import nn

from quantlab.numerics import reference as R
from quantlab.numerics.dtypes import DType
from quantlab.numerics.requant import rescale_multiplier
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator

POOLS = {  # name -> the pool on the convolution's output (N, 4, 9, 10)
    "pad_no_count": lambda y: F.avg_pool2d(y, 3, 1, 1, count_include_pad=False),
    "pad_count": lambda y: F.avg_pool2d(y, 3, 2, 1),
    "ceil": lambda y: F.avg_pool2d(y, 2, 2, ceil_mode=True),
    "ceil_pad": lambda y: F.avg_pool2d(y, 3, 2, 1, True, False),
    "divisor": lambda y: F.avg_pool2d(y, 3, 1, 1, divisor_override=5),
    "adaptive": lambda y: F.adaptive_avg_pool2d(y, (5, 4)),
    "adaptive_module": nn.AdaptiveAvgPool2d((None, 6)),
    "pad_1d": lambda y: F.avg_pool1d(y.flatten(2), 3, 2, 1, count_include_pad=False),
    "adaptive_1d": lambda y: F.adaptive_avg_pool1d(y.flatten(2), 7),
    # torch's area interpolation is adaptive average pooling to the output size
    "area": lambda y: F.interpolate(y, size=(5, 4), mode="area"),
    "area_1d": lambda y: F.interpolate(y.flatten(2), scale_factor=0.08, mode="area"),
}
ADAPTIVE_OUT = {  # the adaptive cases' output sizes (None: the input's)
    "adaptive": (5, 4),
    "adaptive_module": (None, 6),
    "adaptive_1d": 7,
    "area": (5, 4),
    "area_1d": 7,  # floor(90 * 0.08)
}


class _Pool(nn.Module):
    def __init__(self, pool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3)
        self.pool = pool

    def forward(self, x):
        return self.pool(self.conv(x))


WINDOWS = {  # the other cases' (kernel, stride, padding, ceil_mode, count_include_pad, divisor)
    "pad_no_count": ((3, 3), (1, 1), (1, 1), False, False, None),
    "pad_count": ((3, 3), (2, 2), (1, 1), False, True, None),
    "ceil": ((2, 2), (2, 2), (0, 0), True, True, None),
    "ceil_pad": ((3, 3), (2, 2), (1, 1), True, False, None),
    "divisor": ((3, 3), (1, 1), (1, 1), False, True, 5),
    "pad_1d": ((1, 3), (1, 2), (0, 1), False, False, None),
}


def _reference(pool_name: str, xc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sums, counts per output element) of the pool over centred codes by the slow loops of
    ``pool_reference`` (torch's window rule, Python integers); 1-d pools as height-1 images."""
    squeeze = xc.dim() == 3
    x = xc.unsqueeze(2) if squeeze else xc
    if pool_name in ADAPTIVE_OUT:
        osz = ADAPTIVE_OUT[pool_name]
        osz = (1, osz) if squeeze else osz
        sums, counts = slow_adaptive(x, *(n if o is None else o for o, n in zip(osz, x.shape[2:])))
    else:
        sums, counts = slow_avg_pool(x, *WINDOWS[pool_name])
    counts = counts.expand(sums.shape)
    return (sums.squeeze(2), counts.squeeze(2)) if squeeze else (sums, counts)


@pytest.mark.parametrize("platform, out", [("j6m", "INT8"), ("j6m", "INT16"), ("tflite", "INT8")])
@pytest.mark.parametrize("pool_name", list(POOLS))
def test_uneven_pools_requantize_each_window_by_its_own_count(
    pool_name, platform, out, monkeypatch
):
    pool = POOLS[pool_name]
    pools = ("avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d")
    wanted = ("interpolate",) if pool_name.startswith("area") else pools
    spec = QConfigSpec(by_type={t: OpQConfig(output_dtype=DType[out]) for t in wanted})
    if platform == "tflite":
        spec.global_ = OpQConfig(activation_symmetry="ASYMMETRIC")
    sim = Simulator(_Pool(pool).eval(), platform, spec)
    gen = torch.Generator().manual_seed(1)
    sim.calibrate(
        [(torch.randn(2, 3, 11, 12, generator=gen) + 0.3,) for _ in range(3)], progress=False
    )
    fell_back = record_float_fallbacks(monkeypatch)
    seen = {}

    def on_call(oc):
        seen[oc.call.op_type] = (oc.call.args, oc.incoming)

    trace = sim.trace(
        torch.randn(2, 3, 11, 12, generator=gen) + 0.3, mode=Mode.FIXED, on_call=on_call
    )
    assert fell_back == []
    name = next(n for n in trace.qinfo if "pool" in n or "interpolate" in n)
    op_type = next(t for t in seen if "pool" in t or t == "interpolate")
    args, (xi, *_) = seen[op_type]
    xc = xi.codes_of(args[0]) - xi.zero_point
    yi = trace.qinfo[name]
    assert yi.dtype is DType[out]
    if platform == "tflite" and out == "INT8":
        assert xi.zero_point != 0 and yi.zero_point != 0
    sums, counts = _reference(pool_name, xc)
    p = sim.platform
    want = torch.empty_like(sums)
    for n in torch.unique(counts).tolist():
        real = float(rescale_multiplier(xi.scale, yi.scale, p.requant, n))
        at = counts == n
        got = R.requantize(sums[at], real, p.requant, yi.dtype, p.requant_round,
                           mult_bits=p.requant_mult_bits, zero_point=yi.zero_point)  # fmt: skip
        want[at] = torch.from_numpy(got).to(torch.int64)
    if pool_name not in ("divisor", "pad_count"):  # those divide every window alike
        assert torch.unique(counts).numel() > 1  # the windows do differ
    assert_bits_equal(yi.codes, want.to(yi.dtype.torch_dtype))


@pytest.mark.parametrize("platform", ["onnxruntime", "j6m"])
def test_runtime_profiles_keep_their_own_pool_rules(platform, monkeypatch):
    """onnxruntime (FLOAT_WINDOW_SUM: QLinearAveragePool) takes padded pools its own way and
    leaves ceil_mode and adaptive sizes that do not divide to float, as before; the ops table
    says which (``fixed_in_float``), through the steady runs that follow too."""
    for pool_name, falls in (("pad_no_count", False), ("ceil", True), ("adaptive", True)):
        falls = falls and platform == "onnxruntime"
        sim = Simulator(_Pool(POOLS[pool_name]).eval(), platform)
        sim.calibrate([(torch.randn(2, 3, 11, 12),)], progress=False)
        fell_back = record_float_fallbacks(monkeypatch)
        for _ in range(4):  # past the switch to a steady program
            sim.run(torch.randn(2, 3, 11, 12), mode=Mode.FIXED)
        assert bool(fell_back) is falls, pool_name
        declined = dict(zip(sim.ops["name"], sim.ops["fixed_in_float"]))
        assert [n for n, d in declined.items() if d] == (fell_back[:1] if falls else [])


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_uneven_pools_become_a_traced_program_with_the_captured_bits(monkeypatch, mode):

    build_in_first_run(monkeypatch)
    gen = torch.Generator().manual_seed(5)
    calib = [(torch.randn(2, 3, 11, 12, generator=gen),) for _ in range(2)]
    xs = [torch.randn(2, 3, 11, 12, generator=gen) * s for s in (0.5, 2.0)]
    for pool_name in ("ceil_pad", "adaptive", "area", "pad_1d"):
        captured = Simulator(_Pool(POOLS[pool_name]).eval(), "j6m", steady_programs=False)
        captured.calibrate(calib, progress=False)
        steady = Simulator(_Pool(POOLS[pool_name]).eval(), "j6m")
        steady.share_calibration(captured)
        for x in xs * 3:
            assert_bits_equal(steady.run(x, mode=mode), captured.run(x, mode=mode))
        state = steady.steady_programs.status((xs[0],), mode)
        assert state.program is not None and state.program.fallbacks == 0, pool_name
