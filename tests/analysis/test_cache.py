"""Result cache keyed by a hash of model, inputs and config (quantlab.analysis.cache)."""

import math
import pickle

import pandas as pd
import pytest
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
    (tmp_path / "ns" / "k.json").write_bytes(b"broken")
    assert cache.get("k") is None
    off = ResultCache(None, "ns")
    off.put("k", df)
    assert off.get("k") is None


def test_result_cache_keeps_values_and_dtypes_exactly(tmp_path):
    cache = ResultCache(tmp_path, "ns")
    df = pd.DataFrame(
        {
            "op": ["a", "b", "c"],
            "value": [0.1 + 0.2, -math.inf, math.nan],
            "tiny": [5e-324, -0.0, 1.7976931348623157e308],
            "rank": [1, 2, 3],
            "supported": [True, False, True],
        }
    )
    df.attrs["studied"] = {"fixed": ["a", "b"]}
    cache.put("k", df)
    back = cache.get("k")
    assert back.equals(df) and list(back.dtypes) == list(df.dtypes)
    assert back.attrs == {"studied": {"fixed": ["a", "b"]}}
    assert math.copysign(1.0, back["tiny"][1]) == -1.0  # -0.0 stays -0.0
    with pytest.raises(ValueError, match="RangeIndex"):
        cache.put("k2", df.set_index("op"))


class _Planted:
    """A pickle that would run code when loaded: it writes a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_planted_pickle_in_the_cache_folder_is_never_loaded(tmp_path, monkeypatch):
    """A pickle planted where a cache entry lives (under the old and the current file name) is
    a miss; unpickling it would create the marker file."""
    marker = tmp_path / "ran"
    evil = pickle.dumps(_Planted(marker))
    pickle.loads(evil).close()  # the planted payload really runs when unpickled
    assert marker.exists()
    marker.unlink()
    folder = tmp_path / "cache" / "sensitivity"
    folder.mkdir(parents=True)
    for name in ("planted.pkl", "planted.json", "planted"):
        (folder / name).write_bytes(evil)
    cache = ResultCache(tmp_path / "cache", "sensitivity")
    assert cache.get("planted") is None and not marker.exists()

    from quantlab.analysis import cache as cache_module
    from quantlab.analysis.sensitivity import analyze

    monkeypatch.setattr(cache_module, "fingerprint", lambda *objs: "planted")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Sigmoid()).eval()
    batches = [(torch.randn(2, 4),)]
    run = analyze(model, "j6m", batches, batches, cache_dir=str(tmp_path / "cache"))
    assert not run.cached and not marker.exists()
    again = analyze(model, "j6m", batches, batches, cache_dir=str(tmp_path / "cache"))
    assert again.cached and again.table.equals(run.table) and not marker.exists()
