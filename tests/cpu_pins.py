"""Pinned digests per kind of CPU.

A float run (calibration, fake mode) gives other last bits on another kind of CPU: torch's float
kernels take other code paths by instruction set (AVX2 or AVX-512, with or without VNNI), and
by vendor (the same AVX-512 VNNI instruction set gave other float32 matmul and linear bits on an
Intel Xeon than on the AMD EPYC the first files were written on), so the scales and every value
after them move. A pinned file ``<stem>.json`` holds the digests of the CPU they were first
written on; ``<stem>.<kind>.json`` holds the same run's digests on a CPU of another kind, written
by code that still gave the first file's digests on the first CPU. A kind is the instruction set
(``avx2-novnni``), optionally with the vendor (``avx512-vnni-genuineintel``). A test reads the
most specific twin that exists for its CPU, else the first file.
"""

from __future__ import annotations

from pathlib import Path

import torch


def cpu_kind() -> str:
    """torch's CPU capability and whether the CPU has VNNI, e.g. ``avx2-novnni``."""
    vnni = getattr(torch.cpu, "_is_vnni_supported", lambda: False)()
    return f"{torch.backends.cpu.get_cpu_capability().lower()}-{'vnni' if vnni else 'novnni'}"


def cpu_vendor() -> str:
    """The CPU vendor's name as /proc/cpuinfo gives it, lower case (``genuineintel``,
    ``authenticamd``); "" where it is not known."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip().lower()
    except OSError:
        pass
    return ""


def kind_paths(first: Path) -> list[Path]:
    """``first``'s twins for this CPU, most specific first: by instruction set and vendor, then
    by instruction set alone."""
    kinds = [f"{cpu_kind()}-{cpu_vendor()}"] if cpu_vendor() else []
    kinds.append(cpu_kind())
    return [first.with_name(f"{first.stem}.{k}{first.suffix}") for k in kinds]


def kind_path(first: Path) -> Path:
    """The twin to write for this CPU: its most specific kind (``kind_paths``)."""
    return kind_paths(first)[0]


def pinned_path(first: Path) -> Path:
    """The pinned file to compare with on this CPU: its most specific twin that exists, else
    ``first``."""
    return next((p for p in kind_paths(first) if p.exists()), first)
