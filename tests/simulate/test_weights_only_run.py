"""Every op in FAKE with quantize_output=False, the rest of the run in FLOAT: only weights (and
the model input, which no op produced) are quantized; no activation is re-quantized downstream."""

import torch
import torch.nn.functional as F

from quantlab.models import build_model
from quantlab.simulate import Mode, OpMode, Simulator


def test_all_ops_weight_only_quantizes_no_activation():
    model = build_model("conv_only").module
    sim = Simulator(model, platform="j6m")
    g = torch.Generator().manual_seed(3)
    sim.calibrate([(torch.randn(2, 3, 16, 16, generator=g),) for _ in range(2)])
    x = torch.randn(1, 3, 16, 16, generator=g)
    names = list(sim.ops.name)
    y = sim.run(
        x, mode=Mode.FLOAT, op_modes={n: OpMode(Mode.FAKE, quantize_output=False) for n in names}
    )
    wq = {}
    for n, conv in (
        ("conv1:conv2d#0", model.conv1),
        ("conv2:conv2d#0", model.conv2),
        ("conv3:conv2d#0", model.conv3),
    ):
        wq[n] = sim.weight_value(n, conv.weight, sim.qconfig_of(n).weight_dtype, Mode.FAKE)
    rq = sim.qconfig_of("conv1:conv2d#0")
    xq, _ = sim.quantize_act(
        "conv1:conv2d#0", "in0", x, rq.input_dtype or rq.output_dtype, rq, Mode.FAKE
    )
    h = torch.relu(F.conv2d(xq, wq["conv1:conv2d#0"], model.conv1.bias, padding=1))
    h = torch.relu(F.conv2d(h, wq["conv2:conv2d#0"], model.conv2.bias, stride=2, padding=1))
    expected = F.conv2d(h, wq["conv3:conv2d#0"], model.conv3.bias)
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-6)


def test_set_qconfig_keeps_calibrated_scales_and_changes_only_what_it_should():
    from quantlab.numerics.dtypes import DType
    from quantlab.qconfig import OpQConfig, QConfigSpec

    model = build_model("conv_only").module
    sim = Simulator(model, platform="j6m")
    g = torch.Generator().manual_seed(5)
    sim.calibrate([(torch.randn(2, 3, 16, 16, generator=g),) for _ in range(2)])
    x = torch.randn(1, 3, 16, 16, generator=g)
    before = sim.run(x, mode=Mode.FIXED)
    sim.set_qconfig(QConfigSpec(by_name={"conv2:conv2d#0": OpQConfig(output_dtype=DType.INT16)}))
    changed = sim.run(x, mode=Mode.FIXED)
    sim.set_qconfig(QConfigSpec())
    again = sim.run(x, mode=Mode.FIXED)
    assert torch.equal(before, again)
    assert not torch.equal(before, changed)


def test_a_by_name_change_re_resolves_the_ops_it_names_and_gives_a_fresh_simulators_bits():
    """set_qconfig with only by_name entries changed re-resolves only the ops they name (the
    others keep their resolved qconfig object), also for a spec changed in place and applied
    again; any other change re-resolves every op. Runs give the bits of a simulator built
    with the new qconfig."""
    from quantlab.numerics.dtypes import DType
    from quantlab.qconfig import OpQConfig, QConfigSpec

    model = build_model("conv_only").module
    g = torch.Generator().manual_seed(6)
    calib = [(torch.randn(2, 3, 16, 16, generator=g),) for _ in range(2)]
    x = torch.randn(1, 3, 16, 16, generator=g)
    sim = Simulator(model, platform="j6m")
    sim.calibrate(calib)
    names = list(sim.ops.name)
    before = {n: sim.qconfig_of(n) for n in names}
    wide = QConfigSpec(by_name={"conv2:conv2d#0": OpQConfig(output_dtype=DType.INT16)})
    sim.set_qconfig(wide)
    kept = [n for n in names if sim.qconfig_of(n) is before[n]]
    assert kept == [n for n in names if n != "conv2:conv2d#0"]
    assert sim.qconfig_of("conv2:conv2d#0").output_dtype is DType.INT16
    fresh = Simulator(model, platform="j6m", qconfig=wide)
    fresh.calibrate(calib)
    assert torch.equal(sim.run(x, mode=Mode.FIXED), fresh.run(x, mode=Mode.FIXED))
    wide.by_name["conv3:conv2d#0"] = OpQConfig(output_dtype=DType.INT16)  # changed in place
    sim.set_qconfig(wide)  # the same object applied again (mixed_precision.apply_legal does)
    assert sim.qconfig_of("conv3:conv2d#0").output_dtype is DType.INT16
    sim.set_qconfig(QConfigSpec(global_=OpQConfig(output_dtype=DType.INT16)))
    assert not any(sim.qconfig_of(n) is before[n] for n in names)


def test_ops_table_names_the_gemm_a_fused_op_belongs_to():
    from torch import nn

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU6()).eval()
    sim = Simulator(model, platform="j6m")
    sim.calibrate([(torch.randn(1, 3, 8, 8),)])
    ops = sim.ops.set_index("name")
    assert ops.loc["0:conv2d#0", "fused_into"] == ""
    fused = ops[ops.fused_into != ""]
    assert set(fused.fused_into) == {"0:conv2d#0"}
    assert {"batch_norm", "relu6"} <= set(fused.op_type)


def test_weight_only_run_through_fused_chains_ignores_activation_calibration():
    """conv -> batch_norm -> relu6 chains are fused; with every GEMM after the first in
    FAKE(quantize_output=False) the result may depend on the weights only, never on the
    activation scales that calibration chose."""
    from torch import nn

    torch.manual_seed(0)
    layers = [
        nn.Conv2d(3, 6, 3),
        nn.BatchNorm2d(6),
        nn.ReLU6(),
        nn.Conv2d(6, 6, 3),
        nn.BatchNorm2d(6),
        nn.ReLU6(),
        nn.Conv2d(6, 2, 1),
    ]
    model = nn.Sequential(*layers).eval()
    for bn in (layers[1], layers[4]):
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(1, 3, 12, 12)
    outs = []
    for gain in (1.0, 37.0):  # very different activation ranges, hence scales
        sim = Simulator(model, platform="j6m")
        sim.calibrate([(gain * torch.randn(2, 3, 12, 12),)])
        gemms = sim.ops[sim.ops.has_weight].name.tolist()
        modes = {n: OpMode(Mode.FAKE, quantize_output=False) for n in gemms[1:]}
        outs.append(sim.run(x, mode=Mode.FLOAT, op_modes=modes))
    assert torch.equal(outs[0], outs[1])
