"""Model check on a toy model holding each deployment pattern of seed 000: placement on j6m with
the seed line, what differs on j6p, toolchain gates (fmod on the VPU, TopK on the SPU) and J6B's
assumptions."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from quantlab.analysis.placement import Unit, model_placement, unit_counts
from quantlab.platforms import Toolchain
from quantlab.simulate import Mode, Simulator
from quantlab.simulate.profiles import platform_config


class Patterns(nn.Module):
    """One of each: slice assignment, bool-mask assignment, masked_fill, nonzero, einsum,
    ArgMax with and without an int16 cast, TopK, fmod, %, broadcast where, a 3-input Add."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 300)

    def forward(self, x):
        y = self.conv(x)
        y[:, :2] = 0.0
        y[y < 0] = 0.0
        z = y.masked_fill(y > 3, 3.0)
        nz = torch.nonzero(z[0, 0] > 0.5)
        e = torch.einsum("bchw,bchw->bc", z, z)
        a16 = torch.argmax(e, dim=1).to(torch.int16)
        a64 = torch.argmax(self.fc(e), dim=1)
        v, i = torch.topk(e, 3, dim=1)
        f = torch.fmod(e, 2.0) + e % 2.0
        w = torch.where(e > 0, e, torch.zeros(1))
        s = torch.stack([e, f, w]).sum(0)
        return v, s, a16, a64, i, nz


def _check(platform, **fields):
    p = platform_config(platform) if isinstance(platform, str) else platform
    p = dataclasses.replace(p, **fields)
    torch.manual_seed(0)
    t = model_placement(Simulator(Patterns().eval(), p), (torch.randn(2, 3, 8, 8),))
    return t.set_index("name")


@pytest.fixture(scope="module")
def j6m():
    return _check("j6m")


@pytest.fixture(scope="module")
def j6p():
    return _check("j6p")


# name -> (unit on j6m, seed reference)
EXPECTED_J6M = {
    ":setitem#0": (Unit.CPU, "seed 000 line 11"),  # ScatterND
    ":setitem#1": (Unit.CPU, "seed 000 line 55"),  # bool mask: Cast + Equal on the CPU
    ":masked_fill#0": (Unit.CPU, "seed 000 line 55"),
    ":nonzero#0": (Unit.CPU, "seed 000 line 69"),
    ":einsum#0": (Unit.REFUSED, "seed 000 line 73"),
    ":argmax#0": (Unit.BPU_FIXED, "seed 000 line 87"),  # cast to int16 follows
    ":argmax#1": (Unit.CPU, "seed 000 line 87"),  # int64 index: a CPU Cast
    ":topk#0": (Unit.SPU, "seed 000 line 83"),
    ":fmod#0": (Unit.VPU, "seed 000 line 63"),
    ":remainder#0": (Unit.CPU, "seed 000 lines 63-65"),
    ":where#0": (Unit.BPU_FIXED, "seed 000 line 149"),
    ":sum#0": (Unit.BPU_FIXED, "seed 000 line 91"),  # many-input Add
    "conv:conv2d#0": (Unit.BPU_FIXED, "seed 002 line 17"),
}


def test_each_pattern_on_j6m_has_its_placement_and_seed_line(j6m):
    for name, (unit, seed) in EXPECTED_J6M.items():
        row = j6m.loc[name]
        assert row.unit == unit.value, (name, row.unit, row.reason)
        assert row.seed.startswith(seed), (name, row.seed)
    assert j6m.loc[":setitem#0", "pattern"] == "setitem"
    assert "ScatterND" in j6m.loc[":setitem#0", "reason"]
    assert "torch.where" in j6m.loc[":setitem#1", "fix"]
    assert j6m.loc[":sum#0", "pattern"] == "multi_add"
    assert j6m.loc[":sum#0", "fixed_kernel"] != "not captured"  # the captured sum's own row
    # index dtypes and whether they fit int8 / int16 (largest index: dim size - 1)
    assert "int64 index, largest 7 (fits int8), cast to int16" == j6m.loc[":argmax#0", "precision"]
    assert "largest 299 (fits int16)" in j6m.loc[":argmax#1", "precision"]
    assert "cast the index to int16" in j6m.loc[":argmax#1", "fix"]
    assert "largest 7 (fits int8)" in j6m.loc[":topk#0", "precision"]
    # rows follow execution order; uncaptured patterns sit between the captured ops
    names = list(j6m.index)
    assert names.index("conv:conv2d#0") < names.index(":setitem#0") < names.index(":einsum#0")
    assert names.index(":einsum#0") < names.index("fc:linear#0") < names.index(":argmax#1")
    counts = unit_counts(j6m.reset_index()).set_index("unit")["ops"]
    assert counts[Unit.CPU.value] == 6 and counts[Unit.REFUSED.value] == 1
    assert int(counts.sum()) == len(j6m)


def test_j6p_differs_where_the_seeds_say(j6m, j6p):
    # bool assignment: the CPU Cast/Equal is stated for J6E/M only (j6p: named assumption)
    for name in (":setitem#1", ":masked_fill#0"):
        assert j6p.loc[name, "unit"] == Unit.BPU_FIXED.value
        assert "assumed" in j6p.loc[name, "seed"]
    # float16 template: vector ops run in float on the BPU
    assert j6p.loc[":add#0", "unit"] == Unit.BPU_FLOAT.value
    assert j6m.loc[":add#0", "unit"] == Unit.BPU_FIXED.value
    same = [":setitem#0", ":nonzero#0", ":einsum#0", ":argmax#1", ":fmod#0"]
    assert (j6p.loc[same, "unit"] == j6m.loc[same, "unit"]).all()


def test_toolchain_gates_fmod_and_topk():
    old = _check("j6m", toolchain=Toolchain.OE_3_0_0)
    assert old.loc[":topk#0", "unit"] == Unit.CPU.value
    assert "from OE-v3.2.0" in old.loc[":topk#0", "reason"]
    assert old.loc[":fmod#0", "unit"] == Unit.CPU.value
    assert "OE >= OE-v3.5.0" in old.loc[":fmod#0", "fix"]
    mid = _check("j6m", toolchain=Toolchain.OE_3_2_0)
    assert mid.loc[":topk#0", "unit"] == Unit.SPU.value
    assert "CPU Cast" in mid.loc[":topk#0", "reason"]  # Gather/Index after TopK before 3.5.0
    j6b = _check("j6b", toolchain=Toolchain.OE_3_2_0)
    assert j6b.loc[":topk#0", "unit"] == Unit.CPU.value  # J6B: SPU TopK from OE-v3.5.0
    j6b = _check("j6b")
    assert j6b.loc[":topk#0", "unit"] == Unit.SPU.value
    assert "assumed" in j6b.loc[":topk#0", "seed"]
    assert j6b.loc[":fmod#0", "unit"] == Unit.CPU.value  # no VPU (seed 002 line 13)
    assert "no VPU" in j6b.loc[":fmod#0", "reason"]


def test_j6b_names_its_assumptions():
    p = platform_config("j6b")
    assert set(p.assumptions) >= {"spu", "tae_float_output", "max_int16_gemm_operands"}
    assert "seed 002 line 13" in p.assumptions["spu"]
    assert "seed 004 line 32" in p.assumptions["tae_float_output"]
    assert p.spu and p.spu_topk_from is Toolchain.OE_3_5_0 and not p.vpu
    assert p.max_int16_gemm_operands == 1 and p.high_precision_output.name == "INT32"


def test_toolchain_is_a_typed_platform_field():
    from omegaconf.errors import ValidationError

    from quantlab.config import compose

    with pytest.raises(Exception) as e:
        compose(["platform.toolchain=OE_9"])
    text = str(e.value) + repr(e.value.__cause__)
    assert "OE_3_0_0, OE_3_2_0, OE_3_5_0" in text and "platform.toolchain" in text
    assert isinstance(e.value.__cause__, ValidationError)
    assert compose(["platform.toolchain=OE_3_2_0"]).platform.toolchain is Toolchain.OE_3_2_0


class Lookup(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(50, 8)
        self.fc = nn.Linear(8, 4)

    def forward(self, ids):
        return self.fc(self.table(ids))


@pytest.mark.parametrize("platform", ["j6m", "j6p"])
def test_an_embedding_carries_the_seeds_index_path_fix(platform):
    torch.manual_seed(0)
    sim = Simulator(Lookup().eval(), platform)
    t = model_placement(sim, (torch.randint(0, 50, (2, 6)),)).set_index("name")
    assert t.loc["table:embedding#0", "unit"] in (Unit.BPU_FIXED.value, Unit.BPU_FLOAT.value)
    assert "fix_scale=1 (seed 000 lines 141-147)" in t.loc["table:embedding#0", "fix"]


def test_a_transposed_convolution_is_placed_as_conv_with_the_assumption_named():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ConvTranspose2d(4, 4, 2, stride=2), nn.ReLU())
    torch.manual_seed(0)
    t = model_placement(Simulator(model.eval(), "j6m"), (torch.randn(1, 3, 8, 8),))
    row = t.set_index("name").loc["1:conv_transpose2d#0"]
    assert row["unit"] == Unit.BPU_FIXED.value and row["engine"] == "TAE"
    assert "computed as Conv (assumed)" in row["reason"]
    assert "seed 002 line 17" in row["seed"]


class _Magnitude(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        pooled = F.adaptive_max_pool1d(y.unsqueeze(1), 2).flatten()
        return torch.abs(y).flatten(), torch.relu(y + 1).amax(), pooled


def test_pass_through_ops_that_compute_or_pool_are_placed_on_their_engines():
    """abs, a relu no GEMM absorbs and amax keep their input's grid as a layout op does, but
    compute each value: the VAE; max pooling is pooling: the AAE; a reshape stays the DTE's."""
    torch.manual_seed(0)
    sim = Simulator(_Magnitude().eval(), "j6m")
    t = model_placement(sim, (torch.randn(2, 4),)).set_index("name")
    assert t.loc[":abs#0", "unit"] == Unit.BPU_FIXED.value and t.loc[":abs#0", "engine"] == "VAE"
    assert t.loc[":relu#0", "engine"] == "VAE" and t.loc[":amax#0", "engine"] == "VAE"
    assert t.loc[":adaptive_max_pool1d#0", "engine"] == "AAE"
    assert t.loc[":flatten#0", "engine"] == "DTE"


class _Bicubic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return F.interpolate(self.conv(x), scale_factor=2, mode="bicubic")


def test_a_call_the_fixed_kernel_declines_is_named_after_a_fixed_run():
    """After a fixed-mode run, an op whose fixed kernel declined its call (bicubic sampling:
    quantlab computes it in float) says so in its reason and kernel; before, and for the ops
    whose kernels ran, nothing is added."""
    torch.manual_seed(0)
    sim = Simulator(_Bicubic().eval(), "j6m")
    x = torch.randn(1, 3, 8, 8)
    before = model_placement(sim, (x,)).set_index("name")
    assert "declines" not in before.loc[":interpolate#0", "reason"]
    sim.calibrate([(x,)], progress=False)
    sim.run(x, mode=Mode.FIXED)
    t = model_placement(sim, (x,)).set_index("name")
    row = t.loc[":interpolate#0"]
    assert "fixed kernel declines this call" in row["reason"]
    assert row["fixed_kernel"].startswith("float_fallback")
    assert "declines" not in t.loc["conv:conv2d#0", "reason"]


class _ConvRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return torch.relu(y + 1.0)


def test_a_relu_right_after_a_gemm_is_applied_by_it_on_the_tae():
    """A relu whose input a convolution produced runs in the convolution's output stage (the
    TAE, as a fused clamp does); a relu after an add stays the VAE's."""
    torch.manual_seed(0)
    sim = Simulator(_ConvRelu().eval(), "j6m")
    t = model_placement(sim, (torch.randn(1, 3, 8, 8),)).set_index("name")
    first, second = t.loc[":relu#0"], t.loc[":relu#1"]
    assert first["engine"] == "TAE" and first["reason"] == "applied by conv:conv2d#0"
    assert second["engine"] == "VAE"
    assert sim.ops.set_index("name").loc[":relu#0", "producers"] == ["conv:conv2d#0"]
