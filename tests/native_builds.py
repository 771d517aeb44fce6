"""The builds of a native kernel module that tests check: the one the CPU loads, the baseline
(no per-CPU clones) and the AVX2 code alone (what a CPU with AVX2 and no AVX-512 runs)."""

from __future__ import annotations

import pytest
import torch

from quantlab.numerics import native

BUILDS = ("as loaded", "baseline", "avx2")
DEFINES = {"baseline": "#define QL_NO_CLONES\n", "avx2": "#define QL_ONLY_AVX2\n"}
HAS_AVX2 = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def variant_source(build: str, source: str) -> str | None:
    """``source`` as ``build`` compiles it (None: the build the CPU loads); skips the test for
    the AVX2 build on a CPU without AVX2."""
    if build == "avx2" and not HAS_AVX2:
        pytest.skip("this CPU has no AVX2 to run the AVX2 code on")
    return DEFINES[build] + source if build in DEFINES else None


def use_build(build: str, kernels: native.Kernels, monkeypatch) -> None:
    """For the rest of the test, ``kernels`` hands out its library as ``build`` compiles it
    (unchanged for the build the CPU loads)."""
    source = variant_source(build, kernels.source)
    if source is not None:
        lib = native.load(f"{kernels.name}_{build}", source)
        kernels.configure(lib)
        monkeypatch.setattr(kernels, "loaded", lib)


def without_compiler(module, monkeypatch) -> None:
    """For the rest of the test, no C compiler is found and ``module.KERNELS`` is a fresh
    ``native.Kernels`` of the same source, so its first use tries to build and warns."""
    k = module.KERNELS
    monkeypatch.setattr(native, "compiler", lambda: None)
    monkeypatch.setattr(native, "_LOADED", {})
    monkeypatch.setattr(module, "KERNELS", native.Kernels(k.name, k.source, k.configure, k.what))
