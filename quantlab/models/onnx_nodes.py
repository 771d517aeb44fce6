"""What the onnx2torch converters quantlab adds (``onnx_recurrent``, ``onnx_functional``,
``onnx_versions``, ``onnx_added_ops``, ``onnx_resize``) share: reading a node and its graph's
opset, refusing one, wrapping the module made for it, and adding a converter to onnx2torch's
registry where it has none, in place of its own, or around the one held there."""

from __future__ import annotations

from collections.abc import Callable, Iterable


def attribute_text(value, default: str | None = None) -> str | None:
    """A string attribute of an ONNX node (bytes in the proto) as text; ``default`` if unset."""
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def refuse(node, what: str) -> None:
    """Stop the conversion of ``node``, naming what it holds (onnx_import reports the model)."""
    raise NotImplementedError(f"ONNX {node.operation_type} node with {what} is not converted")


def converted(node, module, first_input_only: bool = False):
    """onnx2torch's result for ``node``: ``module`` fed the node's inputs, or its first one only
    (``first_input_only``: the module holds what the others were, weights or constants)."""
    from onnx2torch.utils.common import (
        OnnxMapping,
        OperationConverterResult,
        onnx_mapping_from_node,
    )

    if first_input_only:
        mapping = OnnxMapping(inputs=(node.input_values[0],), outputs=node.output_values)
    else:
        mapping = onnx_mapping_from_node(node)
    return OperationConverterResult(torch_module=module, onnx_mapping=mapping)


def registry_key(op: str, version: int):
    """The key of an ONNX-domain op version in onnx2torch's converter registry."""
    from onnx2torch.node_converters.registry import OperationDescription

    return OperationDescription(domain="", operation_type=op, version=version)


def add_missing(op: str, versions: Iterable[int], converter: Callable) -> None:
    """Register ``converter`` for each of ``versions`` of ``op`` that onnx2torch has no
    converter for (so that adding twice, or over one of its own, changes nothing)."""
    from onnx2torch.node_converters.registry import _CONVERTER_REGISTRY, add_converter

    for version in versions:
        if registry_key(op, version) not in _CONVERTER_REGISTRY:
            add_converter(operation_type=op, version=version)(converter)


def replace(op: str, versions: Iterable[int], converter: Callable) -> None:
    """Register ``converter`` for each of ``versions`` of ``op``, in place of onnx2torch's own
    where it has one (for ops whose onnx2torch converter fails on inputs the op takes)."""
    from onnx2torch.node_converters.registry import _CONVERTER_REGISTRY

    for version in versions:
        _CONVERTER_REGISTRY.pop(registry_key(op, version), None)
    add_missing(op, versions, converter)


def wrap_held(op: str, versions: Iterable[int], wrapper: Callable) -> None:
    """Register ``wrapper(held)`` for each of ``versions`` of ``op`` where onnx2torch's registry
    holds a converter, in place of it; once (a converter wrapped so is not wrapped again when
    the converters are registered anew)."""
    from onnx2torch.node_converters.registry import _CONVERTER_REGISTRY

    for version in versions:
        held = _CONVERTER_REGISTRY.get(registry_key(op, version))
        if held is not None and not getattr(held, "wrapped", False):
            convert = wrapper(held)
            convert.wrapped = True
            replace(op, (version,), convert)


def graph_opset(model) -> int:
    """An ONNX model's default-domain opset (1 where it names none)."""
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=1)
