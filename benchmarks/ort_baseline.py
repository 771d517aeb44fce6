"""onnxruntime baselines for the simulator benchmark: the same torch module exported to ONNX
(fp32) and statically quantized to the QOperator format (QLinearConv / QLinearMatMul, weights
int8 per channel, activations uint8, calibrated on the given batches), each run in an
InferenceSession with ``intra_op_num_threads`` threads and ``session.intra_op.allow_spinning``
= "0" (an idle worker sleeps instead of spinning into the next timing)."""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn


def _names(n: int) -> list[str]:
    return [f"in{i}" for i in range(n)]


def export_onnx(module: nn.Module, inputs: tuple, path: Path) -> None:
    """Export ``module`` (eval mode) at the shapes of ``inputs`` (TorchScript exporter,
    opset 17)."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        names = _names(len(inputs))
        opts = dict(input_names=names, dynamo=False, opset_version=17)
        torch.onnx.export(module, inputs, str(path), **opts)


def session(model: Path | bytes, threads: int):
    """An InferenceSession of ``model`` (an ONNX file, or a serialized model) on ``threads``
    intra-op threads and one inter-op thread, ``session.intra_op.allow_spinning`` = "0": every
    benchmark's onnxruntime baseline is built here."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])


def ort_runners(
    module: nn.Module, inputs: tuple, calib: Sequence[tuple], threads: int
) -> dict[str, Callable[[], object]]:
    """{"onnxruntime fp32": run, "onnxruntime int8 QOperator": run}, each running ``inputs``."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    names = _names(len(inputs))

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter([dict(zip(names, (t.numpy() for t in b))) for b in calib])

        def get_next(self):
            return next(self._it, None)

    feed = {n: np.ascontiguousarray(t.numpy()) for n, t in zip(names, inputs)}
    tmp = Path(tempfile.mkdtemp(prefix="quantlab_ort_"))
    fp32, int8 = tmp / "fp32.onnx", tmp / "int8.onnx"
    export_onnx(module, inputs, fp32)
    quiet = logging.getLogger()
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the quantizer's advice to pre-process the model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_static(
            str(fp32),
            str(int8),
            _Reader(),
            quant_format=QuantFormat.QOperator,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )
    quiet.setLevel(level)
    s32, s8 = session(fp32, threads), session(int8, threads)
    for p in (fp32, int8):
        p.unlink()
    tmp.rmdir()
    return {
        "onnxruntime fp32": lambda: s32.run(None, feed),
        "onnxruntime int8 QOperator": lambda: s8.run(None, feed),
    }
