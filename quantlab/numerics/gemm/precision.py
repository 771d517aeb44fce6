"""Torch's float kernel precision, pinned to IEEE for the exact float paths, then restored.

The exactness proof of the float paths (``plan``) assumes every float32 product and partial
sum is an IEEE float32 operation: no TF32 or bf16 internals (``torch.backends.*.fp32_precision``
and ``torch.set_float32_matmul_precision``, which sets the matmul ones), no transform-based
convolution (NNPACK). ``exact_float_kernels`` pins exactly these for the block it guards and
puts back what the caller had, so quantlab never changes a user's settings. float64 and int64
kernels have no reduced-precision modes; float16 emulation never runs float16 kernels.
"""

from __future__ import annotations

import torch

EXACT_PRECISIONS = ("none", "ieee")  # "none" defers to the parent setting
CPU_OPS = (("mkldnn", "matmul"), ("mkldnn", "conv"))
CUDA_OPS = (("cuda", "matmul"), ("cuda", "conv"))


def effective_fp32_precision(backend: str, op: str) -> str:
    """The fp32 precision an op of ``backend`` runs with: its own setting, else the backend's,
    else the generic one ("none" everywhere: IEEE)."""
    get = torch._C._get_fp32_precision_getter
    for b, o in ((backend, op), (backend, "all"), ("generic", "all")):
        value = get(b, o)
        if value != "none":
            return value
    return "none"


class exact_float_kernels:  # noqa: N801 - used as ``with exact_float_kernels():``
    """Inside the block float32 matmul / conv run in IEEE float32 and NNPACK is off; on exit
    (also on error) every setting changed here is put back. Only differing settings are written
    (a few flag reads otherwise); CUDA settings only for ``device_type`` "cuda". A plain
    context manager class (no generator): it guards every exact float GEMM call."""

    __slots__ = ("_device_type", "_restore")

    def __init__(self, device_type: str = "cpu") -> None:
        self._device_type = device_type
        self._restore: list = []

    def __enter__(self) -> None:
        get = torch._C._get_fp32_precision_getter
        set_ = torch._C._set_fp32_precision_setter
        restore = self._restore = []
        ops = CPU_OPS + (CUDA_OPS if self._device_type == "cuda" else ())
        try:
            for backend, op in ops:
                if effective_fp32_precision(backend, op) not in EXACT_PRECISIONS:
                    restore.append((set_, (backend, op, get(backend, op))))
                    set_(backend, op, "ieee")
            if torch._C._get_nnpack_enabled():
                restore.append((torch._C._set_nnpack_enabled, (True,)))
                torch._C._set_nnpack_enabled(False)
        except BaseException:
            self._put_back()
            raise

    def __exit__(self, *exc) -> bool:
        self._put_back()
        return False

    def _put_back(self) -> None:
        for fn, args in reversed(self._restore):
            fn(*args)
        self._restore = []
