"""The LUT gather's two kernels give identical bits, and ``gather`` switches between them as
its docstring says (serial first, compiled after COMPILE_AFTER codes, serial for good if the
compile fails)."""

from __future__ import annotations

import warnings

import pytest
import torch
from bits import assert_bits_equal
from toolchain import CC
from torch.overrides import TorchFunctionMode

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import build_lut
from quantlab.numerics.lut import gather as G
from quantlab.numerics.lut.segment import all_codes

needs_cc = pytest.mark.skipif(CC is None, reason="the compiled kernel needs a C compiler")


@pytest.fixture
def tiers():
    """The process-wide tier state (the serial count and the compiled kernels), restored after
    the test. Tests without this fixture leave their builds in place, so later tests in the
    process gather with the compiled kernel where a call is large enough: the same bits, which
    their own references check."""
    saved = (G.TIERS.serial_codes, G.TIERS.cached, G.KERNELS.loaded, G.KERNELS.failed)
    yield G.TIERS
    G.TIERS.serial_codes, G.TIERS.cached, G.KERNELS.loaded, G.KERNELS.failed = saved


def _fresh(tiers) -> None:
    """Nothing gathered serially yet, no compiled kernel loaded or failed, and none built on
    disk (a first process on the machine: the ski-rental rule applies)."""
    tiers.serial_codes, tiers.cached, G.KERNELS.loaded, G.KERNELS.failed = 0, False, None, None


def _table(dtype: torch.dtype, bits: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:  # NaN, infinities and -0 among the entries: copied as bits
        t = torch.randn(1 << bits, generator=g, dtype=torch.float64).to(dtype) * 1e3
        t[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0], dtype=dtype)
        return t
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (1 << bits,), generator=g, dtype=torch.int64).to(dtype)


CASES = [
    (torch.int16, torch.int16),
    (torch.int16, torch.int8),
    (torch.int8, torch.int16),
    (torch.int8, torch.int8),
]
# every table entry size the compiled kernel copies (1, 2, 4, 8 bytes), floats included
WIDE = [(torch.int16, torch.int32), (torch.int16, torch.float64), (torch.int8, torch.float32)]


@needs_cc
@pytest.mark.parametrize("code_dtype,table_dtype", CASES + WIDE)
def test_compiled_equals_serial_on_every_code_and_random_shapes(code_dtype, table_dtype):
    bits = 8 * torch.tensor([], dtype=code_dtype).element_size()
    table = _table(table_dtype, bits, seed=bits)
    every = all_codes(DType.INT8 if bits == 8 else DType.INT16).to(code_dtype)
    g = torch.Generator().manual_seed(5)
    info = torch.iinfo(code_dtype)
    rand = torch.randint(info.min, info.max + 1, (3, 70, 333), generator=g, dtype=torch.int32)
    edges = torch.tensor([info.min, info.min + 1, -1, 0, 1, info.max - 1, info.max])
    for codes in (
        every,
        every.flip(0).reshape(-1, 4),
        rand.to(code_dtype),
        rand.to(code_dtype).transpose(0, 2),  # non-contiguous
        edges.repeat(4096).to(code_dtype),
        torch.empty(0, dtype=code_dtype),
        *(every.flip(0)[:n] for n in (1, 7, 31, 32, 33, 65)),  # the kernel's blocks of 32, tail
        *(every[k : k + 4099] for k in (1, 3, 5)),  # codes not on an 8-byte boundary
        every.repeat((1 << 20) // every.numel() + 1)[: (1 << 20) + 37],  # prefetching blocks
    ):
        got = G.gather_compiled(table, codes)
        assert got.shape == codes.shape and got.dtype == table_dtype
        assert_bits_equal(got, G.gather_serial(table, codes))
        index = codes.reshape(-1).to(torch.int64) % (1 << bits)  # the contract, spelled out
        assert_bits_equal(got.reshape(-1), table[index])
        for prefetch in G.Prefetch:
            assert_bits_equal(G.gather_compiled(table, codes, prefetch), got)


@needs_cc
def test_segment_lut_evaluate_is_exact_on_both_tiers(tiers, monkeypatch):
    lut = build_lut("sigmoid", DType.INT16, 8 / 32767.5, DType.INT16, 1 / 32767.5)
    codes = all_codes(DType.INT16).to(torch.int16).repeat(2)  # 2**17 codes: a compiled-size call
    want = lut.evaluate_reference(codes)
    monkeypatch.setattr(G, "COMPILE_AFTER", 3 * codes.numel())
    _fresh(tiers)
    for call in range(5):
        assert_bits_equal(lut.evaluate(codes), want)
        assert (G.KERNELS.loaded is None) == (call < 3), call  # serial for 3 calls, then compiled
    assert tiers.serial_codes == 3 * codes.numel()


def test_small_and_non_cpu_calls_stay_serial_and_are_not_counted(tiers, monkeypatch):
    monkeypatch.setattr(G, "COMPILE_AFTER", 0)
    _fresh(tiers)
    table = _table(torch.int16, 16, seed=1)
    small = torch.arange(-100, 100, dtype=torch.int16)
    assert_bits_equal(G.gather(table, small), G.gather_serial(table, small))
    assert G.KERNELS.loaded is None and tiers.serial_codes == 0


def test_a_failed_build_warns_once_and_stays_serial(tiers, monkeypatch):
    monkeypatch.setattr(G.native, "compiler", lambda: None)
    monkeypatch.setattr(G.native, "_LOADED", {})
    monkeypatch.setattr(G, "COMPILE_AFTER", 0)
    _fresh(tiers)
    table = _table(torch.int16, 16, seed=2)
    codes = all_codes(DType.INT16).to(torch.int16)
    with pytest.warns(RuntimeWarning, match="no C compiler found"):
        assert_bits_equal(G.gather(table, codes), G.gather_serial(table, codes))
    assert "no C compiler found" in G.KERNELS.failed
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert_bits_equal(G.gather(table, codes), G.gather_serial(table, codes))
    with pytest.raises(RuntimeError, match="unavailable"):
        G.gather_compiled(table, codes)


@needs_cc
def test_a_compiler_that_fails_is_reported(tiers, monkeypatch, tmp_path):
    """A compiler that cannot build the source: the error names it, and the gather stays serial."""
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\necho 'fake-cc: cannot compile' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(G.native, "_LOADED", {})
    _fresh(tiers)
    with pytest.warns(RuntimeWarning, match="fake-cc: cannot compile"):
        assert G.KERNELS.lib() is None


@needs_cc
def test_the_build_is_kept_and_loaded_by_the_next_process(tiers, monkeypatch, tmp_path):
    """Built into the cache folder once (atomically, nothing else left there); a later build
    loads that file without compiling; an unwritable cache folder falls back to a temporary
    one."""
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(G.native, "_LOADED", {})
    _fresh(tiers)
    assert G.KERNELS.lib() is not None
    assert [p.suffix for p in (tmp_path / "cache").iterdir()] == [".so"]
    table = _table(torch.int16, 16, seed=8)
    codes = all_codes(DType.INT16).to(torch.int16)
    want = G.gather_serial(table, codes)
    assert_bits_equal(G.gather_compiled(table, codes), want)

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(G.native.subprocess, "run", no_compiler)
    G.native.forget()
    _fresh(tiers)
    assert G.KERNELS.lib() is not None  # loaded, not compiled
    assert_bits_equal(G.gather_compiled(table, codes), want)
    monkeypatch.undo()
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the folder should be: not writable as a folder
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(blocked / "cache"))
    monkeypatch.setattr(G.native, "_LOADED", {})
    _fresh(tiers)
    assert G.KERNELS.lib() is not None and G.KERNELS.failed is None
    assert_bits_equal(G.gather_compiled(table, codes), want)


@needs_cc
def test_compiled_gather_under_a_torch_function_mode():
    """The simulator's capture is a torch-function mode; the compiled call must neither trace it
    nor be seen by it."""
    seen = []

    class Record(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    table = _table(torch.int16, 16, seed=3)
    codes = all_codes(DType.INT16).to(torch.int16)
    with Record():
        got = G.gather_compiled(table, codes)
    assert_bits_equal(got, G.gather_serial(table, codes))
    assert "__getitem__" not in seen and "index_select" not in seen, seen


@pytest.mark.parametrize(
    "table,codes,match",
    [
        (torch.zeros(256, dtype=torch.int16), torch.zeros(4, dtype=torch.int16), "65536 entries"),
        (torch.zeros(65536, dtype=torch.int16), torch.zeros(4, dtype=torch.int8), "256 entries"),
        (torch.zeros(256, dtype=torch.int16), torch.zeros(4, dtype=torch.int32), "int8 or"),
        (torch.zeros(16, 16, dtype=torch.int16), torch.zeros(4, dtype=torch.int8), "1-D"),
    ],
)
def test_bad_tables_and_codes_are_refused(table, codes, match):
    """Checked before either kernel runs: the compiled kernel aborts the process on an index out
    of range rather than raising."""
    for kernel in (G.gather_serial, G.gather_compiled, G.gather):
        with pytest.raises(ValueError, match=match):
            kernel(table, codes)


@needs_cc
def test_a_compiled_call_that_fails_falls_back_for_good(tiers, monkeypatch):
    def broken(*args):
        raise RuntimeError("kernel exploded")

    class Broken:  # the built library with its int16-code, 1-byte-entry gather broken
        def __init__(self, lib):
            self.lib = lib

        def __getattr__(self, name):
            return broken if name == "gather_c2_t1" else getattr(self.lib, name)

    monkeypatch.setattr(G, "COMPILE_AFTER", 0)
    G.KERNELS.loaded = Broken(G.KERNELS.lib())
    table = _table(torch.int8, 16, seed=4)
    codes = all_codes(DType.INT16).to(torch.int16)
    with pytest.warns(RuntimeWarning, match="kernel exploded"):
        assert_bits_equal(G.gather(table, codes), G.gather_serial(table, codes))
    assert G.KERNELS.loaded is None and "kernel exploded" in G.KERNELS.failed
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # serial for good, no second warning
        assert_bits_equal(G.gather(table, codes), G.gather_serial(table, codes))


def test_tables_of_other_entry_sizes_stay_serial(tiers, monkeypatch):
    """A 16-byte entry (complex128) has no compiled copy: ``gather`` takes the serial kernel
    without building, ``gather_compiled`` refuses it."""
    monkeypatch.setattr(G, "COMPILE_AFTER", 0)
    _fresh(tiers)
    table = torch.randn(256, dtype=torch.complex128)
    codes = torch.arange(-128, 128, dtype=torch.int8).repeat(1024)
    assert_bits_equal(G.gather(table, codes).real, table[codes.to(torch.int64) % 256].real)
    assert G.KERNELS.loaded is None and tiers.serial_codes == 0
    with pytest.raises(ValueError, match="8-byte entries"):
        G.gather_compiled(table, codes)


@needs_cc
def test_the_compiled_call_runs_on_torchs_thread_count(tiers):
    """One build serves every thread count (read per call); the same bits on each."""
    table = _table(torch.int16, 16, seed=6)
    codes = all_codes(DType.INT16).to(torch.int16).repeat(3)
    before = torch.get_num_threads()
    try:
        got, builds = {}, set()
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            got[threads] = G.gather_compiled(table, codes)
            builds.add(id(G.KERNELS.loaded))
    finally:
        torch.set_num_threads(before)
    assert len(builds) == 1
    for out in got.values():
        assert_bits_equal(out, G.gather_serial(table, codes))


@needs_cc
def test_compiled_gather_under_inference_mode_and_no_grad(tiers):
    table = _table(torch.int16, 16, seed=7)
    codes = all_codes(DType.INT16).to(torch.int16).repeat(2)
    want = G.gather_serial(table, codes)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with torch.inference_mode():
            assert_bits_equal(G.gather_compiled(table.clone(), codes.clone()), want)
        with torch.no_grad():
            assert_bits_equal(G.gather_compiled(table, codes), want)
    assert G.KERNELS.failed is None


@needs_cc
def test_every_dtype_pair_grad_mode_and_thread_count_in_one_process(tiers, monkeypatch):
    """What a long process meets, through ``gather`` after the switch: every dtype pair and
    entry size, three grad modes, two thread counts, non-contiguous codes; no fallback."""
    monkeypatch.setattr(G, "COMPILE_AFTER", 0)
    before = torch.get_num_threads()
    modes = (torch.enable_grad, torch.no_grad, torch.inference_mode)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            for threads in (2, 1):
                torch.set_num_threads(threads)
                for code_dtype, table_dtype in CASES + WIDE:
                    bits = 8 * torch.tensor([], dtype=code_dtype).element_size()
                    table = _table(table_dtype, bits, seed=bits)
                    every = all_codes(DType.INT8 if bits == 8 else DType.INT16).to(code_dtype)
                    codes = every.repeat((1 << 17) // every.numel()).reshape(-1, 64)
                    for mode in modes:
                        with mode():
                            got = G.gather(table.clone(), codes.t())
                        assert_bits_equal(got, G.gather_serial(table, codes.t()))
    finally:
        torch.set_num_threads(before)
    assert G.KERNELS.failed is None and G.KERNELS.loaded is not None


@needs_cc
def test_a_library_an_earlier_process_built_is_used_at_once(tiers, monkeypatch, tmp_path):
    """With the library already in the cache folder, loading it costs no build, so the first
    call large enough for the compiled kernel takes it (nothing gathered serially first);
    without it, the ski-rental rule holds."""
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(G.native.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    monkeypatch.setattr(G.native, "_LOADED", {})
    monkeypatch.setattr(G, "COMPILE_AFTER", 1 << 40)
    table = _table(torch.int16, 16, seed=9)
    codes = all_codes(DType.INT16).to(torch.int16).repeat(2)
    want = G.gather_serial(table, codes)
    tiers.serial_codes, tiers.cached, G.KERNELS.loaded, G.KERNELS.failed = 0, None, None, None
    assert not G.KERNELS.built()
    assert_bits_equal(G.gather(table, codes), want)
    assert G.KERNELS.loaded is None and tiers.serial_codes == codes.numel()  # no build yet
    assert G.KERNELS.lib() is not None  # an earlier process's build, kept in the cache folder
    G.native.forget()
    tiers.serial_codes, tiers.cached, G.KERNELS.loaded, G.KERNELS.failed = 0, None, None, None
    assert G.KERNELS.built() and G.native.built("lut_gather", G.KERNELS.source)
    assert_bits_equal(G.gather(table, codes), want)
    assert G.KERNELS.loaded is not None and tiers.serial_codes == 0
