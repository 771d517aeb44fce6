"""``torch.topk`` with ONNX's order of equal values, as quantized runs compute it.

Quantized values tie often (an int8 score takes one of 256 codes), and which of the tied
elements ``torch.topk`` returns, and in which order, is its kernel's own. ONNX's TopK defines
it: the larger (``largest``) or smaller values first, equal values by the lower index first;
the exported TopK computes that, so FAKE and FIXED runs do too (``topk_lower_index_first``).
A FLOAT run keeps the model's own ``torch.topk``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def topk_lower_index_first(
    input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
) -> torch.return_types.topk:
    """The ``k`` largest (smallest) values of ``input`` along ``dim`` and their indices, sorted,
    equal values by the lower index first (a stable sort; NaN counts as the largest, as in
    ``torch.topk``). ``sorted=False`` allows any order, so this one serves."""
    ordered = torch.sort(input, dim=dim, descending=largest, stable=True)
    return torch.return_types.topk(
        (ordered.values.narrow(dim, 0, k), ordered.indices.narrow(dim, 0, k))
    )
