"""Toy attention-era models with seeded random weights: transformer block, DETR-style box
refinement decoder, positional encodings (DETR sine, rotary, NeRF frequencies).

Written with explicit ``@``/``torch.matmul``, ``torch.softmax``, ``F.layer_norm``, ``F.gelu``,
``torch.sin``/``torch.cos`` and ``quantlab.ops.inverse_sigmoid`` so op capture sees each op.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from quantlab.ops import inverse_sigmoid


def attention(q: Tensor, k: Tensor, v: Tensor, heads: int) -> Tensor:
    """Multi-head scaled dot-product attention written out: (B, T, D) x3 -> (B, T, D)."""
    b, t, d = q.shape
    s = k.shape[1]

    def split(x: Tensor, n: int) -> Tensor:
        return x.reshape(b, n, heads, d // heads).permute(0, 2, 1, 3)

    qh, kh, vh = split(q, t), split(k, s), split(v, s)
    scores = qh @ kh.transpose(-2, -1) * (1.0 / math.sqrt(d // heads))
    probs = torch.softmax(scores, dim=-1)
    return (probs @ vh).permute(0, 2, 1, 3).reshape(b, t, d)


class TransformerBlock(nn.Module):
    """Pre-norm transformer encoder block: (B, T, dim) -> (B, T, dim).

    x + proj(attention(layer_norm(x))), then x + fc2(gelu(fc1(layer_norm(x)))).
    """

    def __init__(self, dim: int = 32, heads: int = 4, mlp_ratio: int = 4):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim must be a multiple of heads, got dim={dim}, heads={heads}")
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        x = x + self.proj(attention(q, k, v, self.heads))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class DetrDecoder(nn.Module):
    """DETR-style iterative box refinement: (queries (B, Q, dim), ref (B, Q, 4) in (0, 1)) ->
    refined boxes (B, Q, 4) in (0, 1) (cx, cy, w, h).

    Each of ``layers`` layers updates the queries (self-attention conditioned on a positional
    embedding of the current boxes, then an MLP), predicts a box delta and refines
    ``ref = sigmoid(delta + inverse_sigmoid(ref))``. With ``use_inverse_sigmoid=False`` the layer
    instead computes ``ref = sigmoid(delta + clamp(logit_ref, -clamp_logit, clamp_logit))`` where
    ``logit_ref`` is carried from the previous layer (the clamped-logit variant, no
    inverse_sigmoid); the first layer starts from ``log(ref / (1 - ref))`` of the input boxes.
    """

    def __init__(
        self,
        dim: int = 32,
        heads: int = 4,
        layers: int = 6,
        use_inverse_sigmoid: bool = True,
        clamp_logit: float = 8.0,
    ):
        super().__init__()
        self.heads = heads
        self.use_inverse_sigmoid = use_inverse_sigmoid
        self.clamp_logit = clamp_logit
        self.box_embed = nn.ModuleList(nn.Linear(4, dim) for _ in range(layers))
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.norm1 = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.mlp = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))
            for _ in range(layers)
        )
        self.norm2 = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.delta = nn.ModuleList(nn.Linear(dim, 4) for _ in range(layers))
        for head in self.delta:  # small initial refinements, as DETR variants initialise them
            nn.init.normal_(head.weight, std=0.01)
            nn.init.zeros_(head.bias)

    def forward(self, queries: Tensor, ref: Tensor) -> Tensor:
        h = queries
        logit = torch.log(ref / (1 - ref)) if not self.use_inverse_sigmoid else None
        for i in range(len(self.delta)):
            x = h + self.box_embed[i](ref)
            q, k, v = self.qkv[i](x).chunk(3, dim=-1)
            h = self.norm1[i](h + attention(q, k, v, self.heads))
            h = self.norm2[i](h + self.mlp[i](h))
            delta = self.delta[i](h)
            if self.use_inverse_sigmoid:
                ref = torch.sigmoid(delta + inverse_sigmoid(ref))
            else:
                logit = torch.clamp(delta + logit, -self.clamp_logit, self.clamp_logit)
                ref = torch.sigmoid(logit)
        return ref


def frequencies(count: int, dim: int, base: float = 10000.0) -> Tensor:
    """base^(-2i/dim) for i < count, float32: the inverse wavelengths of sine/rotary encodings."""
    return base ** (-2 * torch.arange(count, dtype=torch.float64) / dim).to(torch.float32)


def sine_embedding(coords: Tensor, inv_freq: Tensor) -> Tensor:
    """DETR's sine position embedding of unnormalised coordinates: (..., C) -> (..., C*2F) for
    ``inv_freq`` of length F (``frequencies(F, 2F)``): sin(c * inv_freq), cos(c * inv_freq). With
    pixel coordinates the first frequency sees the raw value (hundreds of periods across a wide
    image)."""
    a = coords.unsqueeze(-1) * inv_freq
    return torch.cat([torch.sin(a), torch.cos(a)], -1).flatten(-2)


def nerf_encoding(x: Tensor, freqs: Tensor) -> Tensor:
    """NeRF frequency encoding of x in [-1, 1]: (..., C) -> (..., 2*C*L) for ``freqs`` =
    2^k pi, k < L: sin(2^k pi x), cos(2^k pi x) (up to 2^(L-1) periods)."""
    a = x.unsqueeze(-1) * freqs
    return torch.cat([torch.sin(a), torch.cos(a)], -1).flatten(-2)


def nerf_frequencies(count: int) -> Tensor:
    """2^k pi for k < count, float32."""
    return (2.0 ** torch.arange(count, dtype=torch.float64) * math.pi).to(torch.float32)


def rotary(x: Tensor, positions: Tensor, inv_freq: Tensor) -> Tensor:
    """Rotary position embedding: rotate channel pairs (2i, 2i+1) of x (B, T, D) by the angle
    positions (B, T) * inv_freq[i] (``inv_freq`` of length D/2, e.g. ``frequencies(D/2, D)``)."""
    ang = positions.unsqueeze(-1) * inv_freq
    c, s = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).flatten(-2)


class PosEnc(nn.Module):
    """Positional encodings with ``torch.sin``/``torch.cos`` on wide-range inputs:
    (coords (B, N, 2) in pixels of a ``width`` x ``height`` image) -> (B, N, dim).

    Three encodings feed one small attention layer: DETR sine embedding of the raw pixel
    coordinates (up to ``width`` radians), a NeRF frequency encoding of the normalised coordinates
    (up to 2^(num_freqs-1) periods), and rotary embedding of q and k with the x pixel coordinate as
    position.
    """

    def __init__(
        self,
        dim: int = 32,
        num_feats: int = 16,
        num_freqs: int = 8,
        width: int = 1920,
        height: int = 1080,
    ):
        super().__init__()
        self.register_buffer("size", torch.tensor([float(width), float(height)]))
        self.register_buffer("sine_freq", frequencies(num_feats // 2, num_feats))
        self.register_buffer("nerf_freq", nerf_frequencies(num_freqs))
        self.register_buffer("rotary_freq", frequencies(dim // 2, dim))
        self.embed = nn.Linear(2 * num_feats + 4 * num_freqs, dim)
        self.qk = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, coords: Tensor) -> Tensor:
        sine = sine_embedding(coords, self.sine_freq)
        nerf = nerf_encoding(coords / self.size * 2 - 1, self.nerf_freq)
        h = torch.relu(self.embed(torch.cat([sine, nerf], -1)))
        q, k = self.qk(h).chunk(2, dim=-1)
        pos = coords[..., 0]
        q, k = rotary(q, pos, self.rotary_freq), rotary(k, pos, self.rotary_freq)
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))
        return self.out(torch.softmax(scores, -1) @ h)
