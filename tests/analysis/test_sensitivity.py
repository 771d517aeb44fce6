"""Per-op sensitivity: the fragile op ranks first, replay equals the naive method, bad input."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from recipe_toy import FragileSin  # fc2 feeds sin near 200 rad: int8 steps there wreck it
from torch import nn

from quantlab.analysis.sensitivity import (
    COLUMNS,
    FrozenIndices,
    Metric,
    SensitiveType,
    lower_is_worse,
    merge_batches,
    output_metrics,
    rank_table,
    sensitivity,
    top_ops,
)
from quantlab.simulate import Simulator


class TopkHead(nn.Module):
    """Scores pick the top 3 rows of the features (a discontinuous selection); the add after
    the gather keeps the features' linear layer off the model output (a GEMM that feeds it
    through selecting ops alone keeps a high-precision output, which its activation pass
    would not quantize)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.score, self.feat = nn.Linear(4, 1), nn.Linear(4, 4)
        with torch.no_grad():
            for m in (self.score, self.feat):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g))
                m.bias.zero_()

    def forward(self, x):
        s = self.score(x).squeeze(-1)
        idx = s.topk(3, dim=-1).indices
        return torch.gather(self.feat(x), 1, idx.unsqueeze(-1).expand(-1, -1, 4)) + 0.5


def _inputs(shape, seed=1):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)),)


@pytest.fixture(scope="module")
def fragile_sim():
    x = _inputs((16, 8))
    sim = Simulator(FragileSin(), "j6m")
    sim.calibrate([x])
    return sim, x


def test_fragile_op_ranks_first(fragile_sim):
    sim, x = fragile_sim
    metrics = ["L1", "cosine", "MSE", "kl", "sqnr", "max_abs"]
    run = sensitivity(sim, [x], kinds=["activation", "weight"], metrics=metrics)
    t = run.table
    assert list(t.columns) == COLUMNS
    act = t[t.sensitive_type == "activation"]
    for m in metrics:
        first = act[(act.metric == Metric.parse(m).name) & (act["rank"] == 1)]
        assert first.op_name.tolist() == ["fc2:linear#0"], (m, act[act.metric == m.upper()])
    # the weight pass studies only ops with a weight; pass-through relu is never studied
    assert set(t[t.sensitive_type == "weight"].op_name) == {f"fc{i}:linear#0" for i in (1, 2, 3)}
    assert ":relu#0" not in set(t.op_name)
    assert run.studied["activation"] == ["fc1:linear#0", "fc2:linear#0", ":sin#0", "fc3:linear#0"]
    assert math.isclose(t.drop_duplicates("op_name").flops_share.sum(), 1 - 256 / 14848)
    assert set(t.quant_dtype) <= {"INT8", "INT32"}
    assert top_ops(t, "l1", 1).op_name.tolist() == ["fc2:linear#0", "fc3:linear#0"]


def test_replay_gives_the_naive_numbers(fragile_sim):
    sim, x = fragile_sim
    fast = sensitivity(sim, [x, x], metrics=["l1", "mse"], replay=True).table
    naive = sensitivity(sim, [x, x], metrics=["l1", "mse"], replay=False).table
    pd.testing.assert_frame_equal(fast, naive, check_exact=True)


def test_fixed_pass_runs_one_op_fixed(fragile_sim):
    sim, x = fragile_sim
    t = sensitivity(sim, [x], kinds=["fixed"], metrics=["sqnr"]).table
    assert set(t.sensitive_type) == {"fixed"}
    assert t.op_name.tolist()[0] in {"fc1:linear#0", "fc2:linear#0", ":sin#0", "fc3:linear#0"}
    assert t["rank"].tolist() == list(range(1, len(t) + 1))


def test_frozen_indices_keep_the_baseline_selection():
    model = TopkHead()
    x = _inputs((2, 10, 4), seed=3)
    freeze = FrozenIndices()
    with freeze.record():
        ref = model(*x)
    noisy = (x[0] + 0.05 * torch.randn(x[0].shape, generator=torch.Generator().manual_seed(0)),)
    free_idx = model.score(noisy[0]).squeeze(-1).topk(3, dim=-1).indices
    ref_idx = model.score(x[0]).squeeze(-1).topk(3, dim=-1).indices
    assert not torch.equal(free_idx, ref_idx), "the noise should flip a selection"
    with freeze.replay():
        out = model(*noisy)
    expect = torch.gather(model.feat(noisy[0]), 1, ref_idx.unsqueeze(-1).expand(-1, -1, 4))
    assert torch.equal(out, expect + 0.5) and ref.shape == out.shape
    # an unrelated tensor of the same shape is not matched
    with freeze.replay():
        far = (torch.arange(20.0).reshape(2, 10) * 1e3).topk(3, dim=-1).indices
    assert torch.equal(far, torch.tensor([[9, 8, 7], [9, 8, 7]]))


def test_output_metrics_and_sort_order():
    x = [torch.tensor([[1.0, 2.0, 3.0]])]
    same = output_metrics(x, [x[0].clone()], list(Metric)[:-1])
    assert same[Metric.L1] == 0 and same[Metric.SQNR] == math.inf and same[Metric.KL] == 0
    flipped = output_metrics(x, [-x[0]], [Metric.COSINE, Metric.MAX_ABS, Metric.MSE])
    assert flipped[Metric.COSINE] == pytest.approx(-1.0)  # signed, not abs
    assert flipped[Metric.MAX_ABS] == 6.0 and flipped[Metric.MSE] == pytest.approx(56 / 3)
    assert [m for m in Metric if m is not Metric.TASK and lower_is_worse(m)] == [
        Metric.COSINE,
        Metric.SQNR,
    ]

    class Higher:
        higher_is_better = True

    assert lower_is_worse(Metric.TASK, Higher())


def test_bad_input_fails_clearly(fragile_sim):
    sim, x = fragile_sim
    with pytest.raises(ValueError, match="unknown metric 'psnr'; allowed: L1, COSINE"):
        sensitivity(sim, [x], metrics=["psnr"])
    with pytest.raises(ValueError, match="unknown sensitive_type"):
        sensitivity(sim, [x], kinds=["bias"])
    with pytest.raises(ValueError, match="at least one input batch"):
        sensitivity(sim, [], metrics=["l1"])
    with pytest.raises(ValueError, match="empty tensor"):
        sensitivity(sim, [(torch.zeros(0, 8),)], metrics=["l1"])
    with pytest.raises(ValueError, match="task metric"):
        sensitivity(sim, [x], metrics=["task"])

    class NoOps(nn.Module):
        def forward(self, x):
            return x.flatten(1).argmax(-1).to(torch.float32)

    bare = Simulator(NoOps(), "j6m")
    bare.calibrate([x])
    with pytest.raises(ValueError, match="no quantizable op"):
        sensitivity(bare, [x], metrics=["l1"])


def test_kinds_parse():
    assert SensitiveType.parse("WEIGHT") is SensitiveType.WEIGHT
    assert Metric.parse("max_abs") is Metric.MAX_ABS


def test_sensitivity_experiment_tiny_and_cached(tmp_path):
    from experiments.sensitivity import sensitivity_exp
    from quantlab.config import compose
    from quantlab.experiment import RunContext

    cfg = compose(
        ["+exp=sensitivity", "model=small_cnn", "data=synthetic"]
        + ["data.num_eval=2", "data.num_calib=1", f"exp.cache_dir={tmp_path}", "exp.top_k=2"]
        + ["exp.kinds=[ACTIVATION,FIXED]"]
    )
    ctx = RunContext(cfg.platform, cfg.model, cfg.data, 0, tmp_path)
    first = sensitivity_exp(cfg.exp, ctx)
    assert list(first.table.columns) == COLUMNS
    assert set(first.table.metric) == {
        "L1",
        "COSINE",
        "MSE",
        "KL",
        "SQNR",
        "MAX_ABS",
        "TASK",
    }
    assert set(first.tables) == {"top_ops", "sensitivity"}
    assert first.tables["top_ops"].groupby("sensitive_type").size().to_dict() == {
        "activation": 2,
        "fixed": 2,
    }
    # ranked by an output metric, which has no interval: the top table leaves those columns
    assert not {"ci_low", "ci_high"} & set(first.tables["top_ops"].columns)
    assert "median over the" in first.findings[0]
    assert "model runs" in first.findings[-1]
    again = sensitivity_exp(cfg.exp, ctx)
    assert "read from the cache" in again.findings[-1]
    pd.testing.assert_frame_equal(first.table, again.table)


def test_sensitivity_reuses_float_indices_downstream_of_the_studied_op():
    x = _inputs((4, 10, 4), seed=5)  # int8 scores flip one selection of these inputs
    sim = Simulator(TopkHead(), "j6m")
    sim.calibrate([x])
    frozen = sensitivity(sim, [x], kinds=["activation"], metrics=["l1"]).table
    frozen = frozen.set_index("op_name")["value"]
    # the scores only select rows: with the float indices reused, quantizing them changes nothing
    assert frozen["score:linear#0"] == 0.0
    assert frozen["feat:linear#0"] > 0.0
    free = sensitivity(sim, [x], kinds=["activation"], metrics=["l1"], freeze_indices=False)
    free = free.table.set_index("op_name")["value"]
    assert free["score:linear#0"] > 3 * free["feat:linear#0"]  # a flipped index dominates


def test_output_metrics_of_a_zero_baseline():
    """A zero baseline output has no signal: SQNR -inf when the run is not zero (the tensor
    metric's rule), +inf when it is; such an op ranks as the most sensitive."""
    zero, some = [torch.zeros(2, 3)], [torch.full((2, 3), 0.5)]
    got = output_metrics(zero, some, [Metric.SQNR, Metric.COSINE, Metric.L1])
    assert got[Metric.SQNR] == -math.inf
    assert got[Metric.COSINE] == 0.0 and got[Metric.L1] == 0.5
    same = output_metrics(zero, [torch.zeros(2, 3)], [Metric.SQNR, Metric.COSINE])
    assert same[Metric.SQNR] == math.inf and same[Metric.COSINE] == 1.0
    table = pd.DataFrame(
        {
            "op_name": ["a", "b"],
            "sensitive_type": "fixed",
            "op_type": "conv2d",
            "metric": "SQNR",
            "value": [12.0, got[Metric.SQNR]],
            "quant_dtype": "INT8",
            "flops_share": 0.5,
            "items": 2,
            "ci_low": math.nan,
            "ci_high": math.nan,
        }
    )
    assert rank_table(table)["op_name"].tolist() == ["b", "a"]


class ConvHead(nn.Module):
    """conv -> relu -> conv -> mean -> linear: GEMMs whose inputs are int8 on J6H/P."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.c2(torch.relu(self.c1(x))).mean((2, 3)))


def test_input_pass_sees_the_int8_gemm_inputs_of_a_float16_platform():
    from quantlab.numerics.dtypes import DType
    from quantlab.simulate import Mode
    from quantlab.simulate.qat import qat_fake_quant

    x = _inputs((4, 3, 8, 8))
    sim = Simulator(ConvHead(), "j6p")
    sim.calibrate([x])
    kinds = ["activation", "input"]
    t = sensitivity(sim, [x], kinds=kinds, metrics=["sqnr"], progress=False).table
    inp = t[t.sensitive_type == "input"].set_index("op_name")
    assert sorted(inp.index) == ["c1:conv2d#0", "c2:conv2d#0", "fc:linear#0"]
    assert set(inp.quant_dtype) == {"INT8"}
    assert "INT8" not in set(t[t.sensitive_type == "activation"].quant_dtype)  # float16, fp32 out
    # the first conv's row: the float model with only that conv's input fake-quantized to int8
    m = sim.model
    rq = sim.qconfig_of("c1:conv2d#0")
    s = sim.act_scale("c1:conv2d#0", "in0", DType.INT8, rq)
    with torch.no_grad():
        ref = m(*x)
        xq = qat_fake_quant(x[0], s, DType.INT8, sim.platform.fake_round)
        alone = m.fc(m.c2(torch.relu(m.c1(xq))).mean((2, 3)))
    expected = output_metrics([ref], [alone], [Metric.SQNR])[Metric.SQNR]
    assert inp.at["c1:conv2d#0", "value"] == pytest.approx(expected, rel=1e-6)
    assert math.isfinite(expected)
    # an int8 platform quantizes GEMM inputs at their producers: no input rows
    j6m = Simulator(ConvHead(), "j6m")
    j6m.calibrate([x])
    t = sensitivity(j6m, [x], kinds=kinds, metrics=["sqnr"], progress=False).table
    assert (t.sensitive_type == "input").sum() == 0
    assert sim.run(*x, mode=Mode.FLOAT).shape == (4, 4)


class _CastBetween(nn.Module):
    """Two linear layers with a cast to the tensor's own dtype between them (Hugging Face's
    GPT-2, Llama and T5 cast hidden states so)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        return self.b(self.a(x).to(torch.float32).float())


@pytest.mark.parametrize("platform", ["j6m", "j6p"])
def test_a_model_with_casts_is_ranked(platform):
    """A cast is an op type a qconfig may name (the input pass names every op type by type)."""
    torch.manual_seed(0)
    xs = [(torch.randn(1, 8, 16),) for _ in range(3)]
    sim = Simulator(_CastBetween().eval(), platform)
    sim.calibrate(xs, progress=False)
    assert {"to", "float"} <= set(sim.ops["op_type"])
    run = sensitivity(sim, xs, progress=False)
    assert set(run.table["op_name"]) >= {"a:linear#0", "b:linear#0"}


def test_merge_batches_into_runs_of_a_fixed_size():
    """None: one run of every batch; per_run: whole runs of that many batches (a graph that
    fixes its batch takes no other size), a remainder left out; 1, or batches that cannot be
    concatenated: as they are."""
    batches = [(torch.full((1, 2), float(i)),) for i in range(5)]
    firsts = lambda runs: [r[0][:, 0].tolist() for r in runs]  # noqa: E731
    assert firsts(merge_batches(batches)) == [[0, 1, 2, 3, 4]]
    assert firsts(merge_batches(batches, 2)) == [[0, 1], [2, 3]]
    assert firsts(merge_batches(batches, 8)) == [[0, 1, 2, 3, 4]]
    assert all(a[0] is b[0] for a, b in zip(merge_batches(batches, 1), batches, strict=True))
    ragged = [*batches[:2], (torch.zeros(1, 3),)]
    assert all(a[0] is b[0] for a, b in zip(merge_batches(ragged, 2), ragged, strict=True))
