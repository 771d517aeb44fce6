"""What the benchmarks record about where they ran: the machine, and paths as the repository
shows them."""

from __future__ import annotations

import platform as host
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def cpu_description() -> str:
    """The CPU's name, torch's kernel level and whether the int8 matrix product pays here (the
    exact GEMM takes it only then: ``gemm.int8_speed``)."""
    from quantlab.numerics.gemm.int8_speed import int8_product_ratio

    name = host.processor() or host.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    vnni = torch.cpu._is_vnni_supported() if hasattr(torch.cpu, "_is_vnni_supported") else None
    ratio = int8_product_ratio()
    return (
        f"{name}, torch CPU capability {torch.backends.cpu.get_cpu_capability()}, VNNI {vnni}; "
        f"torch's int8 matrix product takes {ratio:.2f}x the float32 product's time here, so the "
        f"exact GEMM {'uses' if ratio < 1 else 'does not use'} it"
    )


def shown_path(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
