"""Export a calibrated Simulator as an ONNX QDQ model (QuantizeLinear / DequantizeLinear pairs
at quantlab's scales), and run it in onnxruntime."""

from quantlab.export.graph import ActivationEncoding, UnsupportedOpError
from quantlab.export.onnx_qdq import SUPPORTED_OPS, QDQExport, to_onnx_qdq

__all__ = ["ActivationEncoding", "SUPPORTED_OPS", "QDQExport", "UnsupportedOpError", "to_onnx_qdq"]
