"""Box metrics for detection-style outputs: boxes are (cx, cy, w, h) in image units [0, 1]."""

from __future__ import annotations

import torch
from torch import Tensor


def cxcywh_to_xyxy(b: Tensor) -> Tensor:
    """(cx, cy, w, h) -> (x0, y0, x1, y1) on the last axis (float64)."""
    b = b.to(torch.float64)
    cx, cy, w, h = b.unbind(-1)
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)


def box_l1(pred: Tensor, ref: Tensor) -> float:
    """Mean absolute difference of the 4 box coordinates (image units, float64)."""
    return float((pred.to(torch.float64) - ref.to(torch.float64)).abs().mean())


def box_iou(pred: Tensor, ref: Tensor) -> Tensor:
    """IoU of matching boxes (same shape, (..., 4) cxcywh); 0 where the union is empty."""
    a, b = cxcywh_to_xyxy(pred), cxcywh_to_xyxy(ref)
    lo = torch.maximum(a[..., :2], b[..., :2])
    hi = torch.minimum(a[..., 2:], b[..., 2:])
    inter = (hi - lo).clamp_min(0).prod(-1)
    area_a = (a[..., 2:] - a[..., :2]).clamp_min(0).prod(-1)
    area_b = (b[..., 2:] - b[..., :2]).clamp_min(0).prod(-1)
    union = area_a + area_b - inter
    return torch.where(union > 0, inter / union.clamp_min(1e-300), torch.zeros_like(union))


def mean_iou(pred: Tensor, ref: Tensor) -> float:
    """Mean IoU over all boxes."""
    return float(box_iou(pred, ref).mean())
