"""Tables of every pair of 8-bit codes: layout, lookup with broadcasting, the bounded cache."""

from __future__ import annotations

import torch
from bits import assert_bits_equal

from quantlab.numerics import pair_table
from quantlab.numerics.pair_table import PairTables, every_pair, lookup


def _f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x.to(torch.int32) * 1000 + y.to(torch.int32)  # tells every pair apart


def test_lookup_reads_each_pairs_entry_for_every_dtype_pair():
    g = torch.Generator().manual_seed(3)
    for xd in (torch.int8, torch.uint8):
        for yd in (torch.int8, torch.uint8):
            x, y = every_pair(xd, yd)
            assert x.dtype == xd and y.dtype == yd and x.numel() == y.numel() == 65536
            assert len(set(zip(x.tolist(), y.tolist()))) == 65536
            table = _f(x, y)
            a = torch.randint(0, 256, (3, 1, 40), generator=g, dtype=torch.int32).to(torch.uint8)
            b = torch.randint(0, 256, (5, 40), generator=g, dtype=torch.int32).to(torch.uint8)
            a, b = a.view(xd), b.view(yd)
            assert_bits_equal(lookup(table, a, b), _f(a, b))
            assert_bits_equal(lookup(table, b.view(xd), a.view(yd)), _f(b.view(xd), a.view(yd)))


def test_tables_are_built_once_per_key_and_bounded(monkeypatch):
    tables, built = PairTables(), []

    def build(x, y):
        built.append(1)
        return _f(x, y)

    t1 = tables.get(("k",), torch.int8, torch.int8, build)
    assert tables.get(("k",), torch.int8, torch.int8, build) is t1 and len(built) == 1
    tables.get(("k",), torch.uint8, torch.int8, build)  # the dtypes are part of the key
    assert len(built) == 2 and len(tables) == 2
    monkeypatch.setattr(pair_table, "TABLE_LIMIT", 3)
    for i in range(5):
        tables.get((i,), torch.int8, torch.int8, build)
    assert len(tables) <= 3
