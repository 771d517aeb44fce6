"""Platform facts enforced at discovery: high-precision outputs only on a GEMM feeding a model
output (seed 002 line 17); no float tensor reaching a fixed-point op on J6E/M (seed 002 lines
8-10); float16 refused on J6E/M with the platforms that have it."""

from __future__ import annotations

import pytest
import torch
from program_switch import build_in_first_run
from torch import nn
from torch.nn import functional as F

from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator


class _TwoConvs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3)
        self.b = nn.Conv2d(4, 4, 3)

    def forward(self, x):
        return self.b(torch.sigmoid(self.a(x)).reshape(x.shape[0], 4, 6, 6))


def _run(platform: str, spec: QConfigSpec) -> Simulator:
    torch.manual_seed(0)
    sim = Simulator(_TwoConvs().eval(), platform, spec)
    sim.run(torch.randn(1, 3, 8, 8), mode=Mode.FLOAT)
    return sim


def test_high_precision_output_only_on_a_gemm_feeding_a_model_output():
    sim = _run("j6m", QConfigSpec())
    assert sim.qconfig_of("b:conv2d#0").high_precision_output  # the template's output GEMM
    assert sim.ops.set_index("name").loc["b:conv2d#0", "output_dtype"] == "INT32"
    internal = QConfigSpec(by_name={"a:conv2d#0": OpQConfig(high_precision_output=True)})
    with pytest.raises(ValueError, match=r"op a:conv2d#0 \(conv2d\).*feeds no model output"):
        _run("j6m", internal)
    with pytest.raises(ValueError, match="seed 002 line 17"):
        _run("j6p", internal)
    not_gemm = QConfigSpec(by_name={":sigmoid#0": OpQConfig(output_dtype="INT32")})
    with pytest.raises(ValueError, match=r":sigmoid#0 \(sigmoid\): output_dtype=INT32.*not a GEMM"):
        _run("j6m", not_gemm)


class _HeadThenFlatten(nn.Module):
    """A 1x1-conv classifier leaving through flatten and a reshape (a "conv as fc" head)."""

    def __init__(self, flatten: bool) -> None:
        super().__init__()
        self.flatten = flatten
        self.a = nn.Conv2d(3, 8, 3)
        self.head = nn.Conv2d(8, 64, 1)

    def forward(self, x):
        y = self.head(F.adaptive_avg_pool2d(torch.relu(self.a(x)), 1))
        return y.flatten(1).reshape(-1, 8, 8) if self.flatten else y


@pytest.mark.parametrize(("platform", "wide"), [("j6m", "INT32"), ("j6p", "FLOAT32")])
def test_a_high_precision_output_passes_layout_ops_unquantized(monkeypatch, platform, wide):
    """The head's int32 (J6E/M/B) or float32 (J6H/P) output reaches the model output through
    flatten and reshape as it is: same bits as without them, in every mode and as a program."""
    build_in_first_run(monkeypatch)
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(2, 3, 10, 10, generator=g) * s for s in (0.5, 1.0, 3.0, 1.0)]
    sims = []
    for flatten in (False, True):
        torch.manual_seed(1)
        sim = Simulator(_HeadThenFlatten(flatten).eval(), platform)
        sim.calibrate([(x,) for x in xs[:3]], progress=False)
        sims.append(sim)
    plain, flat = sims
    for mode in (Mode.FAKE, Mode.FIXED):
        for x in xs:  # the first run of each mode builds the program, the rest run it
            ref = plain.run(x, mode=mode).reshape(-1, 8, 8)
            assert torch.equal(flat.run(x, mode=mode), ref)
    ops = flat.ops.set_index("op_type")
    assert ops.loc["conv2d", "output_dtype"].tolist() == [
        "INT8" if wide == "INT32" else "FLOAT16",
        wide,
    ]
    assert ops.loc["flatten", "input_dtype"] == wide
    assert ops.loc[["flatten", "reshape"], "output_dtype"].tolist() == [wide, wide]


def test_float32_input_to_a_fixed_point_op_is_an_error_on_j6m_only():
    spec = QConfigSpec(by_name={":sigmoid#0": OpQConfig(output_dtype="FLOAT32")})
    # through the reshape: the conv would take the sigmoid's float32 output
    with pytest.raises(ValueError, match=r"op b:conv2d#0 \(conv2d\): its input from :sigmoid#0"):
        _run("j6m", spec)
    with pytest.raises(ValueError, match="j6e has no float in TAE/VAE"):
        _run("j6e", spec)
    assert _run("j6p", spec).ops.set_index("name").loc[":sigmoid#0", "output_dtype"] == "FLOAT32"
    # the listed fallback: a conv2d left out of supported_ops runs in float and says so
    import dataclasses

    from quantlab.simulate.profiles import platform_config

    p = dataclasses.replace(platform_config("j6m"), supported_ops=["sigmoid", "reshape"])
    ops = _run(p, spec).ops.set_index("name")
    assert ops.loc["b:conv2d#0", "fixed_kernel"] == "float (not supported on this platform)"


def test_float16_on_j6m_names_the_platforms_with_float16():
    spec = QConfigSpec(global_=OpQConfig(output_dtype="FLOAT16"))
    with pytest.raises(ValueError, match=r"j6m has no float16 in TAE/VAE.*j6b, j6h, j6p"):
        _run("j6m", spec)


def _then_dropout(drop: bool) -> nn.Module:
    torch.manual_seed(0)
    tail = nn.Dropout(0.1) if drop else nn.Identity()
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), tail).eval()


def test_an_eval_dropout_after_the_output_gemm_keeps_its_high_precision_output():
    """An eval-mode dropout returns its input itself: the GEMM before it still feeds the model
    output (int32 on J6M), and every mode gives the bits of the model without it."""
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(4, 16, generator=g),) for _ in range(2)]
    x = torch.randn(4, 16, generator=g)
    sims = []
    for drop in (True, False):
        sim = Simulator(_then_dropout(drop), "j6m")
        sim.calibrate(calib, progress=False)
        sims.append(sim)
    assert sims[0].qconfig_of("2:linear#0").high_precision_output
    assert sims[0].ops.set_index("name").loc["2:linear#0", "output_dtype"] == "INT32"
    for mode in (Mode.FAKE, Mode.FIXED):
        assert torch.equal(sims[0].run(x, mode=mode), sims[1].run(x, mode=mode))


class _Float16Ops(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        y = self.c(x)
        return (y * torch.sigmoid(y) + y).mean((2, 3))


def test_ops_with_a_float16_output_are_named_float16_in_the_ops_table():
    """On J6P the template's float16 ops compute in float16, whatever the integer kernel of an
    int8 qconfig would be; an op given an int8 output keeps its integer kernel's name."""
    int8_add = QConfigSpec(by_name={":add#0": OpQConfig(input_dtype="INT8", output_dtype="INT8")})
    for spec, add_kernel in ((QConfigSpec(), "float16"), (int8_add, "integer")):
        torch.manual_seed(0)
        sim = Simulator(_Float16Ops().eval(), "j6p", spec)
        sim.calibrate([(torch.randn(1, 3, 8, 8),)], progress=False)
        kernels = sim.ops.set_index("name").fixed_kernel
        assert kernels["c:conv2d#0"] == "integer"
        for op in (":sigmoid#0", ":mul#0", ":mean#0"):
            assert kernels[op] == "float16 (its output dtype: computed in float)"
        assert kernels[":add#0"].startswith(add_kernel)
