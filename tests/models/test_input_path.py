"""The deployed image input path: mean/std folded into the first conv equals the float model up
to float rounding (symmetric and TF-style asymmetric padding, RGB and BGR sources), the input
arrives as int8 codes at scale 1 in fake and fixed modes alike, and bad options are named."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quantlab.data.schema import DataConfig
from quantlab.models.formats import ChannelOrder, ImageFormat, Resize
from quantlab.models.input_path import (
    PIXEL_INPUT,
    Border,
    InputFormat,
    deploy_input_path,
    deploy_workload,
)
from quantlab.models.registry import build_model
from quantlab.models.schema import ModelConfig
from quantlab.numerics.dtypes import DType
from quantlab.platforms import PlatformConfig
from quantlab.simulate import Mode, Simulator
from quantlab.simulate.model_inputs import InputQuant, mark_quantized_inputs
from quantlab.simulate.qtensor import QTable

# 255 mean - 128 is an integer code per channel, so the mean-pixel border is exact
MEAN = (100 / 255, 128 / 255, 150 / 255)
STD = (0.229, 0.5, 0.31)


class SamePadConv(nn.Conv2d):
    """A TF-style 'same' conv: asymmetric zero padding as a ZeroPad2d before the conv."""

    def __init__(self) -> None:
        super().__init__(3, 6, 3, stride=2, bias=False)
        self.static_padding = nn.ZeroPad2d((0, 1, 0, 1))

    def forward(self, x):
        return nn.functional.conv2d(self.static_padding(x), self.weight, self.bias, self.stride)


def _net(stem: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(
        stem, nn.ReLU(), nn.Conv2d(6, 4, 3, padding=1), nn.Flatten(), nn.LazyLinear(5)
    )
    net(torch.zeros(1, 3, 16, 16))
    return net.eval()


def _pixels(seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (2, 3, 16, 16), generator=gen).to(torch.float32)


def _normalised(p: torch.Tensor, fmt: ImageFormat) -> torch.Tensor:
    x = p / 255
    if fmt.channels is ChannelOrder.BGR:
        x = x.flip(1)
    mean = torch.tensor(fmt.mean).view(1, 3, 1, 1)
    std = torch.tensor(fmt.std).view(1, 3, 1, 1)
    return (x - mean) / std


@pytest.mark.parametrize(
    "stem",
    [lambda: nn.Conv2d(3, 6, 3, stride=2, padding=1, bias=True), SamePadConv],
    ids=["symmetric", "tf_same"],
)
@pytest.mark.parametrize("source", [InputFormat.UINT8_RGB, InputFormat.UINT8_BGR])
@pytest.mark.parametrize("model_order", [ChannelOrder.RGB, ChannelOrder.BGR], ids=lambda c: c.name)
def test_folded_conv_equals_float_preprocessing(stem, source, model_order):
    fmt = ImageFormat(16, 16, Resize.KEEP, MEAN, STD, channels=model_order)
    net = _net(stem())
    p = _pixels()
    with torch.no_grad():
        want = net(_normalised(p, fmt))
        deployed, path = deploy_input_path(net, fmt, source, _normalised(p, fmt))
        codes = path.codes(p / 255)
        got = deployed(codes)
    assert deployed.input_quant == (PIXEL_INPUT,)
    assert torch.equal(codes, codes.round()) and codes.min() >= -128 and codes.max() <= 127
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    assert net[0].__class__ is stem().__class__  # the original model is untouched


def test_zero_code_border_differs_only_at_the_border():
    fmt = ImageFormat(16, 16, Resize.KEEP, MEAN, STD)
    net = nn.Conv2d(3, 4, 3, padding=1).eval()
    p = _pixels(1)
    with torch.no_grad():
        x = _normalised(p, fmt)
        want = net(x)
        dep0, path0 = deploy_input_path(net, fmt, "UINT8_RGB", x, border=Border.ZERO_CODE)
        got = dep0(path0.codes(p / 255))
    inner = (slice(None), slice(None), slice(1, -1), slice(1, -1))
    torch.testing.assert_close(got[inner], want[inner], rtol=1e-5, atol=1e-4)
    assert (got - want).abs()[:, :, 0].max() > 1e-2  # code 0 is pixel 128, not the mean
    assert path0.border_codes() == (0, 0, 0)


def _first_incoming(sim, x, mode):
    seen = []
    sim.trace(x, mode=mode, on_call=lambda c: seen.append(c) if not seen else None)
    return seen[0]


def test_the_first_op_sees_the_same_codes_in_fake_and_fixed_modes():
    fmt = ImageFormat(16, 16, Resize.KEEP, MEAN, STD)
    net = _net(nn.Conv2d(3, 6, 3, stride=2, padding=1))
    p = _pixels(2)
    deployed, path = deploy_input_path(net, fmt, "UINT8_RGB", _normalised(p, fmt))
    codes = path.codes(p / 255)
    sim = Simulator(deployed, "j6m")
    sim.calibrate([(codes,)], progress=False)
    fake, fixed = (_first_incoming(sim, codes, m) for m in (Mode.FAKE, Mode.FIXED))
    assert fake.call.op_type == fixed.call.op_type == "conv2d"
    for seen in (fake, fixed):
        info = seen.incoming[0]
        assert info.dtype is DType.INT8 and float(info.scale) == 1.0
        assert torch.equal(info.codes.to(torch.int64), codes.to(torch.int64))
    # without the declared input quantization the first conv calibrates its own input scale
    plain = Simulator(deployed, "j6m", input_quant=())
    plain.calibrate([(codes,)], progress=False)
    seen = _first_incoming(plain, codes, Mode.FIXED)
    assert seen.incoming[0] is None  # arrives float, quantized at a calibrated scale
    name = seen.call.name
    assert float(plain.act_scale(name, "in0", DType.INT8, plain.qconfig_of(name))) != 1.0


def test_deployment_aware_fake_mode_takes_the_fixed_mode_input_codes():
    """The input path under FakeOps.DEPLOYED: the deployed model's first op receives, in FAKE
    and HYBRID mode, a tensor whose values are exactly fixed mode's input codes times the input
    scale (uint8 pixels as int8 codes at scale 1), not a calibrated fake quantization."""
    from quantlab.simulate import FakeOps

    fmt = ImageFormat(16, 16, Resize.KEEP, MEAN, STD)
    net = _net(nn.Conv2d(3, 6, 3, stride=2, padding=1))
    p = _pixels(3)
    deployed, path = deploy_input_path(net, fmt, "UINT8_RGB", _normalised(p, fmt))
    codes = path.codes(p / 255)
    sim = Simulator(deployed, "j6m", fake_ops=FakeOps.DEPLOYED)
    sim.calibrate([(path.codes(_pixels(4) / 255),)], progress=False)
    fixed = _first_incoming(sim, codes, Mode.FIXED).incoming[0]
    want = fixed.codes.to(torch.float32) * fixed.scale
    assert fixed.dtype is DType.INT8 and float(fixed.scale) == 1.0
    for mode in (Mode.FAKE, Mode.HYBRID):
        seen = _first_incoming(sim, codes, mode)
        info, value = seen.incoming[0], seen.call.args[0]
        assert info.dtype is fixed.dtype and float(info.scale) == float(fixed.scale)
        assert torch.equal(value, want) and torch.equal(info.codes, fixed.codes)
        assert sim.qconfig_of(seen.call.name).input_dtype in (None, DType.INT8)  # no requant
    y = sim.train_forward(codes)  # a training run takes the same input
    assert y.requires_grad and torch.equal(y.detach(), sim.run(codes, mode=Mode.FAKE))


def test_synthetic_data_deploys_the_float_models_images():
    """data=synthetic under a deployed input format: the same random images as the float
    model's, as uint8 codes (the deployed model reproduces the float outputs)."""
    from quantlab.workload import load_workload

    data_cfg = DataConfig(name="synthetic", num_calib=1, num_eval=2)
    cfg = ModelConfig(name="small_cnn", pretrained=False)
    bundle, data = load_workload(cfg, data_cfg)
    dep, dep_data = deploy_workload(bundle, data_cfg, "UINT8_RGB", PlatformConfig())
    with torch.no_grad():
        for (x,), (q,) in zip(data.eval, dep_data.eval):
            want, got = bundle.module(x), dep.module(q)
            sqnr = 10 * torch.log10(want.square().sum() / (got - want).square().sum())
            assert sqnr > 40  # only the pixels' uint8 rounding (~70 dB); other images: < 10 dB


def test_declared_inputs_must_be_integer_codes():
    qt = QTable()
    with pytest.raises(ValueError, match="model input 0 must hold INT8 codes"):
        mark_quantized_inputs(qt, (torch.tensor([0.5, 1.0]),), (InputQuant(),))
    with pytest.raises(ValueError, match="must hold INT8 codes"):
        mark_quantized_inputs(qt, (torch.tensor([200.0]),), (InputQuant(),))
    with pytest.raises(ValueError, match="scale must be > 0"):
        InputQuant(DType.INT8, 0.0)


def test_bad_input_format_values_are_named():
    with pytest.raises(ValueError, match=r"model.input_format: unknown input format 'RGB8'.*NV12"):
        ModelConfig(name="mobilenet_v2", input_format="RGB8")
    assert ModelConfig(input_format="NV12").input_format is InputFormat.NV12
    net = nn.Sequential(nn.Identity(), nn.Conv2d(3, 4, 3)).eval()
    x = torch.zeros(1, 3, 8, 8)
    net_scaled = nn.Sequential(nn.Conv2d(3, 3, 1), nn.Conv2d(3, 4, 3)).eval()
    deploy_input_path(net, ImageFormat(8, 8, Resize.KEEP), "UINT8_RGB", x)  # Identity passes x on
    with pytest.raises(ValueError, match="Conv2d"):
        deploy_input_path(
            nn.Sequential(nn.Tanh(), net_scaled).eval(), ImageFormat(8, 8, Resize.KEEP), "NV12", x
        )
    with pytest.raises(ValueError, match="FLOAT_NORMALIZED"):
        deploy_input_path(net, ImageFormat(8, 8, Resize.KEEP), "FLOAT_NORMALIZED", x)


def test_model_input_format_deploys_a_registry_image_model():
    from quantlab.workload import load_workload

    cfg = ModelConfig(name="small_cnn", pretrained=False, input_format="NV12")
    dep, data = load_workload(cfg, DataConfig(name="photos", num_calib=1, num_eval=1))
    (x,) = data.calib[0]
    assert dep.module.input_quant == (PIXEL_INPUT,)
    assert x.shape[1:] == dep.input_shapes[0] == (3, 34, 34)  # 32x32 plus the conv's border
    assert torch.equal(x, x.round()) and x.min() >= -128 and x.max() <= 127
    assert dep.example_inputs(1, 0)[0].shape == x.shape
    with pytest.raises(ValueError, match="needs an image model"):
        deploy_workload(
            build_model(ModelConfig(name="posenc", pretrained=False)),
            DataConfig(name="synthetic"),
            "UINT8_RGB",
            PlatformConfig(),
        )
