"""The onnxruntime reference of an ONNX model (fp32, CPU): what the converted module's float
run is checked against and what the experiments compare with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from quantlab.models import packages


def onnxruntime_runner(
    path: Path, names: list[str], unbatched: tuple[int, ...] = ()
) -> Callable[..., object]:
    """``run(*inputs)``: the ONNX file under onnxruntime (fp32, CPU); one output -> a tensor,
    several -> a tuple of tensors. A graph whose batch size is fixed (its first input's first
    dim) runs a larger batch (a multiple of it, every input alike) in slices along dim 0,
    its outputs concatenated along dim 0 (an experiment that merges evaluation batches).
    The outputs numbered in ``unbatched`` (of a batch-1 graph, without a batch axis) get one,
    as the converted module's do (``onnx_outputs.restore_batch_axis``)."""
    session = None

    def run_once(inputs) -> list[Tensor]:
        feed = {n: t.detach().cpu().numpy() for n, t in zip(names, inputs)}
        outs = [torch.from_numpy(o) for o in session.run(None, feed)]
        return [o.unsqueeze(0) if i in unbatched else o for i, o in enumerate(outs)]

    def run(*inputs: Tensor) -> object:
        nonlocal session
        if session is None:
            packages.package_dir(packages.ONNXRUNTIME, "the onnxruntime reference of model=onnx")
            import onnxruntime as ort

            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        fixed = session.get_inputs()[0].shape[0] if session.get_inputs() else None
        n = inputs[0].shape[0] if inputs and inputs[0].dim() else None
        sliced = (
            isinstance(fixed, int)
            and fixed > 0
            and n is not None
            and n != fixed
            and n % fixed == 0
            and all(t.dim() and t.shape[0] == n for t in inputs)
        )
        if not sliced:
            outs = run_once(inputs)
        else:
            parts = [run_once([t[i : i + fixed] for t in inputs]) for i in range(0, n, fixed)]
            outs = [torch.cat(p, 0) for p in zip(*parts)]
        return outs[0] if len(outs) == 1 else tuple(outs)

    return run
