"""Which activation encodings this machine's onnxruntime computes as a quantlab profile does.

Where onnxruntime's uint8 x int8 products sum exactly (VNNI, AMX, Arm), the tests' small
models give the ``onnxruntime`` profile's bits under both encodings (whole networks exported
SIGNED run some int8 convolutions as float32 Conv there too: reports/onnx_fidelity's SIGNED
rows). Where they saturate in pairs (x86 without VNNI,
``export.ort_host``), ``onnxruntime_no_vnni`` models the uint8 activations of an
UNSIGNED_OFFSET export; a SIGNED export's int8 Q/DQ pairs onnxruntime there partly turns into
uint8 (whose GEMMs then saturate) and partly leaves unfused, running the op in float32 between
Dequantize and Quantize, which no profile models (README;
``test_signed_exports_are_modelled_only_where_products_sum_exactly`` checks the premise on every
machine). A test of a SIGNED export's bits runs where products sum exactly.
"""

from __future__ import annotations

import pytest

from quantlab.export import ActivationEncoding
from quantlab.export.ort_host import onnxruntime_saturates_u8s8


def require_modelled(encoding: ActivationEncoding | None) -> None:
    """Skip the calling test where this machine's onnxruntime computes ``encoding``'s exports
    as no profile does (the module docstring)."""
    if encoding is ActivationEncoding.SIGNED and onnxruntime_saturates_u8s8():
        pytest.skip(
            "onnxruntime on this CPU (uint8 x int8 products saturate in pairs) computes a SIGNED "
            "export as no profile does (tests/ort_encodings.py); UNSIGNED_OFFSET is tested"
        )
