"""Colour conversion of 8-bit images: RGB <-> NV12 (YUV 4:2:0, a Y plane and interleaved U, V).

Exact integer arithmetic: every conversion is a ratio of int64 numerators over a positive int64
denominator built from the matrix's decimal coefficients (Kr, Kb as integers over ``D``), rounded
once by ``div_round`` and clamped to [0, 255]. Numerators stay below 2**53 for 8-bit inputs.

The matrix (BT.601 or BT.709), the range (full: Y, U, V in 0..255 with chroma centred at 128;
limited: Y in 16..235, U, V in 16..240) and the rounding are parameters: the platform profile
names the ones it assumes (``PlatformConfig.image_yuv_*``).
"""

from __future__ import annotations

import enum

import torch
from torch import Tensor

from quantlab.numerics.rounding import Round


class YuvMatrix(enum.Enum):
    """Luma weights (Kr, Kb) as integers over a denominator D; Kg = D - Kr - Kb.

    BT601: Kr = 0.299, Kb = 0.114 (JPEG / SD video). BT709: Kr = 0.2126, Kb = 0.0722 (HD video).
    """

    BT601 = (299, 114, 1000)
    BT709 = (2126, 722, 10000)


class YuvRange(enum.Enum):
    """FULL: Y, U, V use 0..255 (chroma centred at 128). LIMITED (video range): Y = 16 + 219 Y',
    U, V = 128 + 224 C for Y' in [0, 1], C in [-1/2, 1/2]."""

    FULL = "full"
    LIMITED = "limited"


def _range_fracs(rng: YuvRange) -> tuple[int, tuple[int, int], tuple[int, int]]:
    """(luma offset, luma span / 255, chroma span / 255) as (numerator, denominator) pairs."""
    if rng is YuvRange.FULL:
        return 0, (1, 1), (1, 1)
    if rng is YuvRange.LIMITED:
        return 16, (219, 255), (224, 255)
    raise ValueError(f"unknown YUV range {rng!r}; allowed: {', '.join(r.name for r in YuvRange)}")


def div_round(num: Tensor, den: int, mode: Round) -> Tensor:
    """num / den rounded to an integer by ``mode`` (num int64, den > 0); exact, no saturation.

    HALF_UP: ties toward +inf; HALF_AWAY: ties away from zero; HALF_EVEN: ties to even;
    FLOOR; TRUNC (toward zero)."""
    if den <= 0:
        raise ValueError(f"div_round needs a positive denominator, got {den}")
    q = torch.div(num, den, rounding_mode="floor")
    r2 = 2 * (num - q * den)  # 2 * remainder, in [0, 2 den)
    if mode is Round.FLOOR:
        return q
    if mode is Round.TRUNC:
        return torch.where((num < 0) & (r2 > 0), q + 1, q)
    up = r2 > den
    tie = r2 == den
    if mode is Round.HALF_UP:
        up = up | tie
    elif mode is Round.HALF_EVEN:
        up = up | (tie & (q % 2 == 1))
    elif mode is Round.HALF_AWAY:
        up = up | (tie & (num >= 0))
    else:
        raise ValueError(f"div_round: unsupported rounding {mode!r}")
    return q + up.to(q.dtype)


def _u8(x: Tensor) -> Tensor:
    return x.clamp(0, 255).to(torch.uint8)


def _check_rgb(rgb: Tensor) -> None:
    if rgb.dtype != torch.uint8 or rgb.dim() != 4 or rgb.shape[1] != 3:
        raise ValueError(
            f"expected a uint8 (B, 3, H, W) RGB image, got {rgb.dtype} {tuple(rgb.shape)}"
        )
    if rgb.shape[2] % 2 or rgb.shape[3] % 2:
        raise ValueError(f"NV12 needs an even height and width, got {tuple(rgb.shape[2:])}")


def rgb_to_nv12(
    rgb: Tensor, matrix: YuvMatrix, rng: YuvRange, rounding: Round
) -> tuple[Tensor, Tensor]:
    """uint8 RGB (B, 3, H, W), H and W even -> (Y (B, H, W), UV (B, H/2, W/2, 2)), uint8.

    Y = Kr R + Kg G + Kb B per pixel; U, V = the mean over each 2x2 block of
    (B - Y) / (2 (1 - Kb)) and (R - Y) / (2 (1 - Kr)), offset to 128; the range maps them as
    ``YuvRange`` says. One rounding each (``rounding``), then clamped to [0, 255]."""
    _check_rgb(rgb)
    kr, kb, d = matrix.value
    kg = d - kr - kb
    y0, (yn, yd), (cn, cd) = _range_fracs(rng)
    r, g, b = (rgb[:, i].to(torch.int64) for i in range(3))
    yD = kr * r + kg * g + kb * b  # Y * D
    y = div_round(y0 * yd * d + yD * yn, yd * d, rounding)

    def block_sum(t: Tensor) -> Tensor:
        return t[:, 0::2, 0::2] + t[:, 1::2, 0::2] + t[:, 0::2, 1::2] + t[:, 1::2, 1::2]

    u_den = 4 * 2 * (d - kb) * cd
    v_den = 4 * 2 * (d - kr) * cd
    u = div_round(128 * u_den + block_sum(b * d - yD) * cn, u_den, rounding)
    v = div_round(128 * v_den + block_sum(r * d - yD) * cn, v_den, rounding)
    return _u8(y), torch.stack([_u8(u), _u8(v)], dim=-1)


def nv12_to_rgb(y: Tensor, uv: Tensor, matrix: YuvMatrix, rng: YuvRange, rounding: Round) -> Tensor:
    """(Y (B, H, W), UV (B, H/2, W/2, 2)) uint8 -> uint8 RGB (B, 3, H, W).

    Chroma upsampled by repetition (each 2x2 block takes its sample); then
    R = Y' + 2 (1 - Kr) Cr, B = Y' + 2 (1 - Kb) Cb,
    G = Y' - (2 Kr (1 - Kr) Cr + 2 Kb (1 - Kb) Cb) / Kg, with Y', Cb, Cr the range-decoded
    values. One rounding each (``rounding``), clamped to [0, 255]."""
    if y.dtype != torch.uint8 or uv.dtype != torch.uint8:
        raise ValueError(f"NV12 planes must be uint8, got {y.dtype} and {uv.dtype}")
    bsz, h, w = y.shape
    if tuple(uv.shape) != (bsz, h // 2, w // 2, 2) or h % 2 or w % 2:
        raise ValueError(
            f"NV12 planes of shapes {tuple(y.shape)} and {tuple(uv.shape)} do not match"
        )
    kr, kb, d = matrix.value
    kg = d - kr - kb
    y0, (yn, yd), (cn, cd) = _range_fracs(rng)
    up = uv.to(torch.int64).repeat_interleave(2, dim=1).repeat_interleave(2, dim=2)
    cb, cr = up[..., 0] - 128, up[..., 1] - 128
    yy = (y.to(torch.int64) - y0) * yd * cn * d  # Y' * (yn * cn * D), with Y' = (Y - y0) yd / yn
    den = yn * cn * d
    r = div_round(yy + 2 * (d - kr) * cr * cd * yn, den, rounding)
    b = div_round(yy + 2 * (d - kb) * cb * cd * yn, den, rounding)
    g_chroma = (2 * kr * (d - kr) * cr + 2 * kb * (d - kb) * cb) * cd * yn
    g = div_round(yy * kg - g_chroma, den * kg, rounding)
    return torch.stack([_u8(r), _u8(g), _u8(b)], dim=1)
