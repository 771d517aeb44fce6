"""Simulator acceptance: unmodified control flow in three modes, clear failures, determinism,
replay, per-op modes and the fixed-mode invariant value == codes * scale."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from torch import nn

from quantlab.analysis.metrics import float_leaves
from quantlab.models import build_model
from quantlab.numerics.dtypes import DType
from quantlab.platforms import PlatformConfig
from quantlab.qconfig import ObserverKind, OpQConfig, QConfigSpec
from quantlab.simulate import Mode, OpMode, Simulator


def _sim(name: str, platform="j6m", spec=None, batch=2):
    b = build_model(name)
    sim = Simulator(b.module, platform, spec)
    sim.calibrate([b.example_inputs(batch, 10 + i) for i in range(2)])
    return b, sim


def test_control_flow_model_runs_in_all_modes_unmodified():
    b = build_model("control_flow")
    model = b.module
    sim = Simulator(model, "j6m")
    # calibration inputs reach both heads and every loop count
    sim.calibrate([(b.example_inputs(1, s)[0] * (0.5 + s),) for s in range(6)])
    seen_paths = set()
    for seed in range(6):
        x = b.example_inputs(1, seed)[0] * (0.5 + seed)
        steps = model.steps(x)
        ref = model(x)
        outs = {}
        for m in Mode:
            outs[m] = sim.run(x, mode=m)
            if m is Mode.FLOAT:  # a plain float run captures nothing; a traced one records ops
                assert_bits_equal(sim.trace(x, mode=m).result, outs[m])
            names = list(sim.ops["name"])
            k = sum(n.startswith("block:conv2d#") for n in names)
            # one stable name per loop iteration; in FLOAT the count is the model's own
            assert [f"block:conv2d#{i}" for i in range(k)] == [
                n for n in names if n.startswith("block:conv2d#")
            ]
            if m is Mode.FLOAT:
                assert k == steps
                seen_paths.add((steps, "head_pos:linear#0" in names))
        assert_bits_equal(outs[Mode.FLOAT], ref)
        for m in (Mode.FAKE, Mode.FIXED):
            assert outs[m].shape == ref.shape
            assert torch.isfinite(outs[m]).all()
    assert len(seen_paths) >= 2  # the loop count or the branch really changed


def test_plain_float_run_is_the_model_and_captures_nothing():
    b, sim = _sim("small_cnn")
    x = b.example_inputs(3, 7)
    before = sim.ops.copy()
    sim.model.train()  # a run is in eval mode and gives the module its flag back
    with torch.no_grad():
        ref = b.module.eval()(*x)
    sim.model.train()
    out = sim.run(*x, mode=Mode.FLOAT)
    assert sim.model.training
    assert_bits_equal(out, ref)
    assert sim.ops.equals(before)  # nothing recorded: the op table is the calibration's
    assert_bits_equal(sim.trace(*x, mode=Mode.FLOAT).result, ref)


def test_int16_by_int16_conv_on_j6m_fails_naming_op_and_rule():
    spec = QConfigSpec(
        by_name={"conv2:conv2d#0": OpQConfig(input_dtype=DType.INT16, weight_dtype=DType.INT16)}
    )
    b = build_model("conv_only")
    sim = Simulator(b.module, "j6m", spec)
    with pytest.raises(ValueError) as e:
        sim.calibrate([b.example_inputs(1, 0)])
    msg = str(e.value)
    assert "conv2:conv2d#0" in msg and "int16 x int16" in msg
    assert "max_int16_gemm_operands=1" in msg
    # int16 activations with int8 weights are allowed
    ok = QConfigSpec(by_name={"conv2:conv2d#0": OpQConfig(input_dtype=DType.INT16)})
    sim.set_qconfig(ok)
    sim.calibrate([b.example_inputs(1, 0)])
    y = sim.run(*b.example_inputs(1, 1), mode=Mode.FIXED)
    assert torch.isfinite(y).all()


def test_unknown_op_name_lists_the_models_ops():
    spec = QConfigSpec(by_name={"conv9:conv2d#0": OpQConfig(output_dtype=DType.INT16)})
    b = build_model("conv_only")
    sim = Simulator(b.module, "j6m", spec)
    with pytest.raises(ValueError) as e:
        sim.calibrate([b.example_inputs(1, 0)])
    msg = str(e.value)
    assert "conv9:conv2d#0" in msg
    for name in ("conv1:conv2d#0", "conv2:conv2d#0", "conv3:conv2d#0", ":relu#0"):
        assert name in msg


def test_unknown_op_type_and_uncalibrated_run_fail_clearly():
    b = build_model("conv_only")
    sim = Simulator(b.module, "j6m", QConfigSpec(by_type={"convolution": OpQConfig()}))
    with pytest.raises(ValueError, match="unknown op type.*convolution"):
        sim.calibrate([b.example_inputs(1, 0)])
    sim2 = Simulator(b.module, "j6m")
    with pytest.raises(ValueError, match="calibrate"):
        sim2.run(*b.example_inputs(1, 0), mode=Mode.FAKE)


def test_fixed_mode_is_deterministic_across_runs_and_threads():
    for name in ("small_cnn", "transformer_block"):
        b, sim = _sim(name)
        x = b.example_inputs(2, 5)
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            y1 = sim.trace(*x, mode=Mode.FIXED)
            torch.set_num_threads(2)
            y2 = sim.trace(*x, mode=Mode.FIXED)
            y3 = sim.trace(*x, mode=Mode.FIXED)
        finally:
            torch.set_num_threads(threads)
        for op in y1.order:
            for a, b2, b3 in zip(*(float_leaves(t.outputs[op]) for t in (y1, y2, y3))):
                assert_bits_equal(b2, a)
                assert_bits_equal(b3, a)


def test_fixed_values_equal_codes_times_scale():
    b, sim = _sim("transformer_block")
    tr = sim.trace(*b.example_inputs(1, 3), mode=Mode.FIXED)
    checked = 0
    for name in tr.order:
        info = tr.qinfo[name]
        if info is None or isinstance(info, list) or info.codes is None:
            continue
        out = tr.outputs[name]
        assert info.codes.dtype == info.dtype.torch_dtype
        assert_bits_equal(out, info.codes.to(torch.float32) * info.scale)
        checked += 1
    assert checked >= 8


def test_replay_and_per_op_modes():
    b, sim = _sim("small_cnn")
    x = b.example_inputs(2, 4)
    ops = list(sim.ops["name"])
    target = "conv2:conv2d#0"
    base = sim.trace(*x, mode=Mode.FLOAT)
    om = {target: OpMode(Mode.FAKE, quantize_weight=False)}
    full = sim.run(*x, mode=Mode.FLOAT, op_modes=om)
    fast = sim.run(*x, mode=Mode.FLOAT, op_modes=om, replay=base)
    assert_bits_equal(fast, full)
    assert not torch.equal(full, base.result)
    # weight-only: the output of the op stays float, only its weight is quantized
    w_only = sim.run(
        *x, mode=Mode.FLOAT, op_modes={target: OpMode(Mode.FAKE, quantize_output=False)}
    )
    assert not torch.equal(w_only, base.result)
    # one op FIXED inside a FAKE run
    mixed = sim.run(*x, mode=Mode.FAKE, op_modes={ops[0]: OpMode(Mode.FIXED)})
    assert mixed.shape == full.shape
    with pytest.raises(ValueError, match="unknown op"):
        sim.run(*x, mode=Mode.FAKE, op_modes={"nope:conv2d#0": OpMode(Mode.FIXED)})


def test_ops_table_and_templates():
    b, sim = _sim("small_cnn")
    ops = sim.ops
    for col in (
        "name",
        "op_type",
        "module",
        "call_index",
        "input_shapes",
        "output_shape",
        "supported",
        "input_dtype",
        "weight_dtype",
        "output_dtype",
        "has_weight",
        "flops",
    ):
        assert col in ops.columns
    fc = ops.set_index("name").loc["fc:linear#0"]
    assert fc.output_dtype == "INT32"  # GEMM feeding the model output: high precision (s.8)
    assert bool(fc.has_weight) and fc.flops == 2 * 2 * 32 * 10
    # float16 platforms: global float16, int8 Conv/MatMul inputs
    sim_p = Simulator(b.module, "j6p")
    sim_p.calibrate([b.example_inputs(2, 0)])
    opsp = sim_p.ops.set_index("name")
    assert opsp.loc["conv1:conv2d#0"].input_dtype == "INT8"
    assert opsp.loc["conv1:conv2d#0"].output_dtype == "FLOAT16"
    assert opsp.loc["fc:linear#0"].output_dtype == "FLOAT32"
    y = sim_p.run(*b.example_inputs(2, 1), mode=Mode.FIXED)
    assert torch.isfinite(y).all()


def test_observers_and_set_qconfig_keep_statistics():
    b, sim = _sim("conv_only")
    x = b.example_inputs(1, 0)
    name = "conv1:conv2d#0"
    s_mse = sim.act_scale(name, "out", DType.INT8, sim.qconfig_of(name))
    for kind in (ObserverKind.MINMAX, ObserverKind.GLOBAL_MINMAX, ObserverKind.HISTOGRAM):
        sim.set_qconfig(QConfigSpec(global_=OpQConfig(observer=kind)))
        s = sim.act_scale(name, "out", DType.INT8, sim.qconfig_of(name))
        assert float(s) > 0 and float(s) != float(s_mse)
    sim.set_qconfig(QConfigSpec(by_name={name: OpQConfig(observer="FIXED", fixed_scale=0.5)}))
    assert float(sim.act_scale(name, "out", DType.INT8, sim.qconfig_of(name))) == 0.5
    y = sim.run(*x, mode=Mode.FAKE)
    assert torch.isfinite(y).all()


def test_unsupported_op_runs_in_float_and_is_listed():
    class WithFloor(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return self.conv(torch.floor(x) - 0.5)

    sim = Simulator(WithFloor(), "j6m")
    x = torch.randn(1, 3, 8, 8)
    sim.calibrate([(x,)])
    ops = sim.ops.set_index("name")
    assert not ops.loc[":floor#0"].supported
    assert ops.loc[":floor#0"].fixed_kernel.startswith("float")
    assert bool(ops.loc["conv:conv2d#0"].supported)
    assert torch.isfinite(sim.run(x, mode=Mode.FIXED)).all()


def test_weight_split_brings_weights_closer_to_float():
    b = build_model("small_cnn")
    x = b.example_inputs(2, 3)
    calib = [b.example_inputs(2, 10 + i) for i in range(2)]
    errs = {}
    for k in (0, 7):
        spec = QConfigSpec(by_type={t: OpQConfig(weight_split=k) for t in ("conv2d", "linear")})
        sim = Simulator(b.module, "j6m", spec)
        sim.calibrate(calib)
        ref = sim.trace(*x, mode=Mode.FLOAT)
        for mode in (Mode.FAKE, Mode.FIXED):
            # weight-only quantization of conv2: the split's finer weight shows directly
            om = {"conv2:conv2d#0": OpMode(mode, quantize_output=False)}
            y = sim.run(*x, mode=Mode.FLOAT, op_modes=om)
            errs[(k, mode)] = float((y - ref.result).abs().max())
        y_fixed = sim.run(*x, mode=Mode.FIXED)
        assert torch.isfinite(y_fixed).all()
    assert errs[(7, Mode.FAKE)] < errs[(0, Mode.FAKE)] / 4
    with pytest.raises(ValueError, match="weight_split"):
        bad = Simulator(b.module, "j6m", QConfigSpec(by_type={"relu": OpQConfig(weight_split=7)}))
        bad.calibrate(calib[:1])


def test_op_support_table_per_platform():
    from quantlab.simulate.support import op_support_table

    plats = ["j6m", "j6p"]
    t = op_support_table(plats)
    required = (
        "conv1d conv2d linear matmul add sub mul div sum mean cat stack reshape permute "
        "getitem relu relu6 clamp max_pool2d avg_pool2d interpolate grid_sample sigmoid tanh "
        "exp log sqrt rsqrt reciprocal sin cos softmax layer_norm gelu silu inverse_sigmoid"
    ).split()
    for p in plats:
        sub = t[t.platform == p].set_index("op_type")
        assert set(required) <= set(sub.index)
        assert sub.loc["conv2d"].fixed_kernel == "integer"
        assert sub.loc["sigmoid"].fixed_kernel == "lut"
        for norm in ("layer_norm", "group_norm", "instance_norm"):
            assert sub.loc[norm].fixed_kernel.startswith("integer"), norm
        assert sub.loc["embedding"].fixed_kernel == "integer (gather)"
    sub = op_support_table(["onnxruntime"]).set_index("op_type")
    assert sub.loc["layer_norm"].fixed_kernel == (  # LayerNormalization, not the composite
        "float between dequantize and quantize (LayerNormalization's float32 steps)"
    )
    assert sub.loc["group_norm"].fixed_kernel == (  # its ONNX form's steps
        "float between dequantize and quantize (LayerNormalization's float32 steps per group, "
        "then Mul and Add per channel)"
    )
    assert sub.loc["instance_norm"].fixed_kernel.startswith(
        "float between dequantize and quantize (LayerNormalization's float32 steps per channel"
    )
    sub = op_support_table(["tflite"]).set_index("op_type")
    assert sub.loc["group_norm"].fixed_kernel == "float_fallback"  # platform.norm_composite
    limited = PlatformConfig(name="tiny", supported_ops=["conv2d"])
    sub = op_support_table([limited]).set_index("op_type")
    assert bool(sub.loc["conv2d"].supported) and not bool(sub.loc["sigmoid"].supported)
    assert sub.loc["sigmoid"].fixed_kernel == "float (not supported on this platform)"


def test_op_table_tells_an_op_quantlab_does_not_model_from_one_the_platform_lacks():
    """Both run in float in fixed mode; the table says which: ``floor`` and ``round`` are not
    modelled by quantlab on any platform, a sigmoid left out of ``supported_ops`` is modelled
    but not supported there."""

    class Net(nn.Module):
        def forward(self, x):
            return torch.round(torch.sigmoid(torch.floor(x)))

    limited = PlatformConfig(name="tiny", supported_ops=["relu"])
    for platform, sigmoid in (("j6m", "lut"), (limited, "float (not supported on this platform)")):
        sim = Simulator(Net(), platform)
        sim.run(torch.randn(2, 3), mode=Mode.FLOAT)
        ops = sim.ops.set_index("op_type")
        for op in ("floor", "round"):
            assert ops.loc[op, "category"] == "NONE"
            assert ops.loc[op, "fixed_kernel"] == "float (not modelled by quantlab)", op
        assert ops.loc["sigmoid", "fixed_kernel"] == sigmoid


def test_grid_sample_size_limit_names_op_and_rule():
    class Warp(nn.Module):
        def forward(self, x, grid):
            return torch.nn.functional.grid_sample(x, grid, align_corners=False)

    x = torch.randn(1, 2, 4, 2048)
    grid = torch.rand(1, 4, 4, 2) * 2 - 1
    sim = Simulator(Warp(), "j6m")
    with pytest.raises(ValueError) as e:
        sim.calibrate([(x, grid)])
    msg = str(e.value)
    assert ":grid_sample#0" in msg and "grid_max_side" in msg and "W=2048" in msg
    ok = Simulator(Warp(), "j6p")  # no size limits on J6P
    ok.calibrate([(x, grid)])
    assert torch.isfinite(ok.run(x, grid, mode=Mode.FIXED)).all()


def test_in_place_ops_do_not_corrupt_quantized_tensors():
    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            h = self.conv(x)
            skip = h
            h = self.act(h)
            h += skip
            h.mul_(0.5)
            return h

    torch.manual_seed(0)
    model = InPlace().eval()
    sim = Simulator(model, "j6m")
    x = torch.randn(2, 3, 8, 8)
    sim.calibrate([(x,)])
    assert_bits_equal(sim.run(x, mode=Mode.FLOAT), model(x))
    tr = sim.trace(x, mode=Mode.FIXED)
    for name in tr.order:
        info = tr.qinfo[name]
        if info is not None and not isinstance(info, list) and info.codes is not None:
            assert_bits_equal(tr.outputs[name], info.codes.to(torch.float32) * info.scale)
    y_fake, y_fixed = sim.run(x, mode=Mode.FAKE), sim.run(x, mode=Mode.FIXED)
    with torch.no_grad():
        ref = model(x)
    assert float((y_fake - ref).abs().max()) < 0.1
    assert float((y_fixed - y_fake).abs().max()) < 0.1
    # recorded traces are not changed by in-place ops of later runs (replay, isolated view)
    from quantlab.simulate import View

    first = sim.compare(x, a=Mode.FAKE, b=Mode.FIXED, view=View.ISOLATED)
    again = sim.compare(x, a=Mode.FAKE, b=Mode.FIXED, view=View.ISOLATED)
    assert first.equals(again)
    base = sim.trace(x, mode=Mode.FLOAT)
    snapshot = {n: o.clone() for n, o in base.outputs.items()}
    om = {":add#0": OpMode(Mode.FAKE)}
    assert_bits_equal(
        sim.run(x, mode=Mode.FLOAT, op_modes=om, replay=base),
        sim.run(x, mode=Mode.FLOAT, op_modes=om),
    )
    for n, o in snapshot.items():
        assert_bits_equal(base.outputs[n], o)


def test_conv_bn_relu6_is_fused_as_deployed():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU6()).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
        model[1].weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 8, 8)
    sim = Simulator(model, "j6m")
    sim.calibrate([(x,)])
    ops = sim.ops.set_index("name")
    assert ops.loc["1:batch_norm#0"].fixed_kernel == "fused into 0:conv2d#0"
    assert ops.loc["2:relu6#0"].fixed_kernel == "fused into 0:conv2d#0"
    with torch.no_grad():
        ref = model(x)
    assert_bits_equal(sim.run(x, mode=Mode.FLOAT), ref)
    fake, fixed = sim.run(x, mode=Mode.FAKE), sim.run(x, mode=Mode.FIXED)
    s = float(sim.act_scale("0:conv2d#0", "out", DType.INT8, sim.qconfig_of("0:conv2d#0")))
    assert float((fake - ref).abs().max()) < 3 * s  # folded weights + one output rounding
    assert float((fixed - fake).abs().max()) <= 1.01 * s  # at most one LSB apart
    assert float(fixed.min()) >= 0 and float(fixed.max()) <= 6.0


def test_functional_relu6_after_conv_bn_is_fused_like_the_module():
    """``F.relu6`` (not only ``nn.ReLU6``) closes a conv -> batch_norm chain; calibration then
    observes the chain's output and fake and fixed runs have its scale."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)

        def forward(self, x):
            return F.relu6(self.bn(self.conv(x))).mean((2, 3))

    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    sim = Simulator(Net().eval(), "j6m")
    sim.calibrate([(x,)], progress=False)
    ops = sim.ops.set_index("name")
    assert ops.loc[":relu6#0"].fixed_kernel == "fused into conv:conv2d#0"
    fixed = sim.run(x, mode=Mode.FIXED)
    assert float((fixed - sim.run(x, mode=Mode.FAKE)).abs().max()) < 0.1
    assert float(fixed.min()) >= 0 and float(fixed.max()) <= 6.0


def test_batch_norm_fuses_into_a_linear_only_where_it_normalizes_the_linear_features():
    """A batch_norm normalizes dim 1. A 2-D linear output has its features there, and the
    batch_norm folds into the linear; a 3-D one has them last, and folding would scale the
    weight's rows by another axis's statistics: the batch_norm then runs as an op of its own."""

    class Net(nn.Module):
        def __init__(self, seq: bool) -> None:
            super().__init__()
            self.seq = seq
            self.fc = nn.Linear(6, 5)
            self.bn = nn.BatchNorm1d(4 if seq else 5)

        def forward(self, x):
            return self.bn(self.fc(x))

    torch.manual_seed(0)
    for seq, shape in ((False, (8, 6)), (True, (8, 4, 6))):
        model = Net(seq).eval()
        with torch.no_grad():
            model.bn.running_mean.uniform_(-0.5, 0.5)
            model.bn.running_var.uniform_(0.5, 2.0)
        x = torch.randn(shape)
        sim = Simulator(model, "j6m")
        sim.calibrate([(x,)], progress=False)
        fused_into = sim.ops.set_index("name").loc["bn:batch_norm#0", "fused_into"]
        assert fused_into == ("" if seq else "fc:linear#0")
        with torch.no_grad():
            ref = model(x)
        fake = sim.run(x, mode=Mode.FAKE)
        fixed = sim.run(x, mode=Mode.FIXED)
        spread = float(ref.abs().max())
        assert float((fake - ref).abs().max()) < 0.05 * spread
        assert float((fixed - fake).abs().max()) < 0.05 * spread


def _one_op_sim(fn, x, platform, spec):
    class One(nn.Module):
        def forward(self, *a):
            return fn(*a)

    sim = Simulator(One(), platform, spec)
    sim.calibrate([x])
    return sim


def test_sin_period_reduction_in_fixed_mode():
    import dataclasses

    from quantlab.simulate.profiles import platform_config

    x = (torch.linspace(-100, 100, 4001),)
    spec = QConfigSpec(
        global_=OpQConfig(output_dtype=DType.INT16),
        by_type={"sin": OpQConfig(input_dtype=DType.INT16, output_dtype=DType.INT16)},
    )
    j6m = platform_config("j6m")
    errs = {}
    for reduce in (True, False):
        p = dataclasses.replace(j6m, sincos_period_reduction=reduce)
        sim = _one_op_sim(torch.sin, x, p, spec)
        errs[reduce] = float((sim.run(*x, mode=Mode.FIXED) - torch.sin(x[0])).abs().max())
    # tables over one period beat 6 x 64 entries spread over 32 periods
    assert errs[True] < errs[False] / 2


def test_int16_matmul_operand_coarsening():
    import dataclasses

    from quantlab.simulate.profiles import platform_config

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 64, generator=g), torch.randn(64, 8, generator=g))
    spec = QConfigSpec(by_name={":matmul#0": OpQConfig(input_dtype=DType.INT16)})
    j6b = dataclasses.replace(platform_config("j6m"), max_int16_gemm_operands=2)
    outs = {}
    for coarsen in (True, False):
        p = dataclasses.replace(j6b, int16_matmul_coarsen=coarsen)
        sim = _one_op_sim(torch.matmul, x, p, spec)
        outs[coarsen] = sim.run(*x, mode=Mode.FIXED)
    ref = x[0] @ x[1]
    e_c, e_n = (float((outs[c] - ref).abs().max()) for c in (True, False))
    assert not torch.equal(outs[True], outs[False])
    # without coarsening, 64 products of int16 codes overflow the int32 accumulator
    assert e_c < e_n
    with pytest.raises(ValueError, match="int16 x int16"):
        _one_op_sim(torch.matmul, x, "j6m", spec)


def test_five_line_api():
    import quantlab

    b = build_model("small_cnn")
    x = b.example_inputs(1, 0)[0]
    sim = quantlab.Simulator(b.module, platform="j6m")
    sim.calibrate([b.example_inputs(1, s) for s in range(2)])
    y_fake, y_fixed = sim.run(x, mode="fake"), sim.run(x, mode="fixed")
    table = sim.compare(x, a="fake", b="fixed")
    assert y_fake.shape == y_fixed.shape == (1, 10)
    assert list(table["name"]) == list(sim.ops["name"])
