"""Table look-up by integer code, ``table[code mod 2**bits]``, on two kernels with one contract.

Contract: ``table`` holds 2**bits entries (any dtype) indexed by the code read as unsigned;
``codes`` are int8 (bits 8) or int16 (bits 16) codes of any shape; the result has the codes'
shape and the table's dtype. A gather copies entries, so both kernels give identical bits:

- ``gather_serial``: one ``torch.index_select`` (any device). On CPU it runs on the calling
  thread only: torch's index_select of a 1-D table has no parallel loop.
- ``gather_compiled``: the C loop ``out[i] = table[(unsigned) codes[i]]``
  (``quantlab.numerics.native``: built once by the system C compiler, kept in the user's cache
  folder, OpenMP on torch's intra-op thread count), for entries of 1, 2, 4 and 8 bytes. It is
  about 4x faster than the serial kernel on 2 cores at 2**22 codes, and faster than
  ``torch.sigmoid`` on as many float32 values (``reports/benchmarks/lut.md``); a build takes a
  fraction of a second.

``gather`` chooses between them. Calls of at least ``COMPILED_MIN_CODES`` CPU codes go serial
until the process has gathered ``COMPILE_AFTER`` codes that way, about as long as a build
takes, and compiled after that: the ski-rental rule, which keeps the total within about twice
that of the better choice made in hindsight. So short runs never pay a build and loops
(sensitivity, sweeps) run at the compiled speed. Where nothing needs building (the library is
loaded, or an earlier process left it in the cache folder: ``native.built``) there is nothing
to rent against, and the first such call takes the compiled kernel. The compiled kernels are
``KERNELS`` (a ``native.Kernels``, as every C kernel's): a build or compiled call that fails is
reported once as a warning, and the serial kernel serves the rest of the process.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from enum import IntEnum

import torch
from torch import Tensor

from quantlab.numerics import native

COMPILED_MIN_CODES = 1 << 16  # below this a compiled call's overhead is a large part of it
COMPILE_AFTER = 1 << 28  # serial codes (~1 ns each on one core) worth one build (~0.3 s)
ELEMENT_SIZES = (1, 2, 4, 8)  # table entry sizes the compiled kernel copies

_UNSIGNED = {torch.int8: torch.uint8, torch.int16: torch.uint16}


class Prefetch(IntEnum):
    """How the compiled gather prefetches codes and output in calls of at least 1 MiB of them:
    not at all, into every cache level (``gather``'s choice), or with the non-temporal hint,
    which made it 1.6 to 2.0 times slower on an Intel Xeon (``reports/benchmarks/lut.md``)."""

    NONE = 0
    ALL_LEVELS = 1
    NON_TEMPORAL = 2


_SOURCE = r"""
#include <stdint.h>
/* Blocks of 32: the 32 table reads are issued before the 32 writes, then the tail. With
   `prefetch` ALL_LEVELS (1) or NON_TEMPORAL (2), a call of at least PREFETCH_MIN_BYTES of
   codes and output (more than a core's L2 cache holds, so they are likely not all cached)
   first asks, in each block, for the codes and the output PREFETCH entries ahead (a prefetch
   never faults, so asking past the end is harmless; the address is formed as an integer),
   with locality 3 (every cache level) or 0 (the non-temporal hint). `gather` takes
   ALL_LEVELS; benchmarks/bench_lut.py times all three. */
#define BLOCK 32
#define PREFETCH 1024
#define PREFETCH_MIN_BYTES (1 << 20)
#define AHEAD(P, K) ((const void *)((uintptr_t)(P) + (uintptr_t)(K)))
#if defined(__GNUC__)
#define PREFETCH_AT(P, WRITE, LOCALITY) __builtin_prefetch(P, WRITE, LOCALITY)
#else
#define PREFETCH_AT(P, WRITE, LOCALITY) ((void)0)
#endif
/* LOCALITY 3, 0, or -1 for no prefetching (the builtin's locality must be a constant in 0..3,
   even in the branch -1 leaves dead: hence the conditional) */
#define GATHER_BLOCKS(CT, TT, LOCALITY)                                               \
  _Pragma("omp parallel for num_threads(threads) schedule(static)")                   \
  for (int64_t b = 0; b < blocks; ++b) {                                              \
    const CT *c = codes + BLOCK * b;                                                  \
    TT *o = out + BLOCK * b;                                                          \
    if (LOCALITY >= 0) {                                                              \
      PREFETCH_AT(AHEAD(c, PREFETCH * sizeof(CT)), 0, (LOCALITY > 0 ? 3 : 0));        \
      for (int line = 0; line < BLOCK * (int)sizeof(TT); line += 64)                  \
        PREFETCH_AT(AHEAD(o, PREFETCH * sizeof(TT) + line), 1, (LOCALITY > 0 ? 3 : 0)); \
    }                                                                                 \
    TT v[BLOCK];                                                                      \
    for (int k = 0; k < BLOCK; ++k) v[k] = table[c[k]];                               \
    for (int k = 0; k < BLOCK; ++k) o[k] = v[k];                                      \
  }
#define GATHER(C, T, CT, TT)                                                          \
  void gather_c##C##_t##T(const CT *restrict codes, const TT *restrict table,         \
                          TT *restrict out, int64_t n, int threads, int prefetch) {   \
    int64_t blocks = n / BLOCK;                                                       \
    if (n * (int64_t)(sizeof(CT) + sizeof(TT)) < PREFETCH_MIN_BYTES) prefetch = 0;    \
    if (prefetch == 1) {                                                              \
      GATHER_BLOCKS(CT, TT, 3)                                                        \
    } else if (prefetch == 2) {                                                       \
      GATHER_BLOCKS(CT, TT, 0)                                                        \
    } else {                                                                          \
      GATHER_BLOCKS(CT, TT, -1)                                                       \
    }                                                                                 \
    for (int64_t i = BLOCK * blocks; i < n; ++i) out[i] = table[codes[i]];           \
  }
GATHER(1, 1, uint8_t, uint8_t)
GATHER(1, 2, uint8_t, uint16_t)
GATHER(1, 4, uint8_t, uint32_t)
GATHER(1, 8, uint8_t, uint64_t)
GATHER(2, 1, uint16_t, uint8_t)
GATHER(2, 2, uint16_t, uint16_t)
GATHER(2, 4, uint16_t, uint32_t)
GATHER(2, 8, uint16_t, uint64_t)
"""


def _check(table: Tensor, codes: Tensor) -> torch.dtype:
    unsigned = _UNSIGNED.get(codes.dtype)
    if unsigned is None:
        raise ValueError(f"codes must be torch.int8 or torch.int16, got {codes.dtype}")
    if table.dim() != 1 or table.numel() != 1 << (8 * codes.element_size()):
        raise ValueError(
            f"a table for {codes.dtype} codes must be 1-D with {1 << (8 * codes.element_size())} "
            f"entries, got shape {tuple(table.shape)}"
        )
    return unsigned


def gather_serial(table: Tensor, codes: Tensor) -> Tensor:
    """``table[codes mod 2**bits]`` by one torch.index_select with an int32 index."""
    index = codes.reshape(-1).view(_check(table, codes)).to(torch.int32)
    return table.to(codes.device).index_select(0, index).reshape(codes.shape)


def _configure(lib: ctypes.CDLL) -> None:
    for c in (1, 2):
        for t in ELEMENT_SIZES:
            fn = getattr(lib, f"gather_c{c}_t{t}")
            fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_int, ctypes.c_int]
            fn.restype = None


KERNELS = native.Kernels("lut_gather", _SOURCE, _configure, "LUT gather")


@dataclass
class _Tiers:
    """Process-wide state of ``gather``'s choice (see the module docstring) besides the
    compiled kernels (``KERNELS``)."""

    serial_codes: int = 0  # codes gathered serially by calls the compiled kernel would take
    cached: bool | None = None  # whether the library needed no build when first asked


TIERS = _Tiers()


def gather_compiled(
    table: Tensor, codes: Tensor, prefetch: Prefetch = Prefetch.ALL_LEVELS
) -> Tensor:
    """``table[codes mod 2**bits]`` by the compiled kernel (CPU tensors, table entries of 1, 2,
    4 or 8 bytes); raises RuntimeError if it cannot be built. Same bits as ``gather_serial``.
    ``prefetch``: how large calls prefetch (``Prefetch``; the bits do not depend on it)."""
    _check(table, codes)
    if table.element_size() not in ELEMENT_SIZES:
        raise ValueError(f"the compiled gather copies 1, 2, 4 or 8-byte entries, not {table.dtype}")
    lib = KERNELS.lib()
    if lib is None:
        raise RuntimeError(f"the compiled LUT gather is unavailable: {KERNELS.failed}")
    return _run_compiled(lib, table, codes, prefetch)


def _run_compiled(
    lib: ctypes.CDLL, table: Tensor, codes: Tensor, prefetch: Prefetch = Prefetch.ALL_LEVELS
) -> Tensor:
    # torch-function modes (the simulator's capture) off: these are not the model's ops
    with torch._C.DisableTorchFunction():
        fn = getattr(lib, f"gather_c{codes.element_size()}_t{table.element_size()}")
        flat = codes.detach().reshape(-1).contiguous()
        tab = table.detach().to("cpu").contiguous()
        out = torch.empty(flat.shape, dtype=table.dtype)
        n = flat.numel()
        threads = max(1, min(torch.get_num_threads(), n >> 15))  # >= 32K codes per thread
        fn(flat.data_ptr(), tab.data_ptr(), out.data_ptr(), n, threads, int(Prefetch(prefetch)))
        return out.reshape(codes.shape)


def gather(table: Tensor, codes: Tensor) -> Tensor:
    """``table[codes mod 2**bits]``: serial, or compiled once the process has gathered enough
    (module docstring). Same bits either way."""
    if (
        codes.device.type != "cpu"
        or codes.numel() < COMPILED_MIN_CODES
        or KERNELS.failed
        or table.element_size() not in ELEMENT_SIZES
    ):
        return gather_serial(table, codes)
    if KERNELS.loaded is None and TIERS.serial_codes < COMPILE_AFTER:
        if TIERS.cached is None:  # looked up once per process
            TIERS.cached = KERNELS.built()
        if not TIERS.cached:
            TIERS.serial_codes += codes.numel()
            return gather_serial(table, codes)
    _check(table, codes)
    lib = KERNELS.lib()
    if lib is not None:
        try:
            return _run_compiled(lib, table, codes)
        except Exception as err:  # the serial kernel still holds
            KERNELS.give_up(err)
    return gather_serial(table, codes)
