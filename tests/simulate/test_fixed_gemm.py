"""Fixed-mode GEMMs through the simulator: bit-exact against the integer reference (also for an
activation used as a per-tensor weight with a bias over many channel chunks), the exactness
flags pinned inside the kernels and restored, and the start-up self-test honoured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from torch import nn
from torch.overrides import TorchFunctionMode

from quantlab.numerics import reference as ref
from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import quantize
from quantlab.numerics.requant import Requant
from quantlab.numerics.rounding import Round
from quantlab.simulate import Mode, Simulator

ROOT = Path(__file__).resolve().parents[2]


class _ActivationWeight(nn.Module):
    """sigmoid(linear(x, 2 z, b)): an activation as a per-tensor-scaled weight, with a bias."""

    def __init__(self) -> None:
        super().__init__()
        self.b = nn.Parameter(torch.linspace(-1.0, 1.0, 64))

    def forward(self, x, z):
        return torch.sigmoid(F.linear(x, z * 2.0, self.b))


def test_activation_weight_with_bias_over_many_channel_chunks_matches_reference():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(8192, 16, generator=g)
    z = torch.randn(64, 16, generator=g) * 0.3
    sim = Simulator(_ActivationWeight(), "j6m")
    sim.calibrate([(x, z)])
    trace = sim.trace(x, z, mode=Mode.FIXED)
    ops = sim.ops.set_index("name")
    lin = next(n for n in trace.order if ops.loc[n, "op_type"] == "linear")
    mul = next(n for n in trace.order if ops.loc[n, "op_type"] == "mul")
    rq = sim.qconfig_of(lin)
    p = sim.platform
    assert p.requant is Requant.MUL_SHIFT and p.requant_round is Round.HALF_UP
    xs = sim.act_scale(lin, "in0", DType.INT8, rq)
    xq = quantize(x, xs, DType.INT8, p.fake_round)
    w = trace.qinfo[mul]
    so = sim.act_scale(lin, "out", DType.INT8, rq)
    got = trace.qinfo[lin].codes.to(torch.int64)
    acc = ref.int_linear(xq, w.codes) + ref.quantize_bias(sim.model.b.detach(), xs, w.scale)
    acc, _ = ref.accumulate(acc)
    real = float(np.float64(np.float32(xs)) * np.float64(np.float32(w.scale)))
    real /= float(np.float64(np.float32(so)))
    # every element of the chunk-boundary columns, and a random sample of the rest
    cols = [0, 31, 32, 33, 63]
    rows = torch.randint(0, 8192, (3000,), generator=g)
    idx = [(int(r), c) for r in rows[:60] for c in cols]
    idx += [(int(r), int(c)) for r, c in zip(rows, torch.randint(0, 64, (3000,), generator=g))]
    sel = np.array([acc[i, j] for i, j in idx], dtype=np.int64)
    want = ref.requantize(sel, real, Requant.MUL_SHIFT, DType.INT8, Round.HALF_UP)
    assert_bits_equal(
        torch.tensor([int(got[i, j]) for i, j in idx]), torch.from_numpy(want.astype(np.int64))
    )


def _effective(backend: str, op: str) -> str:
    get = torch._C._get_fp32_precision_getter
    for b, o in ((backend, op), (backend, "all"), ("generic", "all")):
        v = get(b, o)
        if v != "none":
            return v
    return "none"


def _flags() -> dict:
    return {
        "mkldnn_conv": _effective("mkldnn", "conv"),
        "mkldnn_matmul": _effective("mkldnn", "matmul"),
        "nnpack": torch._C._get_nnpack_enabled(),
    }


def _settings() -> dict:
    get = torch._C._get_fp32_precision_getter
    pairs = (
        [("generic", "all")]
        + [("mkldnn", o) for o in ("all", "matmul", "conv", "rnn")]
        + [("cuda", o) for o in ("all", "matmul", "conv", "rnn")]
    )
    out = {f"{b}.{o}": get(b, o) for b, o in pairs}
    out["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    out["nnpack"] = torch._C._get_nnpack_enabled()
    out["threads"] = torch.get_num_threads()
    return out


class _FloatGemmRecorder(TorchFunctionMode):
    """Records the precision flags in force at every float32 conv / matmul it sees."""

    FUNCS = (F.conv1d, F.conv2d, torch.matmul, F.linear, torch.Tensor.matmul)

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.FUNCS and any(
            isinstance(a, torch.Tensor) and a.dtype == torch.float32 for a in args[:2]
        ):
            self.seen.append(_flags())
        return func(*args, **kwargs)


@pytest.fixture
def user_flags():
    """A user who asked for reduced-precision float32 kernels (restored after the test)."""
    before = _settings()
    prev_mm = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    torch.backends.mkldnn.conv.fp32_precision = "bf16"
    torch.backends.nnpack.set_flags(True)
    yield _settings()
    torch.backends.mkldnn.conv.fp32_precision = before["mkldnn.conv"]
    torch.set_float32_matmul_precision(prev_mm)
    torch.backends.mkldnn.matmul.fp32_precision = before["mkldnn.matmul"]
    torch._C._set_fp32_precision_setter("cuda", "matmul", before["cuda.matmul"])
    torch.backends.nnpack.set_flags(before["nnpack"])
    assert _settings() == before


def _conv_model() -> nn.Module:
    """int8 dense convolutions and a linear (the INT32 path) and a depthwise one (float32: 36
    output positions for 25 taps are below ``DEPTHWISE_MIN_POSITIONS_PER_TAP``)."""
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 5, padding=2, groups=16),
        nn.Conv2d(16, 8, 1),
        nn.Flatten(),
        nn.Linear(8 * 6 * 6, 10),
    )


def test_fast_gemm_paths_pin_exact_flags_and_restore_the_users(user_flags):
    g = torch.Generator().manual_seed(1)
    sim = Simulator(_conv_model(), "j6m")
    sim.calibrate([(torch.randn(2, 3, 6, 6, generator=g),)])
    rec = _FloatGemmRecorder()
    with rec:
        sim.run(torch.randn(2, 3, 6, 6, generator=g), mode=Mode.FIXED)
    assert rec.seen, "no float32 GEMM ran: the fast paths were not exercised"
    exact = {"mkldnn_conv": ("ieee", "none"), "mkldnn_matmul": ("ieee", "none")}
    for flags in rec.seen:
        assert flags["mkldnn_conv"] in exact["mkldnn_conv"], flags
        assert flags["mkldnn_matmul"] in exact["mkldnn_matmul"], flags
        assert flags["nnpack"] is False, flags
    assert _settings() == user_flags


SELFTEST_PROBE = r"""
import dataclasses, json, warnings
import torch, torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
import quantlab.numerics.selftest as st
from quantlab.numerics.gemm import GemmPath
from quantlab.simulate import Mode, Simulator

real = st.run_selftest
state = {"runs": 0, "inside": False, "float32_convs": 0}

def failing_float32():
    state["runs"] += 1
    state["inside"] = True
    try:
        cases = real()
    finally:
        state["inside"] = False
    return [dataclasses.replace(c, mismatches=1) if c.path is GemmPath.FLOAT32 else c
            for c in cases]

st.run_selftest = failing_float32

class Count(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.conv2d and args[0].dtype == torch.float32 and not state["inside"]:
            state["float32_convs"] += 1
        return func(*args, **(kwargs or {}))

torch.manual_seed(0)
model = nn.Sequential(  # the depthwise conv would take FLOAT32 if it were not disabled
    nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=8),
    nn.Conv2d(8, 4, 1),
)
sim = Simulator(model, "j6m")
sim.calibrate([(torch.randn(1, 3, 8, 8),)])
with warnings.catch_warnings(record=True) as caught, Count():
    warnings.simplefilter("always")
    y = sim.run(torch.randn(1, 3, 8, 8), mode=Mode.FIXED)
state["warned"] = any("self-test" in str(w.message) for w in caught)
state.pop("inside")
print(json.dumps(state))
"""


def test_fast_conv_path_runs_the_selftest_and_avoids_a_path_it_disabled():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", SELFTEST_PROBE],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    state = json.loads(out.stdout.strip().splitlines()[-1])
    assert state == {"runs": 1, "float32_convs": 0, "warned": True}, out.stderr[-2000:]


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
@pytest.mark.usefixtures("int8_product_fast")
def test_fixed_codes_are_the_same_with_and_without_the_int8_product(platform, monkeypatch):
    """The INT32 path (int8 convolutions and linears by torch's int8 matrix product) and the
    float paths AUTO takes without it give a fixed run the same bits."""
    import quantlab.numerics.gemm.kernels as kernels
    from quantlab.numerics.gemm import GemmPath, exact

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 8, 1),
        nn.Flatten(),
        nn.Linear(8 * 6 * 6, 10),
    ).eval()
    calib = [(torch.randn(4, 3, 6, 6),), (torch.randn(4, 3, 6, 6),)]
    x = torch.randn(4, 3, 6, 6) * 1.5
    int32_calls = []
    for fn in ("int8_matmul_int32", "int8_conv_int32"):
        real = getattr(kernels, fn)
        monkeypatch.setattr(kernels, fn, lambda *a, real=real: int32_calls.append(1) or real(*a))
    runs = []
    for disabled in (frozenset(), frozenset({GemmPath.INT32})):
        monkeypatch.setattr(exact, "ensure_selftest", lambda d=disabled: d)
        sim = Simulator(model, platform)
        sim.calibrate(calib, progress=False)
        runs.append(sim.run(x, mode=Mode.FIXED))
        if not disabled:
            assert len(int32_calls) == 3  # the two convolutions and the linear
    assert len(int32_calls) == 3
    assert_bits_equal(runs[0], runs[1])


@pytest.mark.usefixtures("int8_product_fast")
def test_int8_weights_on_the_int8_product_keep_no_float32_copy():
    """A weight whose GEMM takes the INT32 path is read as int8 codes: the simulator keeps no
    float32 cast of it; a depthwise conv (float32 path) keeps one."""
    from quantlab.numerics.gemm import GemmPath

    sim = Simulator(_conv_model(), "j6m")
    sim.calibrate([(torch.randn(2, 3, 6, 6),)], progress=False)
    sim.run(torch.randn(2, 3, 6, 6), mode=Mode.FIXED)
    convs = {name: memo["conv"][1] for name, memo in sim._fast.items() if "conv" in memo}
    assert len(convs) == 3
    for conv in convs.values():
        int8_product = conv.plan.path is GemmPath.INT32
        assert int8_product == (conv.groups == 1)
        assert (conv.w_float32 is None) == int8_product
    assert not any("w_float32" in memo for memo in sim._fast.values())  # the linear


class _PathSpy:
    """Records the plan path, the convolution and the input codes' dtype of every exact
    convolution a run makes."""

    def __init__(self, monkeypatch) -> None:
        from quantlab.numerics.gemm import exact

        self.paths: list = []
        self.ops: list = []
        real = exact.conv_planned

        def spy(x, w, conv, kw, groups, cin_g, plan, *args, **kwargs):
            self.paths.append(plan.path)
            self.ops.append(("conv1d" if conv is F.conv1d else "conv2d", x.dtype))
            return real(x, w, conv, kw, groups, cin_g, plan, *args, **kwargs)

        monkeypatch.setattr(exact, "conv_planned", spy)


@pytest.mark.parametrize("case", ["int8", "int16", "conv1d"])
def test_depthwise_convs_on_the_c_loop_give_the_float_paths_bits(monkeypatch, case):
    """A depthwise convolution large enough for INT32_DEPTHWISE runs on it with no float32
    copy of its weight (int8 inputs, planned once), and the model's fixed-mode output has the
    same bits as with the path unavailable (torch's float32 or float64 convolution): int8 and
    int16 activations (int16: planned per call from the measured codes), and a conv1d."""
    from quantlab.numerics.gemm import GemmPath, depthwise_native
    from quantlab.qconfig import OpQConfig, QConfigSpec

    torch.manual_seed(5)
    conv = nn.Conv1d if case == "conv1d" else nn.Conv2d
    model = nn.Sequential(
        conv(3, 8, 1), nn.ReLU6(), conv(8, 16, 3, stride=2, padding=1, groups=8), nn.ReLU()
    )
    shape = (2, 3, 40) if case == "conv1d" else (2, 3, 14, 14)
    calib, x = [(torch.randn(shape),)], torch.randn(shape)
    spec = None
    if case == "int16":
        i16 = OpQConfig(input_dtype=DType.INT16, output_dtype=DType.INT16)
        spec = QConfigSpec(by_type={"conv2d": i16})
    op_type = "conv1d" if case == "conv1d" else "conv2d"
    outs, paths = [], []
    spy = _PathSpy(monkeypatch)
    for available in (True, False):
        if not available:
            monkeypatch.setattr(depthwise_native, "available", lambda: False)
        sim = Simulator(model, "j6m", qconfig=spec)
        sim.calibrate(calib, progress=False)
        spy.paths.clear()
        spy.ops.clear()
        outs.append(sim.run(x, mode=Mode.FIXED))
        codes = torch.int16 if case == "int16" else torch.int8
        assert spy.ops == [(op_type, codes), (op_type, codes)]
        paths.append(spy.paths[1])  # the depthwise one
        convs = [memo["conv"][1] for memo in sim._fast.values() if "conv" in memo]
        depthwise = [c for c in convs if c.groups == 8]
        assert len(depthwise) == 1
        if case != "int16":
            assert (depthwise[0].w_float32 is None) == available
    assert paths[0] is GemmPath.INT32_DEPTHWISE
    assert paths[1] is not GemmPath.INT32_DEPTHWISE
    assert_bits_equal(outs[0], outs[1])


def test_a_slow_int8_product_gets_float32_weight_copies_made_once(monkeypatch):
    """Where the int8 product is slower than float32 (``gemm.int8_speed``), AUTO runs the float
    paths: every weight, the linear's too, gets its float32 cast once, not per call."""
    from quantlab.numerics.gemm import GemmPath, int8_speed

    monkeypatch.setitem(int8_speed._STATE, "ratio", 40.0)
    sim = Simulator(_conv_model(), "j6m")
    sim.calibrate([(torch.randn(2, 3, 6, 6),)], progress=False)
    x = torch.randn(2, 3, 6, 6)
    first = sim.run(x, mode=Mode.FIXED)
    convs = {name: memo["conv"][1] for name, memo in sim._fast.items() if "conv" in memo}
    assert all(
        c.plan.path is not GemmPath.INT32 and c.w_float32 is not None for c in convs.values()
    )
    casts = [memo["w_float32"][1] for memo in sim._fast.values() if "w_float32" in memo]
    assert len(casts) == 1  # the linear
    assert_bits_equal(sim.run(x, mode=Mode.FIXED), first)
    again = [memo["w_float32"][1] for memo in sim._fast.values() if "w_float32" in memo]
    assert again[0] is casts[0]


class _SaturatingNet(nn.Module):
    """conv -> depthwise conv -> linear with one-signed weights near their maximum: on positive
    inputs (uint8 codes near 255) adjacent product pairs exceed int16."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(11)
        self.conv = nn.Conv2d(8, 6, 3, padding=1)
        self.dw = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.fc = nn.Linear(6 * 5 * 5, 4)
        with torch.no_grad():
            for m in (self.conv, self.dw, self.fc):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) * 0.2 + 0.8)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)

    def forward(self, x):
        return self.fc(torch.flatten(self.dw(self.conv(x)), 1))


def test_fixed_mode_sums_saturated_pairs_on_the_no_vnni_profile():
    """Under ``onnxruntime_no_vnni`` every int8-weight conv / linear of the simulator gives the
    codes of ``qconv2d`` / ``qlinear`` on the runtime's uint8 codes (code + 128, zero point 128)
    under that profile's contract (the op kernels checked against the reference and against
    onnxruntime); the depthwise conv stays exact; and the pairs do saturate here (the exact
    profile's codes differ)."""
    from quantlab.numerics.gemm import qconv2d, qlinear, quantize_bias
    from quantlab.qconfig import OpQConfig, QConfigSpec

    model = _SaturatingNet().eval()
    spec = QConfigSpec(global_=OpQConfig(high_precision_output=False))
    g = torch.Generator().manual_seed(12)
    calib = [(torch.rand(2, 8, 5, 5, generator=g) * 4,) for _ in range(2)]
    x = torch.rand(3, 8, 5, 5, generator=g) * 4
    runs = {}
    for name in ("onnxruntime", "onnxruntime_no_vnni"):
        sim = Simulator(model, name, spec)
        sim.calibrate(calib, progress=False)
        runs[name] = (sim, sim.trace(x, mode=Mode.FIXED))
    sim, trace = runs["onnxruntime_no_vnni"]
    p = sim.platform
    assert p.u8s8_pair_saturation and p.qlinear_zero_point == 128
    names = {n: m for n, m in zip(("conv", "dw", "fc"), (model.conv, model.dw, model.fc))}
    ops = {n.split(":")[0]: n for n in trace.order if n.split(":")[0] in names}
    s_in = sim.act_scale(ops["conv"], "in0", DType.INT8, sim.qconfig_of(ops["conv"]))
    inputs = {
        "conv": (quantize(x, s_in, DType.INT8, p.fake_round), s_in),
        "dw": (trace.qinfo[ops["conv"]].codes, trace.qinfo[ops["conv"]].scale),
        "fc": (
            torch.flatten(trace.qinfo[ops["dw"]].codes, 1),
            trace.qinfo[ops["dw"]].scale,
        ),
    }
    for key, mod in names.items():
        op = ops[key]
        xc, xs = inputs[key]
        wc, ws = sim.weight_q(op, mod.weight, DType.INT8, True)
        bias = quantize_bias(mod.bias.detach(), xs, ws)
        out = trace.qinfo[op]
        u8 = (xc.to(torch.int16) + 128).to(torch.uint8)
        kind = "linear" if key == "fc" else "conv2d"
        contract = p.gemm_contract(kind, key == "fc", activation=DType.INT8)
        assert contract.u8s8_pair_saturation
        if key == "fc":  # the model output: a high-precision (float32) value
            assert out is None
            want, _ = qlinear(u8, xs, wc, ws, bias, None, DType.FLOAT32, contract, (128, 0))
            assert_bits_equal(trace.outputs[op], want)
        else:
            want, _ = qconv2d(
                u8,
                xs,
                wc,
                ws,
                bias,
                out.scale,
                DType.INT8,
                contract,
                padding=1,
                groups=mod.groups,
                zero_points=(128, 0),
            )
            assert_bits_equal(out.codes, want)
    exact = runs["onnxruntime"][1]
    assert not torch.equal(exact.qinfo[ops["conv"]].codes, trace.qinfo[ops["conv"]].codes)
