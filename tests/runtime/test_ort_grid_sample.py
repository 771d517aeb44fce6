"""onnxruntime's float32 GridSample (CPU, 4-d): ``ort_grid_sample`` gives its bits for
bilinear and nearest sampling, zeros and border padding, with and without align_corners, on
random grids (int16 codes at several scales, reaching outside the input), on adversarial ones
(pixel centres, half-way points, the edges -1 and 1 and just beyond, half-pixel ties for
nearest) and on inputs of one row or one column; torch's float grid_sample does not."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from onnx import TensorProto, helper
from ort_graphs import session

from quantlab.numerics.grid_sample import Padding, SampleMode
from quantlab.numerics.ort_grid_sample import ort_grid_sample

_MODES = {SampleMode.BILINEAR: "linear", SampleMode.NEAREST: "nearest"}
_CASES = list(itertools.product(SampleMode, Padding, (False, True)))


def _onnxruntime(x: np.ndarray, grid: np.ndarray, mode, padding, align) -> np.ndarray:
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=_MODES[mode],
                            padding_mode=padding.value, align_corners=int(align))  # fmt: skip
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape)),
           helper.make_tensor_value_info("g", TensorProto.FLOAT, list(grid.shape))]  # fmt: skip
    return session([node], ins, TensorProto.FLOAT, []).run(None, {"x": x, "g": grid})[0]


def _check(x: np.ndarray, grid: np.ndarray, mode, padding, align) -> None:
    want = torch.from_numpy(_onnxruntime(x, grid, mode, padding, align))
    got = ort_grid_sample(torch.from_numpy(x), torch.from_numpy(grid), mode, padding, align)
    assert got.dtype == torch.float32
    assert_bits_equal(got, want)


def _image(rng, shape) -> np.ndarray:
    return (rng.integers(-128, 128, shape).astype(np.float32) * np.float32(0.0371)).astype(
        np.float32
    )


@pytest.mark.parametrize(("mode", "padding", "align"), _CASES)
def test_random_int16_grids_give_onnxruntimes_bits(mode, padding, align):
    rng = np.random.default_rng(_CASES.index((mode, padding, align)))
    for h, w, reach in [(7, 300, 1.3), (16, 16, 1.0), (5, 1024, 1.05), (33, 9, 2.5)]:
        x = _image(rng, (2, 3, h, w))
        codes = rng.integers(-32768, 32768, (2, 6, 41, 2)).astype(np.float32)
        grid = (codes * np.float32(reach / 32768)).astype(np.float32)
        _check(x, grid, mode, padding, align)


def _adversarial(h: int, w: int, align: bool) -> np.ndarray:
    """Normalised coordinates of pixel centres, half-way points and quarter points of every
    pixel on both axes, the edges, and points just beyond them."""

    def axis(n):
        k = np.arange(-2, 2 * n + 3, dtype=np.float64) / 2  # centres and half-way points
        k = np.concatenate([k, k + 0.25])
        norm = 2 * k / (n - 1) - 1 if align and n > 1 else (2 * k + 1) / n - 1
        edges = np.array([-1.0, 1.0, np.nextafter(np.float32(1), np.float32(2)),
                          np.nextafter(np.float32(-1), np.float32(-2)), 0.0, -0.0])  # fmt: skip
        return np.concatenate([norm, edges]).astype(np.float32)

    gx, gy = np.meshgrid(axis(w), axis(h))
    return np.stack([gx, gy], -1)[None].astype(np.float32)


@pytest.mark.parametrize(("mode", "padding", "align"), _CASES)
@pytest.mark.parametrize(("h", "w"), [(5, 7), (1, 9), (6, 1), (2, 2)])
def test_adversarial_grids_give_onnxruntimes_bits(mode, padding, align, h, w):
    rng = np.random.default_rng(h * 10 + w)
    grid = _adversarial(h, w, align)
    _check(_image(rng, (1, 2, h, w)), grid, mode, padding, align)


def test_torch_grid_sample_differs_from_onnxruntime():
    """Why the emulation exists: torch's bilinear grid_sample sums in another order."""
    rng = np.random.default_rng(7)
    x = _image(rng, (2, 3, 7, 300))
    grid = (rng.integers(-32768, 32768, (2, 5, 33, 2)) * np.float32(1.3 / 32768)).astype(np.float32)
    mode, padding = SampleMode.BILINEAR, Padding.ZEROS
    want = _onnxruntime(x, grid, mode, padding, False)
    plain = F.grid_sample(torch.from_numpy(x), torch.from_numpy(grid), align_corners=False)
    assert (plain.numpy().view(np.int32) != want.view(np.int32)).sum() > 50


def test_bad_shapes_and_options_are_refused():
    x, grid = torch.zeros(1, 1, 4, 4), torch.zeros(1, 2, 2, 2)
    with pytest.raises(ValueError, match="grid \\[N, Ho, Wo, 2\\]"):
        ort_grid_sample(x[0], grid, SampleMode.BILINEAR, Padding.ZEROS, False)
    with pytest.raises(ValueError, match="SampleMode"):
        ort_grid_sample(x, grid, "bilinear", Padding.ZEROS, False)
