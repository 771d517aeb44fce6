"""torch's nearest and nearest-exact pixels per axis (``numerics.torch_nearest``): indexing a
contiguous float32 input by them gives ``F.interpolate``'s result on every size and factor
tried, 1 to 3 spatial axes, any batch and channel count; the premise that float64 codes would
read other pixels; bad arguments."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from quantlab.numerics.torch_nearest import NEAREST_MODES, torch_nearest_indices


def _indexed(x, indices):
    for axis, idx in enumerate(indices):
        x = x.index_select(2 + axis, idx)
    return x


SIZES = [1, 2, 3, 5, 9, 14]
OUTS = [1, 2, 4, 6, 41, 61, 82, 119]


@pytest.mark.parametrize("mode", NEAREST_MODES)
def test_indices_give_torchs_result_by_size(mode):
    g = torch.Generator().manual_seed(0)
    for h, w, oh, ow in itertools.product(SIZES, SIZES, OUTS, OUTS[::3]):
        for nc in ((1, 1), (2, 5)):
            x = torch.randn(*nc, h, w, generator=g)
            want = F.interpolate(x, size=(oh, ow), mode=mode)
            got = _indexed(x, torch_nearest_indices((h, w), mode, size=[oh, ow]))
            assert torch.equal(got, want), (mode, h, w, oh, ow, nc)


@pytest.mark.parametrize("mode", NEAREST_MODES)
@pytest.mark.parametrize("recompute", [None, True])
def test_indices_give_torchs_result_by_factor(mode, recompute):
    g = torch.Generator().manual_seed(1)
    factors = [0.3, 1 / 3, 0.5, 0.9, 1.3, 1.5, 2.0, 2.05, 2.5, 3.0, (0.6, 1.7), 41.0]
    for n, sf in itertools.product((2, 3, 5, 8, 13, 17, 29), factors):
        pair = sf if isinstance(sf, tuple) else (sf, sf)
        if int(n * min(pair)) < 1:
            continue
        x = torch.randn(2, 3, n, n + 1, generator=g)
        kw = dict(scale_factor=sf, recompute_scale_factor=recompute)
        want = F.interpolate(x, mode=mode, **kw)
        got = _indexed(x, torch_nearest_indices((n, n + 1), mode, **kw))
        assert torch.equal(got, want), (mode, n, sf, recompute)


@pytest.mark.parametrize("mode", NEAREST_MODES)
def test_one_and_three_spatial_axes(mode):
    g = torch.Generator().manual_seed(2)
    for n, out in itertools.product((2, 3, 7, 14), (1, 5, 61, 82)):
        x = torch.randn(2, 3, n, generator=g)
        got = _indexed(x, torch_nearest_indices((n,), mode, size=out))
        assert torch.equal(got, F.interpolate(x, size=out, mode=mode)), (mode, n, out)
    x = torch.randn(1, 2, 3, 4, 5, generator=g)
    for kw in (dict(size=(5, 9, 2)), dict(scale_factor=1.5), dict(scale_factor=(2.0, 0.5, 3.0))):
        got = _indexed(x, torch_nearest_indices((3, 4, 5), mode, **kw))
        assert torch.equal(got, F.interpolate(x, mode=mode, **kw)), kw


def test_float64_inputs_would_read_other_pixels():
    """Why the indices come from a float32 ramp: torch maps positions in its input's op-math
    type, so the same call on float64 values reads another pixel on these sizes."""
    x = torch.arange(4, dtype=torch.float32).view(1, 1, 2, 2)
    f32 = F.interpolate(x, size=(82, 82), mode="nearest")
    f64 = F.interpolate(x.double(), size=(82, 82), mode="nearest")
    assert not torch.equal(f32.double(), f64)
    assert torch.equal(_indexed(x, torch_nearest_indices((2, 2), "nearest", size=(82, 82))), f32)
    r = torch.arange(2, dtype=torch.float32).view(1, 1, 2)
    exact = [
        F.interpolate(r.to(dt), size=61, mode="nearest-exact")
        for dt in (torch.float32, torch.float64)
    ]
    assert not torch.equal(exact[0].double(), exact[1])


def test_the_cache_hands_out_copies():
    a = torch_nearest_indices((3, 4), "nearest", size=(5, 6))
    a[0].fill_(-1)
    b = torch_nearest_indices((3, 4), "nearest", size=(5, 6))
    assert int(b[0].min()) >= 0


@pytest.mark.parametrize(
    ("spatial", "mode", "match"),
    [
        ((4, 4), "bilinear", "mode must be one of"),
        ((), "nearest", "spatial sizes"),
        ((0, 3), "nearest", "spatial sizes"),
        ((1, 1, 1, 1), "nearest", "spatial sizes"),
        ((1 << 24, 1), "nearest", "spatial sizes"),
    ],
)
def test_bad_arguments_are_refused(spatial, mode, match):
    with pytest.raises(ValueError, match=match):
        torch_nearest_indices(spatial, mode, size=2)
