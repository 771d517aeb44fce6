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
