"""Model-level patterns that quantlab treats as one op when it captures a model.

``inverse_sigmoid`` computes exactly what DETR-style models write by hand,
``log(clamp(x, eps) / clamp(1 - x, eps))``, but announces itself to torch function modes as a
single call, so op capture can give it one name, one qconfig and one look-up table.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.overrides import handle_torch_function, has_torch_function_unary


def inverse_sigmoid(x: Tensor, eps: float = 1e-5) -> Tensor:
    """log(clamp(x, eps) / clamp(1 - x, eps)); for x in [0, 1] the output is within
    +-ln((1 - eps) / eps) (11.5129 at eps = 1e-5)."""
    if has_torch_function_unary(x) or torch._C._is_torch_function_mode_enabled():
        return handle_torch_function(inverse_sigmoid, (x,), x, eps=eps)
    x1 = x.clamp(min=eps)
    x2 = (1 - x).clamp(min=eps)
    return torch.log(x1 / x2)


def inverse_sigmoid_bound(eps: float = 1e-5) -> float:
    """The largest |inverse_sigmoid| for inputs in [0, 1]: ln((1 - eps) / eps)."""
    import math

    return math.log((1 - eps) / eps)
