"""Float32 inputs for the MLAS kernel tests: random values over and beyond each kernel's range,
small and subnormal values, and the float32 neighbours of each kernel's edges; and whether
onnxruntime's GELU on this CPU is the one ``mlas_gelu`` emulates: the AVX-512F kernel, and on
CPUs with AVX2 / FMA3 but no AVX-512F, erf's FMA3 kernel inside the generic GELU, which gives
the same bits (onnxruntime 1.32, measured on an AMD EPYC); other CPUs compute GELU another
way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from quantlab.numerics.eigen_float32 import eigen_cos, eigen_log, eigen_sin
from quantlab.numerics.mlas_float32 import mlas_erf, mlas_exp, mlas_gelu, mlas_logistic, mlas_tanh

F32 = np.float32


def _gelu_kernel_emulated() -> bool:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        flags = set(cpuinfo.read_text().split())
        return "avx512f" in flags or {"avx2", "fma"} <= flags
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


GELU_EMULATED = _gelu_kernel_emulated()


def _around(values, n: int = 3) -> list[float]:
    """Each value and its n float32 neighbours on both sides."""
    out = []
    for v in values:
        a = b = F32(v)
        out.append(a)
        for _ in range(n):
            a, b = np.nextafter(a, F32(np.inf)), np.nextafter(b, F32(-np.inf))
            out += [a, b]
    return out


def float32_inputs(lo: float, hi: float, edges, seed: int) -> np.ndarray:
    """600 uniform values in [lo, hi], 300 of magnitudes down to 1e-40, zeros and subnormals,
    and each edge with its three float32 neighbours either side (float32)."""
    rng = np.random.default_rng(seed)
    wide = rng.uniform(lo, hi, 600)
    small = rng.normal(0.0, 1.0, 300) * 10.0 ** rng.integers(-40, 1, 300)
    tiny = [0.0, -0.0, 1e-45, -1e-45, 1.2e-38, -1.2e-38, 1e-20]
    return np.array([*wide, *small, *tiny, *_around(edges)], dtype=np.float32)


# kernel, random-input range, edges (clamp bounds, saturation, the ends of exp's range)
CASES = {
    "tanh": (mlas_tanh, (-12.0, 12.0), (9.0, -9.0, 8.0, 0.5, 1.0, 4.0)),
    "logistic": (mlas_logistic, (-22.0, 22.0), (18.0, -18.0, 16.6, -16.6, 1.0, 9.0)),
    "exp": (mlas_exp, (-110.0, 92.0), (-103.97208, -87.34, 88.72284, 0.0, 1.0, -1.0, 0.6931472)),
    # erf's split and cap, large inputs
    "erf": (mlas_erf, (-6.0, 6.0), (0.921875, -0.921875, 3.925, -3.925, 0.0, 40.0)),
    # erf's split (0.921875 sqrt 2) and cap (3.925 sqrt 2); large inputs (exp floored)
    "gelu": (mlas_gelu, (-9.0, 9.0), (1.3037252, -1.3037252, 5.5507994, -5.5507994, 0.0, 40.0)),
    # Eigen's: the sqrt(1/2) split of the mantissa, powers of two, the smallest values
    "log": (eigen_log, (0.0, 30.0), (0.70710677, 1.0, 2.0, 0.5, 1.4142135, 1.2e-38, 1e-44, 3e38)),
    # multiples of pi / 4 and the thresholds of the integer (Payne-Hanek) reduction
    "sin": (eigen_sin, (-40000.0, 40000.0), (0.7853982, 1.5707964, 3.1415927, 25966.0, 1e6, 3e38)),
    "cos": (eigen_cos, (-40000.0, 40000.0), (0.7853982, 1.5707964, 3.1415927, 18838.0, 1e6, 3e38)),
}
