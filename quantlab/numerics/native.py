"""Small C kernels built at run time by the system C compiler and called through ctypes.

``load(name, source)`` compiles ``source`` (C99) with ``-O3 -ffp-contract=off`` and OpenMP when
the compiler takes ``-fopenmp`` (else without), loads the shared library and keeps it for the
process. Float arithmetic is IEEE single precision as written (no fast-math, no contraction of
a product and a sum into one rounding). OpenMP's runtime is the one torch has loaded
(libgomp.so.1 is found loaded by name). The library file is kept in the user's cache folder
(``QUANTLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/quantlab`` or ``~/.cache/quantlab``; a temporary
folder when that cannot be written), keyed by source, compiler, flags and platform and written
atomically, so later processes only load it. Raises RuntimeError when nothing can be built.
``Kernels`` holds one such library for its callers: loaded on first use, or None after a failed
build, reported once as a warning (the callers then compute by torch ops, with the same bits).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

FLAGS = (
    "-O3",
    "-std=c99",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fPIC",
    "-shared",
)

_LOADED: dict[str, ctypes.CDLL] = {}

# C shared by the float kernels: their rounding of a code and their per-CPU loops
PRELUDE = r"""
#include <stdint.h>
#include <math.h>

/* round half to even of q clamped to the integer bounds [lo, hi], |lo|, |hi| <= 2**22: the
   clamp commutes with the monotone rounding and passes NaN; (q + 1.5 * 2**23) lies where
   floats are the integers, so the sum rounds q to the nearest integer, ties to the even one,
   and the subtraction is exact. Branch-free, so that loops vectorize. */
static inline float round_clamped(float q, float lo, float hi) {
  q = q < lo ? lo : q;
  q = q > hi ? hi : q;
  return (q + 12582912.0f) - 12582912.0f;
}

/* a row's loops are compiled for AVX-512, for AVX2 and for the baseline, chosen when loaded
   (QL_ONLY_AVX2: the AVX2 code alone, QL_NO_CLONES: the baseline alone; for tests) */
#if defined(__x86_64__) && defined(__GNUC__) && defined(QL_ONLY_AVX2)
#define CLONES __attribute__((target("avx2")))
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(QL_NO_CLONES)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif
"""


def compiler() -> str | None:
    """The C compiler: ``CC``, else cc, gcc or clang on PATH; None if there is none."""
    cc = os.environ.get("CC")
    return cc or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def cache_dir() -> Path:
    base = os.environ.get("QUANTLAB_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "quantlab"


def load(name: str, source: str) -> ctypes.CDLL:
    """The shared library of ``source`` (see the module docstring), once per process."""
    lib = _LOADED.get(name)
    if lib is None:
        lib = _LOADED[name] = _build(name, source)
    return lib


def built(name: str, source: str) -> bool:
    """Whether ``load(name, source)`` would only load, not compile: the library is loaded in
    this process or its file is in a cache folder (for the compiler found now)."""
    if name in _LOADED:
        return True
    cc = compiler()
    return cc is not None and any(
        (folder / file).exists() for file in _files(name, source, cc) for folder in _folders()
    )


def forget() -> None:
    """Drop the libraries loaded so far (the next ``load`` finds or builds them again)."""
    _LOADED.clear()


class Kernels:
    """The library of ``source`` loaded on first use: ``lib()`` gives it with its argument
    types set by ``configure``, or None once building it failed (warned once; the caller's
    torch ops serve instead, with the same bits)."""

    def __init__(
        self, name: str, source: str, configure: Callable[[ctypes.CDLL], None], what: str
    ) -> None:
        self.name, self.source, self.configure, self.what = name, source, configure, what
        self.loaded: ctypes.CDLL | None = None
        self.failed: str | None = None

    def lib(self) -> ctypes.CDLL | None:
        if self.loaded is None and self.failed is None:
            try:
                lib = load(self.name, self.source)
                self.configure(lib)
                self.loaded = lib
            except Exception as err:  # no C compiler, unsupported platform, ...
                self.give_up(err, stacklevel=4)
        return self.loaded

    def built(self) -> bool:
        """Whether ``lib()`` would cost no compile: loaded, or its file in a cache folder
        (``native.built``); False once building failed."""
        return self.loaded is not None or (self.failed is None and built(self.name, self.source))

    def give_up(self, err: Exception, stacklevel: int = 3) -> None:
        """Use the library no more in this process (its build, or a call of it, raised
        ``err``), with one warning; ``lib()`` gives None from now on."""
        self.loaded, self.failed = None, f"{type(err).__name__}: {err}".splitlines()[0]
        warnings.warn(
            f"quantlab: the native {self.what} failed ({self.failed}); it stays on torch ops "
            "(same bits)",
            RuntimeWarning,
            stacklevel=stacklevel,
        )


_FLAG_SETS = ((*FLAGS, "-fopenmp"), FLAGS)  # with OpenMP first, then without


def _files(name: str, source: str, cc: str) -> list[str]:
    """The library's file name for each flag set: keyed by source, compiler, flags, platform."""
    out = []
    for flags in _FLAG_SETS:
        key = "\0".join((source, cc, *flags, platform.machine(), platform.system()))
        out.append(f"{name}_{hashlib.sha256(key.encode()).hexdigest()[:16]}.so")
    return out


def _folders() -> tuple[Path, Path]:
    """Where libraries are kept: the cache folder, else a temporary one of this user's."""
    return cache_dir(), Path(tempfile.gettempdir()) / f"quantlab-{os.getuid()}"


def _build(name: str, source: str) -> ctypes.CDLL:
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set CC)")
    errors = []
    for flags, file in zip(_FLAG_SETS, _files(name, source, cc)):
        for folder in _folders():
            lib = folder / file
            if lib.exists():
                try:
                    return ctypes.CDLL(str(lib))
                except OSError:  # a broken file: build it again
                    pass
            try:
                folder.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
                os.close(fd)
                src = Path(tmp).with_suffix(".c")
                src.write_text(source)
                try:
                    run = subprocess.run(
                        [cc, *flags, str(src), "-o", tmp], capture_output=True, text=True
                    )
                finally:
                    src.unlink(missing_ok=True)
                if run.returncode != 0:
                    os.unlink(tmp)
                    errors.append(run.stderr.strip().splitlines()[-1:] or [f"{cc} failed"])
                    break  # these flags fail here; the next set, if any
                os.replace(tmp, lib)  # atomic: a concurrent process sees all of it or nothing
                return ctypes.CDLL(str(lib))
            except OSError as err:  # the folder is not writable: the next one
                errors.append([str(err)])
    raise RuntimeError(f"building {name} failed: " + "; ".join(e[0] for e in errors))
