"""Random nets for the tests: a random program of steps drawn from a table (``STEPS``), each
step reading earlier tensors: GEMMs with fused chains (batch_norm, clamps) reached late, in-place
writes through views and chunks, in-place sums on a tensor other steps hold, item assignment,
calls that are not modelled ops, views kept and read after writes. Every tensor of a program is
(2, C, S, S)."""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from torch import nn

C, S = 4, 5  # every tensor of a program is (2, C, S, S)


def _pad(t: torch.Tensor) -> torch.Tensor:
    """``t`` with C channels again: a narrower one repeats its first channel (cat, expand)."""
    if t.shape[1] == C:
        return t
    return torch.cat([t, t[:, :1].expand(-1, C - t.shape[1], -1, -1)], 1)


def _bn(c: int) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(c)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


# name -> (modules it owns, step(t, u, a, b, mods, writes) -> the new tensor). t and u are earlier
# tensors; 0 <= a < b <= C a channel range; ``writes``: whether t may be written into (it is not
# the model's input).
STEPS = {
    "conv": (lambda: [nn.Conv2d(C, C, 1)], lambda t, u, a, b, m, w: m[0](t)),
    "conv3": (lambda: [nn.Conv2d(C, C, 3, padding=1)], lambda t, u, a, b, m, w: m[0](t)),
    "conv_bn": (
        lambda: [nn.Conv2d(C, C, 1, bias=False), _bn(C)],
        lambda t, u, a, b, m, w: m[1](m[0](t)),
    ),
    "bn": (lambda: [_bn(C)], lambda t, u, a, b, m, w: m[0](t)),
    "linear": (lambda: [nn.Linear(S, S)], lambda t, u, a, b, m, w: m[0](t)),
    "layer_norm": (lambda: [nn.LayerNorm(S)], lambda t, u, a, b, m, w: m[0](t)),
    "relu6_": (None, lambda t, u, a, b, m, w: F.relu6(t, inplace=w)),
    "relu_": (None, lambda t, u, a, b, m, w: t.relu_() if w else t.relu()),
    "hardtanh_": (None, lambda t, u, a, b, m, w: F.hardtanh(t, -0.5, 0.5, inplace=w)),
    "sigmoid_": (None, lambda t, u, a, b, m, w: t.sigmoid_() if w else t.sigmoid()),
    "clamp_": (None, lambda t, u, a, b, m, w: t.clamp_(-1, 1) if w else t.clamp(-1, 1)),
    "add_": (None, lambda t, u, a, b, m, w: t.add_(u) if w else t + u),
    "masked_fill_": (
        None,
        lambda t, u, a, b, m, w: t.masked_fill_(u > 0.5, 0.25) if w else t.masked_fill(u > 0, 1),
    ),
    "gelu": (None, lambda t, u, a, b, m, w: F.gelu(t)),
    "hardswish": (None, lambda t, u, a, b, m, w: F.hardswish(t)),
    "tanh": (None, lambda t, u, a, b, m, w: torch.tanh(t)),
    "exp": (None, lambda t, u, a, b, m, w: torch.exp(t.clamp(-3, 3))),
    "softmax": (None, lambda t, u, a, b, m, w: torch.softmax(t, -1)),
    "add": (None, lambda t, u, a, b, m, w: t + u),
    "sub": (None, lambda t, u, a, b, m, w: t - u),
    "mul": (None, lambda t, u, a, b, m, w: t * u),
    "div": (None, lambda t, u, a, b, m, w: t / (u.abs() + 1)),
    "scale": (None, lambda t, u, a, b, m, w: t * 0.75),
    "mean_mul": (None, lambda t, u, a, b, m, w: t * u.mean((2, 3), keepdim=True)),
    "matmul": (None, lambda t, u, a, b, m, w: t @ u),
    "matmul_t": (None, lambda t, u, a, b, m, w: t @ u.transpose(-1, -2)),
    "avg_pool": (None, lambda t, u, a, b, m, w: F.avg_pool2d(t, 3, 1, 1)),
    "stack_sum": (None, lambda t, u, a, b, m, w: torch.stack([t, u]).sum(0)),
    "cat_narrow": (None, lambda t, u, a, b, m, w: torch.cat([t, u], 1)[:, a : a + C]),
    "permute": (None, lambda t, u, a, b, m, w: t.permute(0, 1, 3, 2)),
    "transpose_copy": (None, lambda t, u, a, b, m, w: t.transpose(2, 3).contiguous()),
    "reshape": (None, lambda t, u, a, b, m, w: t.reshape(2, C, S * S).reshape(2, C, S, S)),
    "slice_view": (None, lambda t, u, a, b, m, w: _pad(t[:, a:b])),
    "dw_conv": (
        lambda: [nn.Conv2d(C, C, 3, padding=1, groups=C)],
        lambda t, u, a, b, m, w: m[0](t),
    ),
    "group_norm": (lambda: [nn.GroupNorm(2, C)], lambda t, u, a, b, m, w: m[0](t)),
    "squeeze_excite": (
        None,
        lambda t, u, a, b, m, w: t * torch.sigmoid(u.mean((2, 3), keepdim=True)),
    ),
    "where": (None, lambda t, u, a, b, m, w: torch.where(u > 0, t, u)),
    "upsample": (
        None,
        lambda t, u, a, b, m, w: F.avg_pool2d(F.interpolate(t, scale_factor=2.0), 2),
    ),
    "max_pool": (None, lambda t, u, a, b, m, w: F.max_pool2d(t, 3, 1, 1)),
    "silu": (None, lambda t, u, a, b, m, w: F.silu(t)),
}


def _slice_add_(t, u, a, b, m, w):
    if not w:
        return t + 0.5
    t[:, a:b] += 0.5
    return t


def _slice_mul_(t, u, a, b, m, w):
    if not w:
        return t * 1.5
    t[:, a:b].mul_(1.5)
    return t


def _chunk_mul_(t, u, a, b, m, w):
    lo, hi = t.chunk(2, dim=1)
    if w:
        lo.mul_(0.5)
    return _pad(hi)


def _split_add_(t, u, a, b, m, w):
    lo, hi = t.split([a + 1, C - a - 1], 1)
    if w:
        hi.add_(1.0)
    return _pad(lo)


def _index_add_(t, u, a, b, m, w):
    if not w:
        return t.abs()
    return t.index_add_(1, torch.tensor([a]), torch.ones_like(u[:, :1]))


def _setitem(t, u, a, b, m, w):
    if not w:
        return t.flip(1)
    t[:, a] = u[:, b - 1]
    return t


def _residual_relu_(t, u, a, b, m, w):
    if not w:
        return F.relu(t + u)
    t += u  # a residual block's in-place sum: every name bound to t sees it
    return F.relu(t, inplace=True)


STEPS.update(
    {
        "residual_relu_": (None, _residual_relu_),
        "slice_add_": (None, _slice_add_),
        "slice_mul_": (None, _slice_mul_),
        "chunk_mul_": (None, _chunk_mul_),
        "split_add_": (None, _split_add_),
        "index_add_": (None, _index_add_),
        "setitem": (None, _setitem),
    }
)


# transposed convolutions (upsampling decoders), kept apart from STEPS so that the nets of STEPS
# stay as they are: a table of their own mixes them with convolutions, norms and table ops
UPSAMPLING_STEPS = {
    "conv_transpose": (
        lambda: [nn.ConvTranspose2d(C, C, 3, padding=1)],
        lambda t, u, a, b, m, w: m[0](t),
    ),
    "up_down": (  # stride 2 up, average pool back to S x S
        lambda: [nn.ConvTranspose2d(C, C, 2, stride=2)],
        lambda t, u, a, b, m, w: F.avg_pool2d(m[0](t), 2),
    ),
    "conv_transpose_bn": (
        lambda: [nn.ConvTranspose2d(C, C, 3, padding=1, bias=False), _bn(C)],
        lambda t, u, a, b, m, w: m[1](m[0](t)),
    ),
    "grouped_conv_transpose_relu6": (
        lambda: [nn.ConvTranspose2d(C, C, 3, padding=1, groups=2)],
        lambda t, u, a, b, m, w: F.relu6(m[0](t)),
    ),
} | {
    name: STEPS[name]
    for name in "conv3 conv_bn relu_ add_ sigmoid_ hardswish add mul cat_narrow".split()
}


class RandomNet(nn.Module):
    """``n_steps`` random steps (from ``steps``, default ``STEPS``) over the input and every
    tensor made so far; returns the last tensor plus the middle one, or the last two as a
    tuple."""

    def __init__(self, seed: int, n_steps: int, steps: dict | None = None) -> None:
        super().__init__()
        self.table = STEPS if steps is None else steps
        rng = random.Random(seed)
        self.program, mods = [], []
        for k in range(n_steps):
            name = rng.choice(sorted(self.table))
            make, _ = self.table[name]
            a = rng.randrange(C - 1)
            own = make() if make else []
            self.program.append(
                (name, rng.randrange(k + 1), rng.randrange(k + 1), a, rng.randrange(a + 1, C + 1))
            )
            mods.append(nn.ModuleList(own))
        self.steps = nn.ModuleList(mods)
        self.pair = rng.random() < 0.5

    def forward(self, x):
        ts = [x]
        for (name, i, j, a, b), mods in zip(self.program, self.steps, strict=True):
            ts.append(self.table[name][1](ts[i], ts[j], a, b, mods, i > 0))
        return (ts[-2], ts[-1]) if self.pair else ts[-1] + ts[len(ts) // 2]
