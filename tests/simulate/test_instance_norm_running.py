"""InstanceNorm with running statistics (eval, track_running_stats=True) and a BatchNorm no
convolution absorbs, in fixed point: a per-channel affine op x * a_c + b_c whose codes equal
those of the depthwise 1x1 convolution holding a and b (the GEMM path, proven against the
integer reference elsewhere); on the onnxruntime profiles the BatchNorm stays
BatchNormalization's float32 steps."""

import torch
from torch import nn

from quantlab.calibration.kinds import ObserverKind
from quantlab.numerics.dtypes import DType
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator
from quantlab.simulate.fixed_norm import running_affine


def _statistics(m: nn.Module, seed: int) -> nn.Module:
    """``m`` with random running statistics, weight and bias, in eval mode."""
    g = torch.Generator().manual_seed(seed)
    c = m.num_features
    with torch.no_grad():
        m.running_mean.copy_(torch.randn(c, generator=g))
        m.running_var.copy_(torch.rand(c, generator=g) * 3 + 0.1)
        m.weight.copy_(torch.randn(c, generator=g))
        m.bias.copy_(torch.randn(c, generator=g) * 0.5)
    return m.eval()


def _norm(c: int = 4) -> nn.InstanceNorm2d:
    return _statistics(nn.InstanceNorm2d(c, affine=True, track_running_stats=True), 2)


def _as_conv(norm: nn.InstanceNorm2d) -> nn.Conv2d:
    c = norm.num_features
    conv = nn.Conv2d(c, c, 1, groups=c, bias=True)
    a = torch.rsqrt(norm.running_var + norm.eps) * norm.weight
    with torch.no_grad():
        conv.weight.copy_(a.reshape(c, 1, 1, 1))
        conv.bias.copy_(norm.bias - norm.running_mean * a)
    return conv.eval()


def _beside_its_conv(norm: nn.Module, op: str, x: torch.Tensor) -> dict:
    """FIXED and FAKE outputs of ``norm`` (op type ``op``) and of its depthwise 1x1 twin on
    j6m, int8 output at the fixed scale 0.06; both kernels integer."""
    fixed_scales = OpQConfig(
        observer=ObserverKind.FIXED,
        fixed_scale=0.06,
        output_dtype=DType.INT8,
        high_precision_output=False,
    )
    outs = {}
    for label, model, kind in (("norm", norm, op), ("conv", _as_conv(norm), "conv2d")):
        sim = Simulator(model, "j6m", QConfigSpec(by_type={kind: fixed_scales}))
        sim.calibrate([(x,)], progress=False)
        assert sim.ops.fixed_kernel.iloc[0].startswith("integer")
        outs[label] = sim.run(x, mode=Mode.FIXED)
        outs[label + "_fake"] = sim.run(x, mode=Mode.FAKE)
    return outs


def test_running_instance_norm_is_the_depthwise_conv_bit_for_bit():
    norm = _norm()
    x = torch.randn(3, 4, 6, 5, generator=torch.Generator().manual_seed(3)) * 2
    outs = _beside_its_conv(norm, "instance_norm", x)
    assert torch.equal(outs["norm"], outs["conv"])
    assert torch.equal(outs["norm_fake"], outs["conv_fake"])
    with torch.no_grad():
        ref = norm(x)
    noise = float((outs["norm"] - ref).pow(2).sum())
    assert 10 * torch.log10(ref.pow(2).sum() / noise) > 25  # int8 input and output at 0.06


def test_running_instance_norm_calibrated_is_close_and_not_a_fallback():
    norm = _norm(3)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 8, 8, generator=g)
    sim = Simulator(norm, "j6m")
    sim.calibrate([(x,)], progress=False)
    y = sim.run(x, mode=Mode.FIXED)
    with torch.no_grad():
        ref = norm(x)
    noise = float((y - ref).pow(2).sum())
    assert 10 * torch.log10(ref.pow(2).sum() / noise) > 30  # int8 output: about 40 dB
    a, b = running_affine_of(norm, x)
    assert torch.allclose(a * x + b, ref, atol=1e-5)


def running_affine_of(norm, x):
    calls = []

    from quantlab.capture import CaptureMode, ModuleTracker

    def handler(call):
        calls.append(call)
        return call.run()

    with torch.no_grad(), ModuleTracker(norm) as tr, CaptureMode(tr, handler):
        norm(x)
    a, b = running_affine(calls[0])
    return a.reshape(1, -1, 1, 1), b.reshape(1, -1, 1, 1)


def _batch_norm(c: int = 4) -> nn.BatchNorm2d:
    return _statistics(nn.BatchNorm2d(c), 5)


class _AfterRelu(nn.Module):
    """A batch norm after a ReLU (no GEMM to fold it into), then a convolution."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.conv = nn.Conv2d(4, 3, 1)

    def forward(self, x):
        return self.conv(self.norm(torch.relu(x)))


def test_a_standalone_batch_norm_is_the_depthwise_conv_bit_for_bit():
    norm = _batch_norm()
    x = torch.randn(3, 4, 6, 5, generator=torch.Generator().manual_seed(6)) * 2
    outs = _beside_its_conv(norm, "batch_norm", x)
    assert torch.equal(outs["norm"], outs["conv"])
    # fake: the same affine, rounded as x * w then + b, where the convolution's kernel may fuse
    # the two: at most one output step apart
    assert float((outs["norm_fake"] - outs["conv_fake"]).abs().max()) <= 0.06 * (1 + 1e-6)


def test_a_standalone_batch_norm_in_a_model_and_on_onnxruntime():
    """Calibrated in a model: integer on J6M, close to float, and not a fallback; on the
    onnxruntime profile BatchNormalization's float32 steps, as before; trained through the
    simulator, fake mode gives run's bits and the gradient reaches its weight and bias."""
    torch.manual_seed(0)
    model = _AfterRelu(_batch_norm()).eval()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 4, 8, 8, generator=g)
    sim = Simulator(model, "j6m")
    sim.calibrate([(x,)], progress=False)
    kernels = sim.ops.set_index("op_type").fixed_kernel
    assert kernels["batch_norm"].startswith("integer per-channel affine")
    with torch.no_grad():
        ref = model(x)
        y = sim.run(x, mode=Mode.FIXED)
    assert 10 * torch.log10(ref.pow(2).sum() / (y - ref).pow(2).sum()) > 25
    ort = Simulator(model, "onnxruntime")
    ort.calibrate([(x,)], progress=False)
    assert ort.ops.set_index("op_type").fixed_kernel["batch_norm"].startswith("float between")
    trained = sim.train_forward(x, mode=Mode.FAKE)
    assert torch.equal(trained.detach(), sim.run(x, mode=Mode.FAKE))
    trained.pow(2).sum().backward()
    for p in (model.norm.weight, model.norm.bias):
        assert p.grad is not None and p.grad.abs().sum() > 0
