import os
import sys
from pathlib import Path

# Under pytest-xdist (the README's ``-n auto``, one worker per core) each worker's OpenMP
# threads would spin while they wait and take another worker's core (one run on 2 cores took
# 18 min instead of under 7), so they sleep instead. This changes scheduling only (thread counts
# and results are the same); it must be set before torch loads its OpenMP runtime.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_configure(config):
    """Where a C compiler exists, a fallback of a native kernel (the LUT gather, the LayerNorm
    steps) fails the test that caused it (the tests of the fallback itself expect its warning
    with pytest.warns)."""
    from toolchain import CC

    if CC is not None:
        for message in (  # '.': the filter splits on ':'
            "quantlab. the compiled LUT gather failed",
            "quantlab. the native ",  # every native kernel: the LayerNorm steps, the fake quant
        ):
            config.addinivalue_line("filterwarnings", f"error:{message}:RuntimeWarning")


@pytest.fixture(autouse=True)
def _deterministic_torch():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _int8_product_counts_as_slow(monkeypatch):
    """AUTO's use of the int8 matrix product depends on a speed probe of the machine
    (``gemm.int8_speed``); tests pin it to "slow" so the paths they check are the same on every
    CPU (the bits are the same either way): AUTO then runs the float32 and C paths, fast on every
    CPU, where torch's int8 product is a scalar loop on CPUs without VNNI (about 24x the float32
    product). The tests of AUTO's int8 paths ask for ``int8_product_fast``; tests of the probe
    itself set it as they need."""
    from quantlab.numerics.gemm import int8_speed

    monkeypatch.setitem(int8_speed._STATE, "ratio", 40.0)
    yield


@pytest.fixture
def int8_product_fast(monkeypatch):
    """The speed probe's answer pinned to "fast": AUTO takes the int8 matrix product (INT32,
    INT32_SPLIT) wherever its plan allows."""
    from quantlab.numerics.gemm import int8_speed

    monkeypatch.setitem(int8_speed._STATE, "ratio", 0.25)
    yield


@pytest.fixture(autouse=True)
def _test_process_keeps_its_malloc(monkeypatch):
    """Tests that call the command line's ``run`` in this process leave the test process's
    C library malloc as it is (``python -m quantlab`` switches its own process to keep freed
    memory: ``quantlab.host_memory``; subprocess tests of the CLI do so, and
    tests/test_host_memory.py checks the switch)."""
    monkeypatch.setattr("quantlab.__main__.keep_freed_memory", lambda: False)
    yield
