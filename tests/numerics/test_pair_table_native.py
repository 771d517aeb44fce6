"""The pair-table look-up in C (quantlab.numerics.pair_table_native): the entries of torch's
int32 index pass and gather for every 8-bit dtype pair and entry size, on same-shape operands
and on operands that repeat along the output's leading dims (on either side, with extra
leading 1s), at sizes around the thread split; and torch's passes wherever it declines,
including when no kernel can be built."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from native_builds import without_compiler

from quantlab.numerics import pair_table, pair_table_native
from quantlab.numerics.pair_table_native import lookup_native
from tests.bits import assert_bits_equal

needs_cc = pytest.mark.skipif(
    pair_table_native.KERNELS.lib() is None, reason="no C compiler to build the kernels"
)

ENTRY_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64]
CODE_DTYPES = [torch.int8, torch.uint8]


def _torch_lookup(table, x, y):
    """pair_table.lookup's torch passes, written out."""
    index = x.view(torch.uint8).to(torch.int32).mul_(256) + y.view(torch.uint8)
    return table.index_select(0, index.reshape(-1)).reshape(index.shape)


def _codes(g, shape, dtype):
    lo, hi = (-128, 128) if dtype == torch.int8 else (0, 256)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def _table(g, dtype):
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (1 << 16,), generator=g, dtype=torch.int64).to(dtype)


SHAPES = [
    ((1, 128, 384), (1, 128, 384)),  # a residual add
    ((1, 12, 128, 128), (1, 1, 1, 128)),  # a mask over every head's scores
    ((1, 1, 1, 128), (1, 12, 128, 128)),  # the same, the other way round
    ((128, 384), (1, 1, 128, 384)),  # extra leading 1s on one side
    ((4, 33, 77), (77,)),  # odd sizes: the thread shares do not fall on a row
    ((5000,), (1,)),  # one code repeated
    ((4096,), (4096,)),
    ((1,), (1,)),  # one value
    ((3, 17), (17,)),  # a few values, repeated
    ((3, 100003), (100003,)),  # many values per thread
]


@needs_cc
@pytest.mark.parametrize("entry", ENTRY_DTYPES, ids=str)
@pytest.mark.parametrize(("xd", "yd"), list(itertools.product(CODE_DTYPES, CODE_DTYPES)))
def test_the_c_pass_gives_the_tables_entries(entry, xd, yd):
    g = torch.Generator().manual_seed(ENTRY_DTYPES.index(entry))
    table = _table(g, entry)
    for xs, ys in SHAPES:
        x, y = _codes(g, xs, xd), _codes(g, ys, yd)
        got = lookup_native(table, x, y)
        assert got is not None, (xs, ys)
        want = _torch_lookup(table, x, y)
        assert got.shape == want.shape and got.dtype == entry
        assert_bits_equal(got, want)
        assert_bits_equal(pair_table.lookup(table, x, y), want)


@needs_cc
def test_every_pair_of_codes_reads_its_own_entry():
    """A table whose entry is its own index: each of the 65,536 pairs, in both operand
    orders, reads the entry at 256 * (x mod 256) + (y mod 256)."""
    table = torch.arange(1 << 16, dtype=torch.int32)
    for xd, yd in itertools.product(CODE_DTYPES, CODE_DTYPES):
        x, y = pair_table.every_pair(xd, yd)
        got = lookup_native(table, x, y)
        assert got is not None
        assert_bits_equal(got, table)
        flipped = lookup_native(table, y, x)
        assert_bits_equal(flipped, _torch_lookup(table, y, x))


def test_where_the_c_pass_declines_torch_gives_the_entries():
    """Strided codes, a broadcast that is not a repeat along leading dims, no values, a table
    of another size or shape: None, and lookup's torch passes."""
    g = torch.Generator().manual_seed(7)
    table = _table(g, torch.int16)
    x = _codes(g, (64, 130), torch.int8)
    cases = [
        (x[:, ::2], _codes(g, (64, 65), torch.int8)),  # strided
        (_codes(g, (4, 64, 32), torch.int8), _codes(g, (4, 1, 32), torch.int8)),  # a middle 1
        (_codes(g, (8, 500), torch.int8), _codes(g, (8, 1), torch.uint8)),  # a trailing 1
        (_codes(g, (0, 10), torch.int8), _codes(g, (0, 10), torch.int8)),  # no values
    ]
    for a, b in cases:
        assert lookup_native(table, a, b) is None
        assert_bits_equal(pair_table.lookup(table, a, b), _torch_lookup(table, a, b))
    y = _codes(g, (64, 130), torch.int8)
    assert lookup_native(table[:-1], x, y) is None
    assert lookup_native(table.reshape(256, 256), x, y) is None


def test_without_a_compiler_lookup_uses_torch_with_one_warning(monkeypatch):
    without_compiler(pair_table_native, monkeypatch)
    g = torch.Generator().manual_seed(8)
    table = _table(g, torch.int8)
    x, y = _codes(g, (64, 128), torch.int8), _codes(g, (128,), torch.int8)
    with pytest.warns(RuntimeWarning, match="no C compiler found"):
        assert_bits_equal(pair_table.lookup(table, x, y), _torch_lookup(table, x, y))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert_bits_equal(pair_table.lookup(table, y, x), _torch_lookup(table, y, x))
