"""Pinned digests per kind of CPU.

A float run (calibration, fake mode) gives other last bits on another kind of CPU: torch's float
kernels take other code paths by instruction set (AVX2 or AVX-512, with or without VNNI), so
the scales and every value after them move. A pinned file ``<stem>.json`` holds the digests of
the CPU they were first written on; ``<stem>.<kind>.json`` holds the same run's digests on a CPU
of another kind, written by code that still gave the first file's digests on the first CPU. A
test reads its CPU kind's file where one exists, else the first one.
"""

from __future__ import annotations

from pathlib import Path

import torch


def cpu_kind() -> str:
    """torch's CPU capability and whether the CPU has VNNI, e.g. ``avx2-novnni``."""
    vnni = getattr(torch.cpu, "_is_vnni_supported", lambda: False)()
    return f"{torch.backends.cpu.get_cpu_capability().lower()}-{'vnni' if vnni else 'novnni'}"


def kind_path(first: Path) -> Path:
    """``first``'s twin for this CPU's kind (``<stem>.<kind>.json``)."""
    return first.with_name(f"{first.stem}.{cpu_kind()}{first.suffix}")


def pinned_path(first: Path) -> Path:
    """The pinned file to compare with on this CPU: its kind's twin if written, else ``first``."""
    twin = kind_path(first)
    return twin if twin.exists() else first
