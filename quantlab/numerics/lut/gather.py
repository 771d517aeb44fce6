"""Table look-up by integer code, ``table[code mod 2**bits]``, on two kernels with one contract.

Contract: ``table`` holds 2**bits entries (any dtype) indexed by the code read as unsigned;
``codes`` are int8 (bits 8) or int16 (bits 16) codes of any shape; the result has the codes'
shape and the table's dtype. A gather copies entries, so both kernels give identical bits:

- ``gather_serial``: one ``torch.index_select`` (any device). On CPU it runs on the calling
  thread only: torch's index_select of a 1-D table has no parallel loop.
- ``gather_compiled``: the same gather compiled by ``torch.compile`` (inductor's C++ backend,
  on torch's own OpenMP threads), once per thread count and dtype pair: about 2.5x faster than
  the serial kernel on 2 cores at 2**22 codes (``reports/benchmarks/lut.md``). It needs a C++
  compiler and costs seconds to build (about 4 s with inductor's disk cache warm, 20 s cold, on
  2 cores).

``gather`` chooses between them. Calls of at least ``COMPILED_MIN_CODES`` CPU codes go serial
until the process has gathered ``COMPILE_AFTER`` codes that way, about as long as a warm-cache
build takes, and compiled after that: the ski-rental rule, which keeps the total within about
twice that of the better choice made in hindsight. So short runs never pay a build and long
loops (sensitivity, sweeps) run at the compiled speed. A build or compiled call that fails is
reported once as a warning, and the serial kernel serves the rest of the process.
"""

from __future__ import annotations

import types
import warnings

import torch
from torch import Tensor

COMPILED_MIN_CODES = 1 << 16  # below this a compiled call's overhead (~40 us) exceeds its gain
COMPILE_AFTER = 1 << 32  # serial codes (~1 ns each on one core) worth one compile (~4 s)

_UNSIGNED = {torch.int8: torch.uint8, torch.int16: torch.uint16}


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


def _gather_flat(table: Tensor, codes: Tensor) -> Tensor:
    # codes is 1-D; its dtype is fixed per build, so the unsigned view is static.
    unsigned = torch.uint8 if codes.dtype == torch.int8 else torch.uint16
    return table[codes.view(unsigned).to(torch.int32)]


def _own_copy(fn, name: str):
    """``fn`` with a code object of its own: dynamo keeps compiled graphs, and counts them
    against its recompile limit, per code object, so each build gets its own count."""
    return types.FunctionType(fn.__code__.replace(co_name=name), fn.__globals__, name)


class _Tiers:
    """Process-wide state of ``gather``'s choice (see the module docstring)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.serial_codes = 0  # codes gathered serially by calls the compiled kernel would take
        # (torch's intra-op thread count, code dtype, table dtype) -> the compiled function
        self.compiled: dict = {}
        self.failed: str | None = None  # why compiling failed, once it has

    def compiled_fn(self, table: Tensor, codes: Tensor):
        """The compiled gather for these operands' dtypes at torch's current thread count,
        built on first use; None if building failed (warned once).

        One build per key: the thread count is fixed in each build (inductor's on-disk cache
        does not key on the runtime count, and would otherwise hand a one-thread kernel to a
        two-thread process), and each build has its own code object, so that the few graphs it
        holds (dynamic sizes; grad mode is fixed by the caller) never reach dynamo's limit."""
        key = (torch.get_num_threads(), codes.dtype, table.dtype)
        if key not in self.compiled and self.failed is None:
            try:
                name = "_gather_{}_{}_{}".format(*(str(k).replace("torch.", "") for k in key))
                # no per-code bounds check: _check has proven every index < table.numel()
                options = {"cpp.threads": key[0], "assert_indirect_indexing": False}
                fn = torch.compile(
                    _own_copy(_gather_flat, name), dynamic=True, fullgraph=True, options=options
                )
                # build now, not inside a caller's result; a probe longer than the table, since
                # equal sizes would be guarded as equal (dynamo's duck sizing) and recompile
                probe = torch.zeros(1 << 17, dtype=codes.dtype)
                _run_compiled(fn, torch.zeros_like(table, device="cpu"), probe)
                self.compiled[key] = fn
            except Exception as err:  # no C++ compiler, unsupported platform, ...
                self.fail(err)
        return self.compiled.get(key)

    def fail(self, err: Exception) -> None:
        """Give the compiled kernel up for this process, with one warning."""
        self.compiled, self.failed = {}, f"{type(err).__name__}: {err}".splitlines()[0]
        warnings.warn(
            f"quantlab: the compiled LUT gather failed ({self.failed}); LUT look-ups stay on "
            "torch.index_select (same bits, one thread)",
            RuntimeWarning,
            stacklevel=4,
        )


TIERS = _Tiers()


def gather_compiled(table: Tensor, codes: Tensor) -> Tensor:
    """``table[codes mod 2**bits]`` by the compiled kernel (CPU tensors); raises RuntimeError
    if it cannot be built. Same bits as ``gather_serial``."""
    _check(table, codes)
    fn = TIERS.compiled_fn(table, codes)
    if fn is None:
        raise RuntimeError(f"the compiled LUT gather is unavailable: {TIERS.failed}")
    return _run_compiled(fn, table, codes)


def _run_compiled(fn, table: Tensor, codes: Tensor) -> Tensor:
    # Flat, detached operands (no view base for dynamo to guard on), so that shapes, strides
    # and views do not recompile; grad mode off (a gather of codes has no gradient), so that
    # it does not either; torch-function modes (the simulator's capture) off, so that dynamo
    # does not trace them.
    if codes.numel() == 0:
        return gather_serial(table, codes)
    with torch._C.DisableTorchFunction(), torch.no_grad():
        flat = fn(table.detach(), codes.reshape(-1).detach())
        return flat.reshape(codes.shape)


def gather(table: Tensor, codes: Tensor) -> Tensor:
    """``table[codes mod 2**bits]``: serial, or compiled once the process has gathered enough
    (module docstring). Same bits either way."""
    if codes.device.type != "cpu" or codes.numel() < COMPILED_MIN_CODES or TIERS.failed:
        return gather_serial(table, codes)
    if not TIERS.compiled and TIERS.serial_codes < COMPILE_AFTER:
        TIERS.serial_codes += codes.numel()
        return gather_serial(table, codes)
    _check(table, codes)
    fn = TIERS.compiled_fn(table, codes)
    if fn is not None:
        try:
            return _run_compiled(fn, table.to(codes.device), codes)
        except Exception as err:  # e.g. dynamo's recompile limit: the serial kernel still holds
            TIERS.fail(err)
    return gather_serial(table, codes)
