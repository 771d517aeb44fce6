"""Input size limits of the device's grid_sample (j6-numerics s.4)."""

from __future__ import annotations

from quantlab.numerics.grid_sample.grid import check_size


def grid_limit_violation(h: int, w: int, max_side: int, max_area: int) -> str | None:
    """A sentence naming the broken limit (H, W <= max_side; H*W <= max_area; 0 = none) or None."""
    if max_side and (h > max_side or w > max_side):
        return f"H={h}, W={w} exceed grid_max_side={max_side} (H, W must be in [1, {max_side}])"
    if max_area and h * w > max_area:
        return f"H*W={h * w} exceeds grid_max_area={max_area}"
    return None


def check_grid_limits(h: int, w: int, max_side: int, max_area: int) -> None:
    """Raise ValueError if an H x W grid_sample input breaks the size limits ``max_side``
    (H, W) and ``max_area`` (H*W); 0 = no limit (a platform's ``grid_max_side`` and
    ``grid_max_area``)."""
    check_size("h", h)
    check_size("w", w)
    msg = grid_limit_violation(h, w, max_side, max_area)
    if msg is not None:
        raise ValueError(
            f"grid_sample input {h}x{w} is not supported: {msg}; split W with split_grid_sample"
        )
