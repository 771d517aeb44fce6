"""Embedding as a fixed-point gather: identical bits to the reference, the index path's
behaviour at the fixed scale 1 and at calibrated scales, and clear errors."""

import pytest
import torch

from quantlab.numerics import reference
from quantlab.numerics.dtypes import DType
from quantlab.numerics.embedding import (
    EmbeddingContract,
    _scaled_rows,
    embedding_fixed,
    gather_rows,
    index_rows,
)
from quantlab.numerics.rounding import Round
from tests.bits import assert_bits_equal

INDEX_CONTRACTS = [
    EmbeddingContract(),
    EmbeddingContract(index_dtype=DType.INT8),
    EmbeddingContract(index_round=Round.HALF_UP),
]


@pytest.mark.parametrize("contract", INDEX_CONTRACTS, ids=["int16", "int8", "half_up"])
@pytest.mark.parametrize("scale", [1.0, 0.5, 0.93148, 1.5, 2.0, 239.4])
def test_gather_matches_reference(contract, scale):
    g = torch.Generator().manual_seed(0)
    rows = 3000
    table = torch.randint(-32768, 32768, (rows, 6), generator=g).to(torch.int16)
    ids = torch.cat([torch.randint(0, rows, (40,), generator=g), torch.arange(0, 300)])
    ids = torch.cat([ids, torch.tensor([rows - 1, rows - 2, 127, 128, 129])]).reshape(5, -1)
    got = embedding_fixed(ids, table, scale, contract)
    want = reference.embedding_fixed(ids, table, scale, contract)
    assert got.dtype == torch.int16 and got.shape == (5, ids.shape[1], 6)
    assert_bits_equal(got.to(torch.int64), torch.from_numpy(want))


def test_index_path_keeps_ids_at_fixed_scale_one_and_finer_scales():
    ids = torch.arange(0, 30522)
    assert torch.equal(index_rows(ids, 30522), ids)  # int16 codes at scale 1: the ids
    # a calibrated int16 scale amax/32767.5 < 1 quantizes finer than one id: still exact
    assert torch.equal(index_rows(ids, 30522, 30521 / 32767.5), ids)
    # int8 at scale 1 saturates every id above 127; a coarse scale merges neighbouring ids
    rows8 = index_rows(ids[:1000], 1000, 1.0, EmbeddingContract(index_dtype=DType.INT8))
    assert torch.equal(rows8, ids[:1000].clamp_max(127))
    coarse = index_rows(ids[:1000], 1000, 2.0)
    assert torch.equal(coarse[::2], ids[:1000:2]) and not torch.equal(coarse, ids[:1000])


@pytest.mark.parametrize("index_dtype", [DType.INT8, DType.INT16])
@pytest.mark.parametrize("rounding", list(Round))
def test_unit_scale_rows_are_the_float_passes_for_every_id(index_dtype, rounding):
    """At index scale 1 index_rows skips its float passes; every id a table of the most rows
    the gather takes can hold gives the rows those passes give, under every rounding."""
    c = EmbeddingContract(index_dtype=index_dtype, index_round=rounding)
    ids = torch.arange(0, c.max_rows)
    got = index_rows(ids, c.max_rows, 1.0, c)
    assert_bits_equal(got, _scaled_rows(ids, c.max_rows, 1.0, c))
    assert got.dtype == torch.int64
    small = torch.tensor([[0, 1], [5, 6]])  # a small table: the last row is 6
    assert_bits_equal(index_rows(small, 7, 1.0, c), _scaled_rows(small, 7, 1.0, c))


def test_gather_rows_is_indexing():
    g = torch.Generator().manual_seed(1)
    table = torch.randn(50, 7, generator=g)
    strided = torch.randn(7, 50, generator=g).t()  # not contiguous
    for t in (table, strided, table.to(torch.int16)):
        for rows in (torch.tensor(3), torch.randint(0, 50, (9,), generator=g),
                     torch.randint(0, 50, (2, 3, 4), generator=g)):  # fmt: skip
            got = gather_rows(t, rows)
            assert got.shape == t[rows].shape and got.is_contiguous()
            assert_bits_equal(got, t[rows])


def test_int8_table_and_every_int8_code():
    table = (torch.arange(-128, 128).reshape(256, 1) * torch.ones(1, 3, dtype=torch.int64)).to(
        torch.int8
    )
    ids = torch.arange(256).flip(0)
    got = embedding_fixed(ids, table)
    assert_bits_equal(got, table[ids])


def test_bad_arguments_fail_clearly():
    table = torch.zeros(10, 4, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"ids must be in \[0, 10\)"):
        embedding_fixed(torch.tensor([10]), table)
    with pytest.raises(TypeError, match="integer tensor"):
        embedding_fixed(torch.tensor([1.0]), table)
    with pytest.raises(ValueError, match="max_rows"):
        embedding_fixed(torch.tensor([1]), torch.zeros(40000, 2, dtype=torch.int16))
    with pytest.raises(TypeError, match="int8 or int16 codes"):
        embedding_fixed(torch.tensor([1]), table.float())
    with pytest.raises(ValueError, match="index_scale must be finite"):
        embedding_fixed(torch.tensor([1]), table, 0.0)
    with pytest.raises(ValueError, match="index_dtype must be INT8 or INT16"):
        EmbeddingContract(index_dtype=DType.INT32)
