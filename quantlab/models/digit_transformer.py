"""A small vision transformer for scikit-learn's 8x8 digits, in three variants.

The same encoder with LayerNorm (``F.layer_norm``), with Dynamic Tanh instead of every
LayerNorm (DyT: ``gamma * tanh(alpha x) + beta``, one learnable alpha per layer), or with
softmax-free attention (SimA: queries and keys L1-normalised along the tokens, no softmax;
LayerNorm kept). Written with explicit ``@``, ``torch.softmax``, ``torch.tanh``,
``torch.reciprocal`` and ``F.embedding`` so op capture sees each op.
"""

from __future__ import annotations

import enum

import torch
import torch.nn.functional as F
from torch import Tensor, nn

IMAGE_SIDE = 8
PATCH = 2
TOKENS = (IMAGE_SIDE // PATCH) ** 2  # 16 tokens of 2x2 pixels
SIMA_EPS = 1e-6  # floor of the L1 norm of a query/key channel (all-zero channels)


class TokenNorm(enum.Enum):
    """The normalisation of every block and of the encoder output."""

    LAYER_NORM = "layer_norm"
    DYT = "dyt"


class Attention(enum.Enum):
    """SOFTMAX: softmax(q k^T / sqrt(d)) v. SIMA: (q_hat k_hat^T) v, with q_hat, k_hat each
    channel divided by its L1 norm over the tokens (SimA, arXiv:2206.08898)."""

    SOFTMAX = "softmax"
    SIMA = "sima"


class DyT(nn.Module):
    """Dynamic Tanh (arXiv:2503.10622): ``weight * tanh(alpha * x) + bias`` over the last dim,
    alpha a learnable scalar (initial value 0.5)."""

    def __init__(self, dim: int, alpha: float = 0.5):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), alpha))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * torch.tanh(self.alpha * x) + self.bias


def make_norm(kind: TokenNorm, dim: int) -> nn.Module:
    return nn.LayerNorm(dim) if kind is TokenNorm.LAYER_NORM else DyT(dim)


def l1_normalize_tokens(x: Tensor) -> Tensor:
    """x (B, H, T, d) with each channel divided by its L1 norm over the T tokens (floored at
    SIMA_EPS): a multiply by a reciprocal, as a fixed-point device divides."""
    return x * torch.reciprocal(x.abs().sum(dim=2, keepdim=True).clamp_min(SIMA_EPS))


class Block(nn.Module):
    """Pre-norm encoder block: x + proj(attention(norm1(x))), x + fc2(gelu(fc1(norm2(x))))."""

    def __init__(self, dim: int, heads: int, mlp: int, norm: TokenNorm, attention: Attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.norm1, self.norm2 = make_norm(norm, dim), make_norm(norm, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.fc1 = nn.Linear(dim, mlp)
        self.fc2 = nn.Linear(mlp, dim)

    def attend(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = (
            z.reshape(b, t, self.heads, hd).transpose(1, 2) for z in self.qkv(x).chunk(3, dim=-1)
        )
        if self.attention is Attention.SOFTMAX:
            probs = torch.softmax(q @ k.transpose(-2, -1) * (1.0 / hd**0.5), dim=-1)
        else:
            probs = l1_normalize_tokens(q) @ l1_normalize_tokens(k).transpose(-2, -1)
        return (probs @ v).transpose(1, 2).reshape(b, t, d)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.proj(self.attend(self.norm1(x)))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class DigitTransformer(nn.Module):
    """(B, 8, 8) digit images with pixels in [0, 1] -> (B, 10) class logits.

    16 tokens of 2x2 pixels, a linear patch embedding plus a learned position embedding
    (``F.embedding`` of the token positions), ``depth`` pre-norm blocks, a final norm, the mean
    over tokens and a linear classifier.
    """

    def __init__(
        self,
        norm: TokenNorm = TokenNorm.LAYER_NORM,
        attention: Attention = Attention.SOFTMAX,
        dim: int = 32,
        heads: int = 4,
        depth: int = 2,
        mlp: int = 64,
        classes: int = 10,
    ):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim must be a multiple of heads, got dim={dim}, heads={heads}")
        self.norm_kind, self.attention_kind = TokenNorm(norm), Attention(attention)
        self.embed = nn.Linear(PATCH * PATCH, dim)
        self.pos = nn.Embedding(TOKENS, dim)
        self.blocks = nn.ModuleList(
            Block(dim, heads, mlp, self.norm_kind, self.attention_kind) for _ in range(depth)
        )
        self.norm = make_norm(self.norm_kind, dim)
        self.head = nn.Linear(dim, classes)
        self.register_buffer("positions", torch.arange(TOKENS), persistent=False)

    def forward(self, images: Tensor) -> Tensor:
        b = images.shape[0]
        n = IMAGE_SIDE // PATCH
        patches = images.reshape(b, n, PATCH, n, PATCH).permute(0, 1, 3, 2, 4)
        x = self.embed(patches.reshape(b, TOKENS, PATCH * PATCH)) + self.pos(self.positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))
