"""LayerNorm / GroupNorm / InstanceNorm and Embedding in the simulator: the fixed-mode codes of
real captured layers equal the integer references, FAKE is the composite's QAT form, float16
platforms keep the float path, and the embedding's index path follows its qconfig."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from quantlab.data.digits import train_split
from quantlab.models import build_model
from quantlab.numerics import reference
from quantlab.numerics.dtypes import DType
from quantlab.numerics.norm import NormLayout
from quantlab.numerics.norm_calibrate import norm_fake
from quantlab.numerics.quantize import fake_cast
from quantlab.qconfig import EmbeddingIndex, OpQConfig, QConfigSpec
from quantlab.simulate import Simulator
from quantlab.simulate.fixed_norm import norm_scales
from quantlab.simulate.profiles import platform_config
from tests.bits import assert_bits_equal


@pytest.fixture(scope="module")
def digits_j6m():
    """The trained LayerNorm digit transformer on j6m, calibrated on 128 training images, and
    16 other images."""
    bundle = build_model("digits_layernorm")
    x, _ = train_split()
    sim = Simulator(bundle.module, "j6m")
    sim.calibrate([(x[:64],), (x[64:128],)], progress=False)
    return sim, x[200:216]


def _norm_inputs(sim, tr, name):
    inf = sim._info[name]
    src, out = tr.qinfo[inf.producers[0]], tr.qinfo[name]
    assert src.dtype is DType.INT8 and src.codes is not None and out.codes is not None
    return sim.model.get_submodule(inf.module), src, out


def test_layer_norm_fixed_codes_equal_the_integer_reference_on_the_trained_model(digits_j6m):
    sim, x = digits_j6m
    tr = sim.trace(x, mode="fixed")
    names = [n for n in tr.order if sim._info[n].op_type == "layer_norm"]
    assert len(names) == 5  # two per block, the final norm
    c = sim.platform.norm_contract()
    for name in names:
        m, src, out = _norm_inputs(sim, tr, name)
        want = reference.norm_fixed(
            src.codes,
            float(src.scale),
            NormLayout.layer(m.normalized_shape),
            m.weight.detach(),
            m.bias.detach(),
            m.eps,
            norm_scales(sim, name),
            float(out.scale),
            out.dtype,
            c,
        )
        assert_bits_equal(out.codes.to(torch.int64), torch.from_numpy(want))
        assert torch.equal(tr.outputs[name], out.codes.float() * out.scale)
    kernels = sim.ops.set_index("name").loc[names, "fixed_kernel"]
    assert all(k.startswith("integer") for k in kernels)


def _composite_fake(sim, tr, name: str):
    """The QAT composite (``norm_fake``) of traced layer_norm ``name`` from its traced input."""
    inf = sim._info[name]
    m = sim.model.get_submodule(inf.module)
    out = tr.qinfo[name]
    return norm_fake(
        tr.outputs[inf.producers[0]],
        NormLayout.layer(m.normalized_shape),
        m.weight,
        m.bias,
        m.eps,
        norm_scales(sim, name),
        float(out.scale),
        out.dtype,
        sim.platform.norm_contract(),
        sim.platform.fake_round,
    )


def test_layer_norm_fake_is_the_composite_qat_form(digits_j6m):
    sim, x = digits_j6m
    tr = sim.trace(x, mode="fake")
    names = [n for n in tr.order if sim._info[n].op_type == "layer_norm"]
    for name in names:
        assert_bits_equal(tr.outputs[name], _composite_fake(sim, tr, name))


def test_position_embedding_gathered_by_a_buffer_is_a_constant_operand(digits_j6m):
    """``self.pos(self.positions)`` gathers by a buffer of the model: a constant, which the
    export folds, so no embedding op; the add takes the table as its second operand, quantized
    at the add's input point (as any constant tensor operand), by its integer kernel."""
    sim, x = digits_j6m
    sim.run(x, mode="fixed")
    ops = sim.ops
    assert "embedding" not in set(ops.op_type)
    (add,) = [r for r in ops.itertuples() if r.op_type == "add" and r.producers[1] is None]
    assert add.input_dtype == "INT8,INT8" and add.fixed_kernel.startswith("integer")
    assert not add.fixed_in_float


class _ConvNorms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.inorm = nn.InstanceNorm2d(4, affine=True)
        with torch.no_grad():
            for p in (self.gn.weight, self.inorm.weight):
                p.copy_(torch.rand(4, generator=g) + 0.5)
            for p in (self.gn.bias, self.inorm.bias):
                p.copy_(torch.randn(4, generator=g))

    def forward(self, x):
        return self.inorm(self.gn(self.conv(x)))


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_group_and_instance_norm_fixed_codes_equal_the_integer_reference(dtype):
    torch.manual_seed(0)
    model = _ConvNorms()
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(2, 3, 6, 5, generator=g),) for _ in range(2)]
    q = OpQConfig(output_dtype=dtype)
    sim = Simulator(model, "j6m", QConfigSpec(by_type={"group_norm": q, "instance_norm": q}))
    sim.calibrate(calib, progress=False)
    tr = sim.trace(torch.randn(2, 3, 6, 5, generator=g), mode="fixed")
    layouts = {"gn": NormLayout.group(2), "inorm": NormLayout.instance()}
    for name in tr.order:
        inf = sim._info[name]
        if inf.op_type not in ("group_norm", "instance_norm"):
            continue
        m = sim.model.get_submodule(inf.module)
        src, out = tr.qinfo[inf.producers[0]], tr.qinfo[name]
        assert out.dtype is dtype
        want = reference.norm_fixed(
            src.codes,
            float(src.scale),
            layouts[inf.module],
            m.weight.detach(),
            m.bias.detach(),
            m.eps,
            norm_scales(sim, name),
            float(out.scale),
            out.dtype,
            sim.platform.norm_contract(),
        )
        assert_bits_equal(out.codes.to(torch.int64), torch.from_numpy(want))


def test_layer_norm_on_a_float16_platform_runs_in_float16():
    ln = nn.LayerNorm(8)
    with torch.no_grad():
        ln.weight.copy_(torch.linspace(0.5, 1.5, 8))
    x = torch.randn(4, 8) * 3
    sim = Simulator(ln, "j6p")
    sim.calibrate([(x,)], progress=False)
    row = sim.ops.iloc[0]
    assert row.op_type == "layer_norm" and row.output_dtype == "FLOAT16"
    sat = sim.platform.float16_saturate
    want = fake_cast(
        F.layer_norm(fake_cast(x, DType.FLOAT16, sat), (8,), ln.weight, ln.bias), DType.FLOAT16, sat
    )
    assert_bits_equal(sim.run(x, mode="fixed"), want)


class _Lookup(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(300, 4)

    def forward(self, ids):
        return self.table(ids)


def test_calibrated_int8_index_changes_rows_and_fixed_scale_one_keeps_them():
    """FIXED_ONE (the default) at int16 index codes selects every id's own row; a calibrated
    int8 index path (scale > 1 for 300 rows) rounds ids and selects other rows."""
    torch.manual_seed(0)
    model = _Lookup()
    ids = torch.tensor([[0, 1, 2, 130, 131, 298, 299]])
    j6m = platform_config("j6m")
    int8_index = dataclasses.replace(j6m, embedding_index_dtype=DType.INT8)
    cal = QConfigSpec(by_type={"embedding": OpQConfig(embedding_index="CALIBRATED")})
    outs = {}
    for label, plat, spec in (("one", j6m, QConfigSpec()), ("calibrated", int8_index, cal)):
        sim = Simulator(model, plat, spec)
        sim.calibrate([(ids,)], progress=False)
        name = "table:embedding#0"
        rq = sim.qconfig_of(name)
        info = sim.trace(ids, mode="fixed").qinfo[name]
        codes, _ = sim.weight_q(name, model.table.weight, DType.INT8, False)
        scale = 1.0
        if rq.embedding_index is EmbeddingIndex.CALIBRATED:
            scale = float(sim.act_scale(name, "index", DType.INT8, rq))
            assert scale > 1.0  # 300 ids do not fit int8 codes at scale 1
        want = reference.embedding_fixed(ids, codes, scale, plat.embedding_contract())
        assert_bits_equal(info.codes.to(torch.int64), torch.from_numpy(want))
        outs[label] = info.codes
    assert torch.equal(outs["one"], codes[ids[0]].unsqueeze(0))
    assert not torch.equal(outs["calibrated"], outs["one"])  # int8 codes of ids > 127 round


def test_embedding_index_option_rejects_unknown_names():
    with pytest.raises(ValueError, match="FIXED_ONE, CALIBRATED"):
        OpQConfig(embedding_index="ONE")


def test_layer_norm_fake_follows_a_changed_gamma_and_beta(digits_j6m):
    """gamma and beta's fake quant is kept between runs by identity and version: changing them
    in place (an optimizer step) gives the composite of the new values."""
    sim, x = digits_j6m
    name = next(n for n in sim.trace(x, mode="fake").order if sim._info[n].op_type == "layer_norm")
    m = sim.model.get_submodule(sim._info[name].module)
    saved = (m.weight.detach().clone(), m.bias.detach().clone())
    try:
        with torch.no_grad():
            m.weight.mul_(0.75)
            m.bias.add_(0.05)
        tr = sim.trace(x, mode="fake")
        assert_bits_equal(tr.outputs[name], _composite_fake(sim, tr, name))
    finally:
        with torch.no_grad():
            m.weight.copy_(saved[0])
            m.bias.copy_(saved[1])
