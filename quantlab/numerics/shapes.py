"""Broadcasting of per-channel parameters (scales, biases, multipliers) along one axis."""

from __future__ import annotations

from torch import Tensor


def along_axis(p: Tensor, like: Tensor, axis: int, what: str) -> Tensor:
    """``p`` (1-d, one value per channel) reshaped to broadcast along ``axis`` of ``like``.

    Raises ValueError naming ``what`` when ``p`` is not 1-d with ``like.shape[axis]`` values.
    """
    ax = axis % like.dim()
    if p.dim() != 1 or p.numel() != like.shape[ax]:
        raise ValueError(
            f"{what} must have shape ({like.shape[ax]},) for axis {ax} of a tensor of shape "
            f"{tuple(like.shape)}, got {tuple(p.shape)}"
        )
    shape = [1] * like.dim()
    shape[ax] = -1
    return p.reshape(shape)


def along_param(p: Tensor, like: Tensor, axis: int, what: str) -> Tensor:
    """``p`` as it is when 0-d (per tensor), else (per channel, any shape of as many values)
    ``along_axis`` of its values."""
    return p if p.dim() == 0 else along_axis(p.reshape(-1), like, axis, what)
