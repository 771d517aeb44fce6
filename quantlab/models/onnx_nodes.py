"""What the onnx2torch converters quantlab adds (``onnx_recurrent``, ``onnx_functional``,
``onnx_versions``) read from a node, and how they refuse one."""

from __future__ import annotations


def attribute_text(value, default: str | None = None) -> str | None:
    """A string attribute of an ONNX node (bytes in the proto) as text; ``default`` if unset."""
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def refuse(node, what: str) -> None:
    """Stop the conversion of ``node``, naming what it holds (onnx_import reports the model)."""
    raise NotImplementedError(f"ONNX {node.operation_type} node with {what} is not converted")
