"""Export a calibrated Simulator as an ONNX QDQ model (QuantizeLinear / DequantizeLinear pairs
at quantlab's scales), and run it in onnxruntime.

The exporter's names load ONNX on first use, so a config that only names an
``ActivationEncoding`` (and ``python -m quantlab``, which registers every experiment) does not.
"""

from __future__ import annotations

import importlib

from quantlab.export.encoding import ActivationEncoding

_LAZY = {
    "SUPPORTED_OPS": "onnx_qdq",
    "QDQExport": "onnx_qdq",
    "to_onnx_qdq": "onnx_qdq",
    "UnsupportedOpError": "graph",
}

__all__ = ["ActivationEncoding", "SUPPORTED_OPS", "QDQExport", "UnsupportedOpError", "to_onnx_qdq"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"quantlab.export.{module}"), name)
    globals()[name] = value
    return value
