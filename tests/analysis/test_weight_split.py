"""Per-layer operand-format analysis, GEMM capture, box metrics and the seeded box task."""

import torch
from torch import nn

from quantlab.analysis.boxes import box_iou, box_l1
from quantlab.analysis.train import fit, synthetic_boxes
from quantlab.analysis.weight_split import (
    FormatChoice,
    GemmCall,
    OperandFormat,
    capture_gemm_calls,
    evaluate_formats,
    weight_sensitivity,
)
from quantlab.numerics.dtypes import DType
from quantlab.numerics.split import SplitCombine

FORMATS = [
    FormatChoice(OperandFormat.INT8),
    FormatChoice(OperandFormat.SPLIT, 7, SplitCombine.WIDE_ACCUMULATOR),
    FormatChoice(OperandFormat.SPLIT, 7, SplitCombine.SEPARATE_REQUANT),
    FormatChoice(OperandFormat.INT16),
]


def test_split_recovers_precision_per_layer():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, 10, 10, generator=g).relu()
    w = torch.randn(24, 16, 3, 3, generator=g) * 0.1
    rows = evaluate_formats(GemmCall("c", "conv2d", x, w, (1, 1, 1, 1)), FORMATS)
    sq = {r["format"]: r["sqnr_db"] for r in rows}
    assert sq["split_k7_wide"] > sq["int8"] + 20
    assert abs(sq["split_k7_wide"] - sq["int16"]) < 6
    lsb = {r["format"]: r["max_err_lsb"] for r in rows}
    assert lsb["split_k7_wide"] < 2 and lsb["int8"] > 10
    mm = evaluate_formats(
        GemmCall("m", "matmul", torch.randn(2, 8, 16), torch.randn(2, 16, 8)), FORMATS
    )
    assert {r["format"] for r in mm} == {"int8", "split16_wide", "split16_separate", "int16"}
    lin = evaluate_formats(GemmCall("l", "linear", torch.randn(3, 32), torch.randn(5, 32)), FORMATS)
    assert all(r["macs"] == 3 * 32 * 5 for r in lin)


def test_capture_names_follow_simulator_convention_and_sensitivity_ranks():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 5)
    )
    model.eval()
    x = torch.randn(2, 3, 6, 6)
    calls = capture_gemm_calls(model, (x,))
    assert [c.name for c in calls] == ["0:conv2d#0", "3:linear#0"]
    assert calls[0].conv_args == ((1, 1), (1, 1), (1, 1), 1)
    sens = weight_sensitivity(model, [(x,)])
    assert list(sens["rank"]) == [1, 2] and set(sens["module"]) == {"0", "3"}
    assert sens["sqnr_db"].is_monotonic_increasing


def test_box_metrics():
    a = torch.tensor([[0.5, 0.5, 0.2, 0.2], [0.2, 0.2, 0.1, 0.1]])
    b = torch.tensor([[0.5, 0.5, 0.2, 0.2], [0.8, 0.8, 0.1, 0.1]])
    assert box_iou(a, b).tolist() == [1.0, 0.0]
    half = torch.tensor([[0.55, 0.5, 0.2, 0.2]])
    assert abs(float(box_iou(half, a[:1])) - 0.6) < 1e-6  # float32 boxes: 0.03 / 0.05
    assert box_l1(a, a) == 0.0


def test_box_task_is_seeded_and_fit_lowers_the_loss():
    t1, t2 = synthetic_boxes(8, seed=3), synthetic_boxes(8, seed=3)
    assert torch.equal(t1.ref, t2.ref) and torch.equal(t1.target, t2.target)
    assert float(t1.ref.min()) > 0 and float(t1.ref.max()) < 1
    model = nn.Sequential(nn.Linear(32, 4), nn.Sigmoid())

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, q, ref):
            return self.m(q)

    rng = torch.get_rng_state()
    losses = fit(Head(), t1.batches(4), t1.targets(4), steps=30, lr=1e-2)
    assert losses[-1] < losses[0]
    assert torch.equal(torch.get_rng_state(), rng)  # the caller's RNG is left alone


def test_float16_output_path_for_j6h_p():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 8, 6, 6, generator=g).relu()
    w = torch.randn(12, 8, 3, 3, generator=g) * 0.1
    call = GemmCall("c", "conv2d", x, w, (1, 1, 1, 1))
    rows = {r["format"]: r for r in evaluate_formats(call, FORMATS, out_dtype=DType.FLOAT16)}
    assert rows["int8"]["sqnr_db"] < rows["split_k7_wide"]["sqnr_db"] - 20
    # errors in float16 ulps at each reference value: about one rounding on average
    assert rows["split_k7_wide"]["mean_err_lsb"] < 1.0 < rows["int8"]["mean_err_lsb"]
    assert rows["split_k7_wide"]["out_saturated"] == 0


def test_fixed_split_study_toy_conv():
    from quantlab.analysis.weight_split import fixed_split_study
    from quantlab.models.tasks import SoftmaxKL, Top1Agreement
    from quantlab.platforms import PlatformConfig

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 4, 3, padding=1),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 5),
    ).eval()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(2, 3, 6, 6, generator=g),) for _ in range(2)]
    platform = PlatformConfig(global_dtype=DType.INT16, gemm_input_dtype=DType.INT16)
    df = fixed_split_study(
        model, platform, batches[:1], batches, [Top1Agreement(), SoftmaxKL()], top_modules=["2"]
    )
    assert list(df["layers_split"]) == [0, 1, 3, 1, 3]
    sq = df.set_index(["scheme", "combine"])["sqnr_db"]
    assert sq["split_all", "WIDE_ACCUMULATOR"] > sq["int8", "-"] + 1  # measured ~2.8 dB
    wb = dict(zip(df["scheme"], df["weight_bytes"]))
    assert wb["split_all"] == 2 * wb["int8"]
    assert {"top1_agreement", "kl_nats", "cost_rel_int8", "extra_int8_macs"} <= set(df.columns)
    # the output SQNR over the 4 inputs with its interval, and sentences that say what it allows
    assert (df["sqnr_db_n"] == 4).all()
    assert ((df.sqnr_db_ci_low <= df.sqnr_db) & (df.sqnr_db <= df.sqnr_db_ci_high)).all()
    from types import SimpleNamespace

    from quantlab.analysis.highlow_words import fixed_findings

    lines = fixed_findings(SimpleNamespace(fixed_num_eval=4, top_k=1), df.assign(model="toy"))
    assert lines[0].count("dB (95% CI") == len(df) and lines[0].count("n=4") == 3 * len(df)
    assert len(lines) == 4 and all("intervals" in line for line in lines[1:])


def test_conv1d_layers_are_split_like_conv2d_ones():
    """A Conv1d call (an audio or sequence model's) is captured in the conv2d form of a height-1
    image, with its own name and kind: the same float output as the call, its formats
    evaluated (the split recovering precision), its weight ranked by the sensitivity pass and
    split in fixed mode; padding by name passes through."""
    from quantlab.analysis.weight_split import fixed_split_study
    from quantlab.models.tasks import OutputSQNR
    from quantlab.platforms import PlatformConfig

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv1d(4, 8, 5, stride=2, padding=2, dilation=1), nn.ReLU(),
        nn.Conv1d(8, 6, 3, padding="same", dilation=2), nn.ReLU(), nn.Flatten(),
        nn.Linear(6 * 16, 3),
    ).eval()  # fmt: skip
    x = torch.randn(2, 4, 32).relu()
    calls = capture_gemm_calls(model, (x,))
    assert [(c.name, c.kind) for c in calls] == [
        ("0:conv1d#0", "conv1d"), ("2:conv1d#0", "conv1d"), ("5:linear#0", "linear"),
    ]  # fmt: skip
    assert calls[0].conv_args == ((1, 2), (0, 2), (1, 1), 1)
    assert calls[1].conv_args == ((1, 1), "same", (1, 2), 1)
    with torch.no_grad():
        y = model[0](x)
        h = model[2](model[1](y))
    for call, conv, want in ((calls[0], model[0], y), (calls[1], model[2], h)):
        got = torch.nn.functional.conv2d(call.x, call.w, conv.bias, *call.conv_args).squeeze(-2)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    rows = evaluate_formats(calls[1], FORMATS)
    sq = {r["format"]: r["sqnr_db"] for r in rows}
    assert {r["op_type"] for r in rows} == {"conv1d"} and sq["split_k7_wide"] > sq["int8"] + 20
    assert calls[0].macs == 2 * 8 * 16 * 4 * 5
    sens = weight_sensitivity(model, [(x,)])
    assert set(sens["kind"]) == {"Conv1d", "Linear"} and len(sens) == 3
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(2, 4, 32, generator=g),) for _ in range(2)]
    df = fixed_split_study(model, PlatformConfig(), batches[:1], batches, [OutputSQNR()],
                           top_modules=["2"], progress=False)  # fmt: skip
    assert list(df["layers_split"]) == [0, 1, 3, 1, 3]
