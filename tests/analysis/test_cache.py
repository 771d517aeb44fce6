"""Result cache keyed by a hash of model, inputs and config (quantlab.analysis.cache)."""

import pandas as pd
import torch
from torch import nn

from quantlab.analysis.cache import ResultCache, code_fingerprint, fingerprint
from quantlab.numerics.dtypes import DType


def test_fingerprint_sees_weights_inputs_and_config():
    torch.manual_seed(0)
    m = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    base = fingerprint(m, (x,), {"metric": DType.INT8, "k": [1, 2]})
    assert base == fingerprint(m, (x.clone(),), {"k": [1, 2], "metric": DType.INT8})
    with torch.no_grad():
        m.weight[0, 0] += 1e-6
    assert fingerprint(m, (x,), {"metric": DType.INT8, "k": [1, 2]}) != base
    assert fingerprint(torch.tensor(1.0)) != fingerprint(torch.tensor([1.0]))
    assert fingerprint(torch.zeros(2, dtype=torch.int8)) != fingerprint(torch.zeros(2))
    assert fingerprint([1]) != fingerprint((1,)) and fingerprint("1") != fingerprint(1)
    assert len(code_fingerprint()) == 64


def test_result_cache_roundtrip(tmp_path):
    cache = ResultCache(tmp_path, "ns")
    assert cache.get("k") is None
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    cache.put("k", df)
    assert cache.get("k").equals(df) and (cache.hits, cache.misses) == (1, 1)
    (tmp_path / "ns" / "k.pkl").write_bytes(b"broken")
    assert cache.get("k") is None
    off = ResultCache(None, "ns")
    off.put("k", df)
    assert off.get("k") is None
