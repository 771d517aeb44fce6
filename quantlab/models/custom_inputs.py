"""What a custom model's integer inputs take (``model.input_dtype``), so that seeded random
inputs can feed it, as ``onnx_inputs`` finds them for an ONNX graph.

An input declared int64 or int32 that indexes an embedding table (``F.embedding`` /
``nn.Embedding``, or ``table[ids]``, given the input as the model received it) takes values in
[0, rows of the table); any other takes ones (an attention mask that attends everywhere). The
tables are found by one run of the model on zeros of the declared shapes and dtypes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from quantlab.models.onnx_inputs import IntegerInput
from quantlab.models.schema import INPUT_DTYPES

TORCH_DTYPES = {name: getattr(torch, name) for name in INPUT_DTYPES}  # model.input_dtype's


class _TableReads(TorchFunctionMode):
    """Records, per input, the fewest rows of a table indexed by it as it is."""

    def __init__(self, inputs: tuple[Tensor, ...]) -> None:
        super().__init__()
        self._index_of = {id(t): i for i, t in enumerate(inputs)}
        self.rows: dict[int, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.embedding:
            ids = args[0] if args else kwargs.get("input")
            table = args[1] if len(args) > 1 else kwargs.get("weight")
            self._read(ids, table)
        elif func is Tensor.__getitem__ and len(args) == 2:
            self._read(args[1], args[0])
        return func(*args, **kwargs)

    def _read(self, ids, table) -> None:
        i = self._index_of.get(id(ids))
        if i is not None and isinstance(table, Tensor) and table.dim() >= 1:
            self.rows[i] = min(self.rows.get(i, table.shape[0]), int(table.shape[0]))


def custom_integers(
    module: nn.Module, shapes: tuple[tuple[int, ...], ...], dtypes: tuple[str, ...] | None
) -> tuple[IntegerInput | None, ...] | None:
    """Per input of ``shapes`` (without the batch dimension): its IntegerInput (module
    docstring), None for a float32 one; None where ``dtypes`` declares no integer input. A run
    on zeros that fails leaves the tables it did not reach unknown (ones)."""
    if dtypes is None or all(d == "float32" for d in dtypes):
        return None
    probe = tuple(torch.zeros((1, *s), dtype=TORCH_DTYPES[d]) for s, d in zip(shapes, dtypes))
    reads = _TableReads(probe)
    try:
        with torch.no_grad(), reads:
            module(*probe)
    except Exception:  # a model that cannot run on zeros: the first run on the data says why
        pass
    out: list[IntegerInput | None] = []
    for i, name in enumerate(dtypes):
        dtype = TORCH_DTYPES[name]
        if name == "float32":
            out.append(None)
        elif i in reads.rows:
            out.append(IntegerInput(dtype, 0, reads.rows[i] - 1))
        else:
            out.append(IntegerInput(dtype, 1, 1))
    return tuple(out)
