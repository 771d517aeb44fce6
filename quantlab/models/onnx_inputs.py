"""What an ONNX graph's integer inputs take, so that seeded random inputs can feed it: token ids,
token types, masks, indices.

An integer (or bool) input that is the indices of a Gather on an initializer (an embedding
table) takes values in [0, rows of the table); any other integer input takes ones (an
attention mask that attends everywhere, a count of one). Float inputs are None here: their
values come from ``quantlab.models.inputs.random_inputs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


@dataclass(frozen=True)
class IntegerInput:
    """Seeded values of one integer input: uniform in [low, high] (int ``dtype``)."""

    dtype: torch.dtype
    low: int
    high: int

    def make(self, gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
        if self.low == self.high:
            return torch.full(shape, self.low, dtype=self.dtype)
        return torch.randint(self.low, self.high + 1, shape, generator=gen, dtype=self.dtype)


def integer_inputs(path: str | Path) -> tuple[IntegerInput | None, ...]:
    """Per graph input (initializers left out, in order): its IntegerInput, or None for a float
    input (module docstring)."""
    import onnx
    from onnx import helper

    model = onnx.load(str(path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    rows = {i.name: int(i.dims[0]) for i in model.graph.initializer if len(i.dims) >= 1}
    table_rows: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[0] in rows:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            if axis == 0:
                table_rows[node.input[1]] = rows[node.input[0]]
    out: list[IntegerInput | None] = []
    for inp in model.graph.input:
        if inp.name in initializers:
            continue
        np_dtype = helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
        dtype = torch.from_numpy(np.zeros(0, dtype=np_dtype)).dtype
        if dtype.is_floating_point or dtype.is_complex:
            out.append(None)
        elif inp.name in table_rows:
            out.append(IntegerInput(dtype, 0, table_rows[inp.name] - 1))
        else:
            out.append(IntegerInput(dtype, 1, 1))
    return tuple(out)
