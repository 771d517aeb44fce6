"""Random nets exported as ONNX QDQ and run in onnxruntime give fixed mode's bits (onnxruntime
profile), or the export refuses them with a clear error. The nets use the steps of
``random_nets.STEPS`` that have an ONNX form, plus scalar arithmetic and sums over an axis.
Of seeds 0-119, 50 failed to export before in-place methods (``t.clamp_``) were ops of their own,
9 gave other bits (a GEMM feeding an output run as a float Conv / MatMul, sub, clamps, stacked
sums, average pools) and 1 failed inside onnxruntime (a mean whose scales
QLinearGlobalAveragePool refuses); now 4 are refused (three read a tensor written through a view,
one has a clamp fused after an N-d linear) and the others give onnxruntime's bits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from random_nets import STEPS, C, RandomNet, S

pytest.importorskip("onnxruntime")

from quantlab.export import ActivationEncoding, UnsupportedOpError, to_onnx_qdq  # noqa: E402
from quantlab.export import runtime as R  # noqa: E402
from quantlab.export.ort_host import onnxruntime_profile  # noqa: E402
from quantlab.simulate import Mode, Simulator  # noqa: E402

EXPORTABLE = """conv conv3 linear layer_norm relu6_ relu_ hardtanh_ sigmoid_ clamp_ add_ gelu tanh
exp softmax add sub mul scale mean_mul matmul matmul_t avg_pool stack_sum cat_narrow permute
transpose_copy reshape dw_conv squeeze_excite max_pool silu residual_relu_""".split()
EXPORT_STEPS = {name: STEPS[name] for name in EXPORTABLE} | {
    "add_scalar": (None, lambda t, u, a, b, m, w: t + 0.5),
    "rsub_scalar": (None, lambda t, u, a, b, m, w: 0.5 - t),
    "sub_scalar": (None, lambda t, u, a, b, m, w: t - 0.25),
    "div_scalar": (None, lambda t, u, a, b, m, w: t / 3.0),
    "mul_scalar": (None, lambda t, u, a, b, m, w: 1.5 * t),
    "sum_dim": (None, lambda t, u, a, b, m, w: t.sum(-1, keepdim=True) * u),
}

pytestmark = pytest.mark.filterwarnings("ignore:RandomNet.forward writes into its input")


def _export_and_run(seed: int, encoding, tmp_path, steps: int = 12):
    torch.manual_seed(seed)
    model = RandomNet(seed, steps, EXPORT_STEPS).eval()
    g = torch.Generator().manual_seed(seed)
    shape = (2, C, S, S)
    sim = Simulator(model, onnxruntime_profile())
    sim.calibrate([(torch.randn(shape, generator=g),) for _ in range(2)], progress=False)
    x = torch.randn(shape, generator=g)
    info = to_onnx_qdq(sim, tmp_path / "m.onnx", (x.clone(),), encoding=encoding)
    got = R.run(R.session(info.path), info.input_names, (x.clone(),))
    fixed = sim.run(x.clone(), mode=Mode.FIXED)
    return got, list(fixed) if isinstance(fixed, tuple) else [fixed]


# 21 ... 117: other bits before; 67: a mean QLinearGlobalAveragePool refuses; 151: a
# convolution feeding an output with a fused clamp; 235: a standalone clamp; 459:
# stack(...).sum(0); 40: a padded average pool; 234: writes into its input through a view (the
# input was baked into the graph as a constant)
@pytest.mark.parametrize(
    "seed", [*range(4), 21, 29, 37, 40, 67, 81, 83, 111, 113, 117, 151, 234, 235, 459]
)
def test_random_nets_run_in_onnxruntime_with_fixed_modes_bits(seed, tmp_path):
    got, fixed = _export_and_run(seed, None, tmp_path)
    for a, b in zip(got, fixed, strict=True):
        assert np.array_equal(a, b.numpy())


# (seed, steps): a float ReduceSum over a row of five after a layer norm (fine output scale),
# whose codes torch's summation order missed (numerics.ort_reduce)
@pytest.mark.parametrize("seed, steps", [(274, 6)])
def test_random_nets_whose_sums_need_onnxruntimes_order(seed, steps, tmp_path):
    got, fixed = _export_and_run(seed, None, tmp_path, steps)
    for a, b in zip(got, fixed, strict=True):
        assert np.array_equal(a, b.numpy())


# nets with stacks, which onnxruntime refused to load with int8 activations
@pytest.mark.parametrize("seed", [1, 2, 15])
def test_random_nets_with_int8_activations_load_in_onnxruntime(seed, tmp_path):
    got, fixed = _export_and_run(seed, ActivationEncoding.SIGNED, tmp_path)
    assert [a.shape for a in got] == [tuple(b.shape) for b in fixed]


def test_a_random_net_reading_a_tensor_written_through_a_view_is_refused(tmp_path):
    with pytest.raises(UnsupportedOpError, match="cannot express a write through a view"):
        _export_and_run(23, None, tmp_path)
