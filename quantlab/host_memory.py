"""Keep freed memory inside the process, so that large tensors do not page-fault anew.

glibc's malloc serves a block above its mmap threshold (at most 32 MiB) with a fresh mapping and
unmaps it on free; below that, it trims the heap's free top back to the kernel. Either way the
next tensor of that size touches new pages: one page fault and one zero fill per 4 KiB. A batch
of 24 photos through MobileNetV2 makes activations of up to 110 MiB, so every op pays this
again; measured here, a sensitivity ranking spent more time in the kernel than in torch
(``benchmarks/bench_sensitivity.py``). ``keep_freed_memory`` turns both off for the rest of the
process (``mallopt``: no mmap for large blocks, no trimming), so freed blocks are reused.

The cost: the process keeps its peak heap until it exits (the resident size does not fall after
a large step), and large blocks now share the heap with small ones, so a program that keeps
small tensors alive between large ones can fragment it and grow it, as glibc's default already
allows for blocks under 32 MiB. Measured on the sensitivity benchmark (MobileNetV2, 24 photos;
reports/benchmarks/sensitivity.md and system_malloc/): peak resident size 2352 MiB against
2105 MiB, system CPU time 2.3 s against 87.5 s. The command-line entry point applies it unless
``keep_freed_memory=false``; a library user calls it, or not, in their own process. Only glibc
has these switches.
"""

from __future__ import annotations

import ctypes
import sys

# glibc <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4

_applied = False


def _libc():
    """The process's glibc, or None (another C library, or not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols, its C library's among them
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse in this process: no mmap for large
    blocks (``M_MMAP_MAX`` = 0), no trimming of the heap (``M_TRIM_THRESHOLD`` = -1).

    Returns True once applied (repeated calls do nothing more), False where the C library is
    not glibc (nothing changed)."""
    global _applied
    if _applied:
        return True
    libc = _libc()
    if libc is None:
        return False
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, -1)):
        raise RuntimeError("glibc mallopt refused M_MMAP_MAX=0 or M_TRIM_THRESHOLD=-1")
    _applied = True
    return True


def kept() -> bool:
    """Whether ``keep_freed_memory`` has been applied in this process."""
    return _applied
