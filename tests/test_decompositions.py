"""Attention calls captured as the ops they compose (quantlab.decompositions): the float bits
of the call (nn.MultiheadAttention) or of torch's math backend (scaled_dot_product_attention,
masks included), every part named and quantized, every FLOAT run alike, the rows split from a
packed weight as weights, and the parts through replay, traced programs and ONNX export."""

from __future__ import annotations

import contextlib
import functools
import math
import operator
import warnings

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal, leaves
from program_switch import build_in_first_run
from test_capture import capture
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

from quantlab.decompositions import (
    DecomposingMode,
    attention_by_definition,
    decomposition,
    splits,
)
from quantlab.numerics.dtypes import DType
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator


def _math_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """torch's math backend of scaled_dot_product_attention (no mask, no dropout here)."""
    assert attn_mask is None and not dropout_p and not is_causal
    return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, scale=scale)[0]


def _cases(n: int):
    g = torch.Generator().manual_seed(11)
    for i in range(n):
        b, h, lq, lk, e = (int(torch.randint(1, hi, (), generator=g)) for hi in (4, 5, 40, 40, 70))
        shape = (b, h) if i % 3 else (b,)  # 3-D operands too
        q = torch.randn(*shape, lq, e, generator=g) * (0.1, 1.0, 8.0)[i % 3]
        k = torch.randn(*shape, lk, e, generator=g) * 3
        v = torch.randn(*shape, lk, e + i % 5, generator=g)
        scale = (None, 0.0625, float(torch.rand((), generator=g)) + 0.01, -0.3, 2.5)[i % 5]
        yield q, k, v, scale


def test_attention_by_definition_gives_torch_math_backend_bits():
    for q, k, v, scale in _cases(240):
        assert_bits_equal(
            attention_by_definition(q, k, v, scale=scale), _math_sdpa(q, k, v, scale=scale)
        )


def test_masked_attention_by_definition_gives_torch_math_backend_bits():
    """Bool masks (broadcast over heads), float masks, rows masked whole, causal masks, on
    random shapes, against scaled_dot_product_attention on the math backend."""
    g = torch.Generator().manual_seed(12)
    kinds = 0
    for i in range(160):
        b, h, lq, lk, e = (int(torch.randint(1, hi, (), generator=g)) for hi in (3, 4, 12, 12, 20))
        q, k, v = (torch.randn(b, h, n, e, generator=g) for n in (lq, lk, lk))
        mask, causal = None, False
        if i % 4 == 0:
            mask = torch.rand(b, 1, lq, lk, generator=g) > 0.3
        elif i % 4 == 1:
            mask = torch.randn(lq, lk, generator=g) * 2
        elif i % 4 == 2:
            mask = torch.rand(b, h, lq, lk, generator=g) > 0.5
            mask[..., 0, :] = False  # the first query sees nothing: its output is 0
            kinds += 1
        else:
            causal = True
        with sdpa_kernel(SDPBackend.MATH):
            want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        assert_bits_equal(attention_by_definition(q, k, v, mask, causal), want)
    assert kinds == 40


def test_attention_by_definition_on_edge_sizes_and_saturated_scores():
    q = torch.tensor([[[[1e4, -1e4]]]])  # one query, scores far apart: one-hot softmax
    k = torch.tensor([[[[1.0, 0.0], [0.0, 1.0], [1e-30, 0.0]]]])
    v = torch.arange(6.0).reshape(1, 1, 3, 2)
    for scale in (None, 1.0, 1e-12, -1.0):
        assert_bits_equal(
            attention_by_definition(q, k, v, scale=scale), _math_sdpa(q, k, v, scale=scale)
        )
    one = torch.randn(1, 1, 1, 1)
    assert_bits_equal(attention_by_definition(one, one, one), _math_sdpa(one, one, one))


class _NoFusedPath(TorchFunctionMode):
    """Any torch function mode turns off nn.MultiheadAttention's fused inference path, as the
    capture does; this one runs every call as it is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("kdim", [None, 12])
def test_multihead_attention_is_captured_as_its_parts_with_its_own_bits(
    batch_first, need_weights, kdim, monkeypatch
):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=batch_first, kdim=kdim, vdim=kdim).eval()
    q = torch.randn(3, 7, 16) if batch_first else torch.randn(7, 3, 16)
    kv = q if kdim is None else torch.randn(*q.shape[:2], kdim)
    calls, (out, weights) = capture(mha, q, kv, kv, need_weights=need_weights)
    with monkeypatch.context() as m, torch.no_grad(), _NoFusedPath():
        m.setattr(F, "scaled_dot_product_attention", _math_sdpa)  # what its body calls
        ref, ref_weights = mha(q, kv, kv, need_weights=need_weights)
    assert_bits_equal(out, ref)
    if need_weights:
        assert_bits_equal(weights, ref_weights)
    types = [c.op_type for c in calls]
    assert "multi_head_attention_forward" not in types
    assert "scaled_dot_product_attention" not in types
    assert types.count("linear") == (2 if kdim is None else 4)  # in-projection(s), output
    assert types.count("matmul") == 2 and types.count("softmax") == 1
    assert all(c.module == "" for c in calls)  # the module itself is the top level here
    if need_weights:  # same code as the call: its own float bits, no reference needed
        with torch.no_grad():
            assert_bits_equal(out, mha(q, kv, kv, need_weights=True)[0])


class _Sdpa(nn.Module):
    def forward(self, q, k, v, **kwargs):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def test_masked_attention_is_parts_with_the_math_backends_bits():
    """Masks (bool, float with a row masked whole, causal) are added to the scores as an add op;
    nn.MultiheadAttention's masked scores, one baddbmm, are a matmul and the mask's add, with
    the bits of the module run under DecomposingMode; dropout keeps the call whole."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    causal = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    calls, (out, _) = capture(mha, x, x, x, attn_mask=causal)
    with torch.no_grad(), DecomposingMode():
        assert_bits_equal(out, mha(x, x, x, attn_mask=causal)[0])
    types = [c.op_type for c in calls]
    assert "baddbmm" not in types and "linear" in types
    at = types.index("softmax")  # scores: matmul, then the mask added, then the softmax
    assert types[at - 2 : at] == ["matmul", "add"] and types.count("matmul") == 2
    q, k, v = (torch.randn(2, 4, 5, 8) for _ in range(3))
    covered = torch.randn(2, 1, 5, 5)
    covered[1, :, 2] = -math.inf  # one query row masked whole: 0s, as the safe softmax gives
    parts = ["mul", "mul", "matmul", "add", "softmax", "masked_fill", "matmul"]
    for kwargs, want in (
        ({"attn_mask": ~causal}, parts),
        ({"attn_mask": covered}, parts),
        ({"is_causal": True}, parts),
        ({"dropout_p": 0.5}, ["scaled_dot_product_attention"]),
    ):
        calls, out = capture(_Sdpa(), q, k, v, **kwargs)
        assert [c.op_type for c in calls if c.op_type != "transpose"] == want, kwargs
        if "dropout_p" not in kwargs:
            with sdpa_kernel(SDPBackend.MATH):
                assert_bits_equal(out, F.scaled_dot_product_attention(q, k, v, **kwargs))


class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.q = nn.Linear(32, 32)

    def forward(self, x):
        y = self.layer(x)
        z, _ = self.attn(y, y, y)
        heads = z.view(2, 6, 4, 8).transpose(1, 2)
        q = self.q(z).view(2, 6, 4, 8).transpose(1, 2)
        return F.scaled_dot_product_attention(q, heads, heads).transpose(1, 2).reshape(2, 6, 32)


def _host(platform: str) -> str:
    """``platform``, or for onnxruntime the profile of this machine's onnxruntime (its uint8 x
    int8 products sum exactly or in saturated pairs: ``export.ort_host``)."""
    from quantlab.export.ort_host import onnxruntime_profile

    return onnxruntime_profile() if platform == "onnxruntime" else platform


def _calibrated(platform: str) -> tuple[Simulator, torch.Tensor]:
    torch.manual_seed(0)
    sim = Simulator(_Encoder().eval(), _host(platform), steady_programs=False)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 6, 32, generator=g),) for _ in range(3)], progress=False)
    return sim, torch.randn(2, 6, 32, generator=g)


def test_simulator_quantizes_every_attention_matmul_and_softmax():
    sim, x = _calibrated("j6m")
    y_float = sim.run(x, mode=Mode.FLOAT)
    ops = sim.ops.set_index("name")
    gemms = ops[ops.op_type.isin(["matmul", "linear"])]
    # per block: scores and weighted sum; the layer's projections and feed-forward, the
    # module's projections, the model's own query projection
    assert (gemms.op_type == "matmul").sum() == 6 and (gemms.op_type == "linear").sum() == 7
    assert set(gemms.fixed_kernel) == {"integer"}
    assert set(ops.loc[ops.op_type == "softmax", "fixed_kernel"]) == {"lut (exp, reciprocal)"}
    y_fake, y_fixed = sim.run(x, mode=Mode.FAKE), sim.run(x, mode=Mode.FIXED)
    assert not torch.equal(y_fake, y_float) and not torch.equal(y_fixed, y_fake)
    sqnr = 10 * torch.log10(y_float.pow(2).mean() / (y_fixed - y_float).pow(2).mean())
    assert sqnr > 15  # int8 attention on random weights: quantized, not broken


def test_attention_parts_replay_as_the_naive_runs_do():
    from quantlab.analysis.sensitivity import sensitivity

    sim, x = _calibrated("j6m")
    fast = sensitivity(sim, [(x,)], kinds=["activation", "weight"], progress=False).table
    naive = sensitivity(sim, [(x,)], kinds=["activation", "weight"], replay=False, progress=False)
    assert len(fast) == len(naive.table) > 20
    assert_bits_equal(
        torch.tensor(fast["value"].to_numpy()), torch.tensor(naive.table["value"].to_numpy())
    )
    assert {"matmul", "softmax"} <= set(fast.op_type)


def test_attention_parts_export_to_onnx_with_fixed_mode_bits(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    from quantlab.export import to_onnx_qdq

    sim, x = _calibrated("onnxruntime")
    to_onnx_qdq(sim, tmp_path / "attention.onnx", (x,))
    session = ort.InferenceSession(str(tmp_path / "attention.onnx"))
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    assert_bits_equal(torch.from_numpy(got), sim.run(x, mode=Mode.FIXED))


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_attention_models_become_traced_programs_with_the_captured_bits(monkeypatch, mode):
    """torch.fx traces attention as the same parts (and answers nn.MultiheadAttention's
    is_nested question from the example), so steady runs switch to a program."""
    build_in_first_run(monkeypatch)
    captured, _ = _calibrated("j6m")
    torch.manual_seed(0)
    steady = Simulator(_Encoder().eval(), "j6m")
    steady.share_calibration(captured)
    _runs_as_a_program(steady, captured, torch.Generator().manual_seed(5), mode)


def _runs_as_a_program(steady: Simulator, captured: Simulator, g, mode, shape=(2, 6, 32)) -> None:
    """``steady`` (programs after no captured time) gives ``captured``'s bits on three inputs,
    the last two through the program it built, with no fallback."""
    xs = [torch.randn(*shape, generator=g) * s for s in (0.5, 1.0, 3.0)]
    for x in xs:
        got, want = steady.run(x, mode=mode), captured.run(x, mode=mode)
        for a, b in zip(leaves(got), leaves(want), strict=True):
            assert_bits_equal(a, b)
    state = steady.steady_programs.status((xs[0],), mode)
    assert state.failed is None and state.program is not None
    assert state.program_runs == len(xs) - 1 and state.program.fallbacks == 0


class _CrossAttention(nn.Module):
    """Cross attention whose key and value are one tensor (the in-projection splits its packed
    weight in two) and two tensors (in three)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x, memory):
        shared, _ = self.attn(x, memory, memory)
        separate, _ = self.attn(x, memory, memory * 1.0)
        return shared + separate


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_cross_attention_projections_quantize_their_weight_rows_as_weights(platform, tmp_path):
    """The rows split from the packed in-projection weight are weights (per-channel codes), not
    activations; the splits are weight preparation, not ops; onnxruntime gives fixed mode's
    bits."""
    torch.manual_seed(0)
    sim = Simulator(_CrossAttention().eval(), _host(platform), steady_programs=False)
    g = torch.Generator().manual_seed(2)
    calib = [(torch.randn(2, 5, 16, generator=g), torch.randn(2, 7, 16, generator=g))]
    sim.calibrate(calib * 2, progress=False)
    x = (torch.randn(2, 5, 16, generator=g), torch.randn(2, 7, 16, generator=g))
    sim.run(*x, mode=Mode.FLOAT)
    ops = sim.ops
    linears = ops[ops.op_type == "linear"]
    assert len(linears) == 7 and set(linears.weight_dtype) == {"INT8"}
    assert not set(ops.op_type) & {"split", "chunk"}
    if platform == "onnxruntime":
        ort = pytest.importorskip("onnxruntime")
        from quantlab.export import to_onnx_qdq

        info = to_onnx_qdq(sim, tmp_path / "cross.onnx", x)
        session = ort.InferenceSession(str(info.path))
        feeds = {n: t.numpy() for n, t in zip(info.input_names, x, strict=True)}
        (got,) = session.run(None, feeds)
        assert_bits_equal(torch.from_numpy(got), sim.run(*x, mode=Mode.FIXED))


def test_every_float_run_computes_attention_by_its_parts(monkeypatch):
    """A FLOAT run that captures nothing (after the ops are known) runs attention by the same
    parts as a captured one: every FLOAT run of the model gives the same bits, torch's math
    backend's (the model called plainly takes the fused kernels, which differ in the last bits)."""
    import quantlab.simulate.core as core

    plain_runs = set()

    class Counted(DecomposingMode):
        def __enter__(self):  # also entered again around each split call's parts
            plain_runs.add(id(self))
            return super().__enter__()

    monkeypatch.setattr(core, "DecomposingMode", Counted)
    sim, x = _calibrated("j6m")
    captured = sim.trace(x, mode=Mode.FLOAT).result
    plain = sim.run(x, mode=Mode.FLOAT)
    assert len(plain_runs) == 1  # the run captured nothing: the model ran under the mode
    assert_bits_equal(plain, captured)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), _NoFusedPath():
        assert_bits_equal(plain, sim.model(x))


class _MaskedAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x, mask):
        b, n, _ = x.shape

        def heads(t):
            return t.view(b, n, 2, 8).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), attn_mask=mask
        )
        return out.transpose(1, 2).reshape(b, n, 16)


def _masked_sqnr_db(mask: torch.Tensor, add_int16: bool) -> float:
    """Fixed (j6m) against float output SQNR of _MaskedAttention over 4 batches."""
    torch.manual_seed(0)
    i16 = OpQConfig(input_dtype=DType.INT16, output_dtype=DType.INT16)
    spec = QConfigSpec(by_name={":add#0": i16}) if add_int16 else None
    sim = Simulator(_MaskedAttention().eval(), "j6m", spec, steady_programs=False)
    g = torch.Generator().manual_seed(3)
    sim.calibrate([(torch.randn(2, 5, 16, generator=g), mask) for _ in range(4)], progress=False)
    signal = noise = 0.0
    for _ in range(4):
        x = torch.randn(2, 5, 16, generator=g)
        ref, got = sim.run(x, mask, mode=Mode.FLOAT), sim.run(x, mask, mode=Mode.FIXED)
        signal += float(ref.pow(2).sum())
        noise += float((got - ref).pow(2).sum())
    return 10 * math.log10(signal / noise)


def test_a_minus_inf_mask_is_lost_at_any_add_width_and_a_finite_one_is_kept():
    """The README's figures: a bool mask (0 / -inf) loses its masked keys at int8 and with the
    mask add at int16 (their scores take the add's lowest code); -100 with the add at int16
    keeps them, as far as with nothing masked."""
    keep = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    keep[1, :, :, 3:] = False
    bool_int8, bool_int16 = _masked_sqnr_db(keep, False), _masked_sqnr_db(keep, True)
    finite_int16 = _masked_sqnr_db(torch.where(keep, 0.0, -100.0), True)
    nothing = _masked_sqnr_db(torch.ones_like(keep), False)
    assert bool_int8 < 8 and bool_int16 < 8
    assert finite_int16 > bool_int16 + 10 and finite_int16 > nothing - 1


class _InputMasked(nn.Module):
    """Attention under two bool masks built from the input: most keys kept, and for the second
    batch item every key masked (rows the safe softmax sets to 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 48)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, 2, 8).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        some = (x[:, :, 0] > -1.0)[:, None, None, :]
        none = torch.cat([some[:1], torch.zeros_like(some[1:])])
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=some)
        y = y + F.scaled_dot_product_attention(q, k, v, attn_mask=none)
        return y.transpose(1, 2).reshape(b, n, 16)


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_masked_attention_becomes_a_traced_program_with_the_captured_bits(monkeypatch, mode):
    """No branch on the mask's values: a masked call traces, and its masked_fill keeps the
    softmax's codes (same_grid), so the next matmul takes them as they are."""
    build_in_first_run(monkeypatch)
    g = torch.Generator().manual_seed(6)
    torch.manual_seed(0)
    model = _InputMasked().eval()
    batches = [(torch.randn(2, 6, 32, generator=g),) for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the masks' -inf (calibration says so)
        captured = Simulator(model, "j6m", steady_programs=False)
        captured.calibrate(batches, progress=False)
    assert list(captured.ops.op_type).count("masked_fill") == 2
    steady = Simulator(model, "j6m")
    steady.share_calibration(captured)
    _runs_as_a_program(steady, captured, g, mode)


class _Masked(nn.Module):
    """Attention under a bool mask built from the input, by scaled_dot_product_attention."""

    def __init__(self, qkv: nn.Linear) -> None:
        super().__init__()
        self.qkv = qkv

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, 2, 8).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        some = (x[:, :, 0] > -1.0)[:, None, None, :]
        return self.attend(q, k, v, some).transpose(1, 2).reshape(b, n, 16)

    def attend(self, q, k, v, some):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=some)


class _ByHand(_Masked):
    """The same attention written out: no masked_fill after the softmax."""

    def attend(self, q, k, v, some):
        bias = torch.where(some, 0.0, -math.inf)
        factor = math.sqrt(1.0 / math.sqrt(8))
        scores = torch.matmul(q * factor, k.transpose(-2, -1) * factor)
        return torch.matmul(torch.softmax(scores + bias, -1), v)


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_the_safe_softmaxs_masked_fill_changes_no_bit_where_no_row_is_covered(platform):
    """A masked call's masked_fill, with no row masked whole, gives the bits of the same
    attention written without it, in every mode (its output is on the softmax's grid)."""
    torch.manual_seed(0)
    qkv = nn.Linear(32, 48)
    g = torch.Generator().manual_seed(7)
    batches = [(torch.randn(2, 6, 32, generator=g),) for _ in range(2)]
    sims = []
    for model in (_Masked(qkv), _ByHand(qkv)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the mask's -inf (calibration says so)
            sim = Simulator(model.eval(), platform, steady_programs=False)
            sim.calibrate(batches, progress=False)
        sims.append(sim)
    assert "masked_fill" in set(sims[0].ops.op_type)
    x = torch.randn(2, 6, 32, generator=g)
    for mode in (Mode.FLOAT, Mode.FAKE, Mode.FIXED):
        assert_bits_equal(sims[0].run(x, mode=mode), sims[1].run(x, mode=mode))


def test_calibration_names_the_points_a_minus_inf_mask_reaches():
    """A bool mask (0 / -inf) warns once, at calibration, naming the mask add's input and how
    many of its values were infinite; a finite mask does not warn."""
    keep = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    keep[1, :, :, 3:] = False
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(2, 5, 16, generator=g),) for _ in range(2)]
    sim = Simulator(_MaskedAttention().eval(), "j6m", steady_programs=False)
    with pytest.warns(UserWarning, match="NaN or infinite values") as seen:
        sim.calibrate([(x, keep) for (x,) in batches], progress=False)
    text = str(seen[0].message)
    assert len(seen) == 1 and ":add#0/in1 (20 of 100)" in text and "stops masking" in text
    finite = Simulator(_MaskedAttention().eval(), "j6m", steady_programs=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        finite.calibrate([(x, torch.where(keep, 0.0, -100.0)) for (x,) in batches], progress=False)


def test_a_hugging_face_model_on_its_default_attention_quantizes_as_on_eager_attention():
    """MiniLM loaded with transformers' default attention (scaled_dot_product_attention) is
    captured with the matmuls and softmaxes of its eager attention, and fixed mode loses as
    much against float."""
    tf = pytest.importorskip("transformers")
    from quantlab.models import example_inputs
    from quantlab.models.minilm import MiniLMEmbedder, model_dir

    level = tf.logging.get_verbosity()
    tf.logging.set_verbosity_error()
    try:
        cosines, kinds = {}, {}
        for impl in ("eager", "sdpa"):
            bert = tf.BertModel.from_pretrained(
                str(model_dir()),
                local_files_only=True,
                attn_implementation=impl,
                add_pooling_layer=False,
            )
            sim = Simulator(MiniLMEmbedder(bert).eval(), "j6m", steady_programs=False)
            sim.calibrate([example_inputs("minilm", 2, seed=k) for k in range(2)], progress=False)
            x = example_inputs("minilm")
            ref, got = sim.run(*x, mode=Mode.FLOAT), sim.run(*x, mode=Mode.FIXED)
            cosines[impl] = float(F.cosine_similarity(ref.flatten(), got.flatten(), 0))
            counts = sim.ops.op_type.value_counts()
            kinds[impl] = (counts.get("matmul", 0), counts.get("softmax", 0))
            assert "scaled_dot_product_attention" not in set(sim.ops.op_type)
    finally:
        tf.logging.set_verbosity(level)
    assert kinds["sdpa"] == kinds["eager"] == (12, 6)
    assert cosines["sdpa"] == pytest.approx(cosines["eager"], abs=0.01)


class _GroupedQueries(nn.Module):
    """Grouped-query attention: 8 query heads over 2 key / value heads (enable_gqa)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.kv = nn.Linear(32, 32), nn.Linear(32, 16)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, 8, 4).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, 8).transpose(1, 2).chunk(2, dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return y.transpose(1, 2).reshape(b, s, 32)


def test_grouped_query_attention_repeats_heads_by_layout_ops_with_the_backends_bits():
    """Each key and value head repeated for its group of query heads (unsqueeze, expand,
    reshape), then the parts: torch's math backend's bits, with masks, scales and 3-d heads."""
    g = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(2, 6, 5, 8, generator=g), *torch.randn(2, 2, 3, 5, 8, generator=g)
    for kwargs in ({}, {"is_causal": True}, {"scale": -0.4},
                   {"attn_mask": torch.randn(2, 1, 5, 5, generator=g)}):  # fmt: skip
        calls, out = capture(_Sdpa(), q, k, v, enable_gqa=True, **kwargs)
        types = [c.op_type for c in calls if c.op_type != "transpose"]
        assert types[:6] == ["unsqueeze", "expand", "reshape"] * 2, kwargs
        assert "scaled_dot_product_attention" not in types and types.count("matmul") == 2
        with sdpa_kernel(SDPBackend.MATH):
            want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
        assert_bits_equal(out, want)
    three_d = torch.randn(6, 5, 8, generator=g), torch.randn(3, 5, 8, generator=g)
    with sdpa_kernel(SDPBackend.MATH):
        want = F.scaled_dot_product_attention(*three_d, three_d[1], enable_gqa=True)
    assert_bits_equal(capture(_Sdpa(), *three_d, three_d[1], enable_gqa=True)[1], want)
    # heads that do not divide: the call is left whole, and torch refuses it
    with pytest.raises(RuntimeError):
        capture(_Sdpa(), q[:, :5], k, v, enable_gqa=True)


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_grouped_query_attention_is_quantized_and_exports_with_fixed_modes_bits(platform, tmp_path):
    """Both attention matmuls and the softmax run their fixed kernels; the repeated heads are
    layout ops on the key and value codes; exported, onnxruntime gives fixed mode's bits."""
    sim, x = _grouped_queries(platform)
    ops = sim.ops.set_index("name")
    assert (ops.op_type == "matmul").sum() == 2 and set(
        ops.fixed_kernel[ops.op_type == "matmul"]
    ) == {"integer"}
    assert set(ops.loc[ops.op_type.isin(["expand", "unsqueeze", "reshape"]), "category"]) == {
        "PASS_THROUGH"
    }
    assert ops.loc[ops.op_type == "softmax", "supported"].all()
    y_float, y_fixed = sim.run(x, mode=Mode.FLOAT), sim.run(x, mode=Mode.FIXED)
    sqnr = 10 * torch.log10(y_float.pow(2).mean() / (y_fixed - y_float).pow(2).mean())
    assert sqnr > 15
    if platform == "onnxruntime":
        ort = pytest.importorskip("onnxruntime")
        from quantlab.export import to_onnx_qdq

        if _host(platform) != platform:  # the products of this host's onnxruntime saturate
            sim, x = _grouped_queries(_host(platform))
            y_fixed = sim.run(x, mode=Mode.FIXED)
        to_onnx_qdq(sim, tmp_path / "gqa.onnx", (x,))
        session = ort.InferenceSession(str(tmp_path / "gqa.onnx"))
        (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        assert_bits_equal(torch.from_numpy(got), y_fixed)


def _grouped_queries(platform: str) -> tuple[Simulator, torch.Tensor]:
    torch.manual_seed(0)
    sim = Simulator(_GroupedQueries().eval(), platform)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 6, 32, generator=g),) for _ in range(3)], progress=False)
    return sim, torch.randn(2, 6, 32, generator=g)


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_grouped_query_attention_becomes_a_traced_program_with_the_captured_bits(monkeypatch, mode):

    build_in_first_run(monkeypatch)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(2, 6, 32, generator=g),) for _ in range(3)]
    torch.manual_seed(0)
    captured = Simulator(_GroupedQueries().eval(), "j6m", steady_programs=False)
    captured.calibrate(batches, progress=False)
    torch.manual_seed(0)
    steady = Simulator(_GroupedQueries().eval(), "j6m")
    steady.share_calibration(captured)
    _runs_as_a_program(steady, captured, g, mode)


def test_a_grouped_query_hugging_face_model_runs_quantized_on_both_attentions():
    """A small Llama (4 query heads over 2 key / value heads, random weights): on transformers'
    sdpa attention (enable_gqa, is_causal) its attention is captured as parts, with as many
    matmuls and softmaxes as its eager attention (key / value heads repeated, a mask of
    float32's lowest value, a key cache that starts empty); both run in fake and fixed mode."""
    tf = pytest.importorskip("transformers")
    level = tf.logging.get_verbosity()
    tf.logging.set_verbosity_error()
    cfg = tf.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )

    class Hidden(nn.Module):
        def __init__(self, llama):
            super().__init__()
            self.llama = llama

        def forward(self, ids):
            return self.llama(input_ids=ids).last_hidden_state

    kinds = {}
    try:
        for impl in ("eager", "sdpa"):
            torch.manual_seed(0)
            llama = tf.LlamaModel._from_config(cfg, attn_implementation=impl)
            sim = Simulator(Hidden(llama).eval(), "j6m", steady_programs=False)
            g = torch.Generator().manual_seed(1)
            batches = [(torch.randint(0, 64, (1, 12), generator=g),) for _ in range(2)]
            sim.calibrate(batches, progress=False)
            ids = torch.randint(0, 64, (1, 12), generator=g)
            ref = sim.run(ids, mode=Mode.FLOAT)
            for mode in (Mode.FAKE, Mode.FIXED):
                got = sim.run(ids, mode=mode)
                assert torch.isfinite(got).all()
                assert float(F.cosine_similarity(ref.flatten(), got.flatten(), 0)) > 0.8
            counts = sim.ops.op_type.value_counts()
            kinds[impl] = (counts.get("matmul", 0), counts.get("softmax", 0))
            assert "scaled_dot_product_attention" not in set(sim.ops.op_type)
    finally:
        tf.logging.set_verbosity(level)
    assert kinds["sdpa"] == kinds["eager"] == (4, 2)


class _Conv1D(nn.Module):
    """A linear layer stored as (in, out) and applied by torch.addmm, as Hugging Face's GPT-2
    Conv1D does."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(weight), nn.Parameter(bias)

    def forward(self, x):
        y = torch.addmm(self.bias, x.view(-1, x.shape[-1]), self.weight)
        return torch.tanh(y.view(*x.shape[:-1], -1))


class _Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.fc = nn.Linear(*weight.shape)
        with torch.no_grad():
            self.fc.weight.copy_(weight.t())
            self.fc.bias.copy_(bias)

    def forward(self, x):
        return torch.tanh(self.fc(x))


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_addmm_with_a_weight_is_a_linear_layer(platform, tmp_path):
    """torch.addmm(bias, x, w) with a parameter w is captured as linear(x, w.t(), bias): a GEMM
    with a weight and bias, whose float bits are the call's and whose fake and fixed bits are
    those of the same nn.Linear; exported, onnxruntime gives fixed mode's bits."""
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(12, 8, generator=g) * 0.3, torch.randn(8, generator=g)
    batches = [(torch.randn(2, 5, 12, generator=g),) for _ in range(2)]
    x = torch.randn(2, 5, 12, generator=g)
    sims = {}
    for name, model in (("addmm", _Conv1D(w, b)), ("linear", _Linear(w, b))):
        sims[name] = Simulator(model.eval(), _host(platform), steady_programs=False)
        sims[name].calibrate(batches, progress=False)
    ops = sims["addmm"].ops
    assert list(ops.op_type) == ["view", "linear", "view", "tanh"] and ops.has_weight[1]
    with torch.no_grad():
        assert_bits_equal(sims["addmm"].run(x, mode=Mode.FLOAT), _Conv1D(w, b)(x))
    for mode in (Mode.FAKE, Mode.FIXED):
        assert_bits_equal(sims["addmm"].run(x, mode=mode), sims["linear"].run(x, mode=mode))
    if platform == "onnxruntime":
        ort = pytest.importorskip("onnxruntime")
        from quantlab.export import to_onnx_qdq

        to_onnx_qdq(sims["addmm"], tmp_path / "addmm.onnx", (x,))
        session = ort.InferenceSession(str(tmp_path / "addmm.onnx"))
        (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        assert_bits_equal(torch.from_numpy(got), sims["addmm"].run(x, mode=Mode.FIXED))


class _OtherAddmm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 3))

    def forward(self, x, m):
        return torch.addmm(x[:, :3], x, self.weight, beta=0.5), torch.addmm(x[0, :3], x, m)


def test_other_addmm_calls_stay_whole():
    """A beta other than 1, or a second factor that is not a parameter: one float call."""
    x, m = torch.randn(5, 4), torch.randn(4, 3)
    calls, out = capture(_OtherAddmm(), x, m)
    assert "linear" not in [c.op_type for c in calls]
    want = _OtherAddmm.forward(_OtherAddmm(), x, m)
    assert [o.shape for o in out] == [t.shape for t in want]


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_addmm_layers_become_a_traced_program_with_the_captured_bits(monkeypatch, mode):

    build_in_first_run(monkeypatch)
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(32, 32, generator=g) * 0.3, torch.randn(32, generator=g)
    batches = [(torch.randn(2, 6, 32, generator=g),) for _ in range(2)]
    captured = Simulator(_Conv1D(w, b).eval(), "j6m", steady_programs=False)
    captured.calibrate(batches, progress=False)
    steady = Simulator(_Conv1D(w, b).eval(), "j6m")
    steady.share_calibration(captured)
    _runs_as_a_program(steady, captured, g, mode)


class _MatmulByWeight(nn.Module):
    """A layer's weight applied by hand: ``x @ w`` of a parameter stored as (in, out), and
    ``torch.matmul(x, v.t())`` of one stored as (out, in)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.w = nn.Parameter(weight)
        self.v = nn.Parameter(weight.t().contiguous())

    def forward(self, x):
        return torch.tanh(x @ self.w), torch.tanh(torch.matmul(x, self.v.t()))


class _LinearNoBias(nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.fc = nn.Linear(*weight.shape, bias=False)
        with torch.no_grad():
            self.fc.weight.copy_(weight.t())

    def forward(self, x):
        y = torch.tanh(self.fc(x))
        return y, y


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_a_matmul_by_a_parameter_is_a_linear_layer(platform, tmp_path):
    """x @ w and x @ v.t() of parameters are linear layers: GEMMs with a weight, the call's
    float bits, and the fake and fixed bits of the same nn.Linear; exported, onnxruntime gives
    fixed mode's bits."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(12, 8, generator=g) * 0.3
    batches = [(torch.randn(2, 5, 12, generator=g),) for _ in range(2)]
    x = torch.randn(2, 5, 12, generator=g)
    sims = {}
    for name, model in (("matmul", _MatmulByWeight(w)), ("linear", _LinearNoBias(w))):
        sims[name] = Simulator(model.eval(), _host(platform), steady_programs=False)
        sims[name].calibrate(batches, progress=False)
    ops = sims["matmul"].ops
    assert list(ops.op_type) == ["linear", "tanh", "linear", "tanh"]
    assert ops.has_weight[0] and ops.has_weight[2]
    with torch.no_grad():
        for a, b in zip(sims["matmul"].run(x, mode=Mode.FLOAT), _MatmulByWeight(w)(x)):
            assert_bits_equal(a, b)
    for mode in (Mode.FAKE, Mode.FIXED):
        pairs = zip(sims["matmul"].run(x, mode=mode), sims["linear"].run(x, mode=mode))
        for a, b in pairs:
            assert_bits_equal(a, b)
    if platform == "onnxruntime":
        ort = pytest.importorskip("onnxruntime")
        from quantlab.export import to_onnx_qdq

        to_onnx_qdq(sims["matmul"], tmp_path / "matmul.onnx", (x,))
        session = ort.InferenceSession(str(tmp_path / "matmul.onnx"))
        got = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        want = sims["matmul"].run(x, mode=Mode.FIXED)
        for a, b in zip(got, want, strict=True):
            assert_bits_equal(torch.from_numpy(a), b)


class _OtherMatmuls(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.b = nn.Parameter(torch.randn(3, 4, 4))

    def forward(self, x, m):
        return self.w @ x, x @ m, x @ self.b, x @ (self.w * 2)


def test_other_matmuls_stay_matmuls():
    """The parameter first, two activations, a 3-d parameter, a weight computed by an op: each
    stays a matmul."""
    x, m = torch.randn(4, 4), torch.randn(4, 4)
    calls, out = capture(_OtherMatmuls(), x, m)
    assert [c.op_type for c in calls if c.op_type != "mul"] == ["matmul"] * 4
    want = _OtherMatmuls.forward(_OtherMatmuls(), x, m)
    assert [o.shape for o in out] == [t.shape for t in want]


def test_mm_by_a_parameter_of_a_3d_input_raises_as_torch_does():
    """torch.mm takes 2-d operands: a 3-d input is torch's own error, not a linear layer."""

    class _Mm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 3))

        def forward(self, x):
            return torch.mm(x, self.w)

    calls, _ = capture(_Mm(), torch.randn(5, 4))
    assert [c.op_type for c in calls] == ["linear"]
    with pytest.raises(RuntimeError, match="must be a matrix"):
        capture(_Mm(), torch.randn(2, 5, 4))


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_matmuls_by_a_parameter_become_a_traced_program_with_the_captured_bits(monkeypatch, mode):

    build_in_first_run(monkeypatch)
    g = torch.Generator().manual_seed(6)
    w = torch.randn(32, 32, generator=g) * 0.3
    batches = [(torch.randn(2, 6, 32, generator=g),) for _ in range(2)]
    captured = Simulator(_MatmulByWeight(w).eval(), "j6m", steady_programs=False)
    captured.calibrate(batches, progress=False)
    steady = Simulator(_MatmulByWeight(w).eval(), "j6m")
    steady.share_calibration(captured)
    _runs_as_a_program(steady, captured, g, mode)


class _Baddbmm(nn.Module):
    def forward(self, m, a, b):
        return (
            torch.baddbmm(m, a, b),
            m.baddbmm(a, b, beta=0.5),
            torch.baddbmm(m, a, b, alpha=2.0),
            torch.baddbmm(torch.full_like(m, math.nan), a, b, beta=0, alpha=0.125),
        )


def test_baddbmm_is_a_matmul_then_its_factors_and_an_add():
    """torch.baddbmm(m, a, b, beta, alpha) and the method are bmm(a, b), times alpha, plus m
    times beta: those float bits and those ops (a factor of 1 and beta 0's m left out, as
    torch ignores m then, NaN or not)."""
    g = torch.Generator().manual_seed(8)
    m, a = torch.randn(3, 4, 6, generator=g), torch.randn(3, 4, 5, generator=g) * 4
    b = torch.randn(3, 5, 6, generator=g)
    calls, out = capture(_Baddbmm(), m, a, b)
    types = [c.op_type for c in calls if c.op_type != "full_like"]
    parts = (
        ["matmul", "add"],
        ["matmul", "mul", "add"],
        ["matmul", "mul", "add"],
        ["matmul", "mul"],
    )
    assert types == [t for call in parts for t in call]
    ab = torch.bmm(a, b)
    for got, want in zip(out, (ab + m, ab + m * 0.5, ab * 2.0 + m, ab * 0.125), strict=True):
        assert_bits_equal(got, want)


class _Scores(nn.Module):
    """Attention scores by torch.baddbmm and by the method, each adding a term of the input."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(32, 32)

    def forward(self, x):
        q, m = self.q(x), x[:, :, :6] * 0.5
        s = torch.baddbmm(m, q, x.transpose(1, 2)) + m.baddbmm(x, q.transpose(1, 2), alpha=0.5)
        return torch.softmax(s, -1)


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_baddbmm_scores_become_a_traced_program_with_the_captured_bits(monkeypatch, mode):

    build_in_first_run(monkeypatch)
    g = torch.Generator().manual_seed(4)
    torch.manual_seed(0)
    model = _Scores().eval()
    batches = [(torch.randn(2, 6, 32, generator=g),) for _ in range(2)]
    captured = Simulator(model, "j6m", steady_programs=False)
    captured.calibrate(batches, progress=False)
    assert "baddbmm" not in set(captured.ops.op_type)
    steady = Simulator(model, "j6m")
    steady.share_calibration(captured)
    _runs_as_a_program(steady, captured, g, mode)


class _MaskedMha(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.att = nn.MultiheadAttention(16, 2, batch_first=True)
        self.out = nn.Linear(16, 4)

    def forward(self, x, mask):
        a, w = self.att(x, x, x, attn_mask=mask)
        return self.out(a), w


def test_masked_multihead_attention_quantizes_its_scores_and_exports(tmp_path):
    """nn.MultiheadAttention with a float mask and its weights: its scores are an integer
    matmul and add in fixed mode (they were one float baddbmm), and the exported model gives
    fixed mode's bits in onnxruntime (onnxruntime profile)."""
    ort = pytest.importorskip("onnxruntime")
    from quantlab.export import to_onnx_qdq

    torch.manual_seed(0)
    model = _MaskedMha().eval()
    g = torch.Generator().manual_seed(2)
    mask = torch.randn(6, 6, generator=g).clamp(-2, 0)  # a finite additive mask

    def batch():
        return torch.randn(2, 6, 16, generator=g), mask

    sim = Simulator(model, _host("onnxruntime"), steady_programs=False)
    sim.calibrate([batch() for _ in range(2)], progress=False)
    kernels = dict(zip(sim.ops.op_type, sim.ops.fixed_kernel, strict=True))
    assert kernels["matmul"] == "integer" and "baddbmm" not in kernels
    x = batch()
    with torch.no_grad(), DecomposingMode():
        want = model(*x)
    for a, b in zip(sim.run(*x, mode=Mode.FLOAT), want, strict=True):
        assert_bits_equal(a, b)
    info = to_onnx_qdq(sim, tmp_path / "mha.onnx", x)
    session = ort.InferenceSession(str(info.path))
    got = session.run(None, {n: t.numpy() for n, t in zip(info.input_names, x, strict=True)})
    for a, b in zip(got, sim.run(*x, mode=Mode.FIXED), strict=True):
        assert_bits_equal(torch.from_numpy(a), b)


class _EinsumAttention(nn.Module):
    """Attention written with torch.einsum (scores, the weighted sum with its operands in a list,
    an output projection by a weight) and, with ``whole``, an einsum of three operands, which
    stays one op."""

    def __init__(self, whole: bool = True) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.proj = nn.Parameter(torch.randn(32, 16) * 0.2)
        self.mix = nn.Parameter(torch.randn(16, 16) * 0.2)
        self.whole = whole

    def forward(self, x):
        b, n = x.shape[:2]
        qkv = self.qkv(x).view(b, n, 3, 4, 8).permute(2, 0, 1, 3, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * 8**-0.5
        o = torch.einsum("bhqk,bkhd->bqhd", [torch.softmax(scores, -1), v])
        y = torch.einsum("bld,de->ble", o.reshape(b, n, 32), self.proj)
        return (y, torch.einsum("ble,ef,bmf->blm", y, self.mix, y)) if self.whole else y


def _einsum_sim(platform: str, whole: bool = True, **options) -> tuple[Simulator, torch.Tensor]:
    torch.manual_seed(0)
    sim = Simulator(_EinsumAttention(whole).eval(), _host(platform), **options)
    g = torch.Generator().manual_seed(5)
    sim.calibrate([(torch.randn(2, 6, 32, generator=g),) for _ in range(2)], progress=False)
    return sim, torch.randn(2, 6, 32, generator=g)


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_einsum_of_two_operands_is_a_matmul_with_the_calls_bits(platform, tmp_path):
    """Each two-operand einsum is captured as its layout ops and one integer matmul, its float
    run gives the model's own bits (torch's einsum lowers to the same steps), and exported
    (without the three-operand einsum, which stays one float op and has no ONNX form),
    onnxruntime gives fixed mode's bits."""
    sim, x = _einsum_sim(platform, steady_programs=False)
    ops = sim.ops
    gemms = ops[ops.op_type == "matmul"]
    assert len(gemms) == 3 and set(gemms.fixed_kernel) == {"integer"}
    whole = ops[ops.op_type == "einsum"]
    assert len(whole) == 1 and not whole.supported.iloc[0]
    with torch.no_grad():
        want = sim.model(x)
    for got, ref in zip(sim.run(x, mode=Mode.FLOAT), want, strict=True):
        assert_bits_equal(got, ref)
    fixed = sim.run(x, mode=Mode.FIXED)[0]  # quantized, and still the same attention
    assert not torch.equal(fixed, want[0])
    assert F.cosine_similarity(fixed.flatten(), want[0].flatten(), dim=0) > 0.95
    if platform == "onnxruntime":
        sim, x = _einsum_sim(platform, whole=False, steady_programs=False)
        _onnxruntime_gives_fixed_modes_bits(sim, x, tmp_path / "einsum.onnx")


def _onnxruntime_gives_fixed_modes_bits(sim: Simulator, x: torch.Tensor, path) -> None:
    """``sim``'s model exported as QDQ runs in onnxruntime with fixed mode's bits on ``x`` at
    three scales."""
    ort = pytest.importorskip("onnxruntime")
    from quantlab.export import to_onnx_qdq

    info = to_onnx_qdq(sim, path, (x,))
    session = ort.InferenceSession(str(info.path))
    for scale in (0.5, 1.0, 3.0):
        xs = x * scale
        got = session.run(None, {session.get_inputs()[0].name: xs.numpy()})
        for a, b in zip(got, leaves(sim.run(xs, mode=Mode.FIXED)), strict=True):
            assert_bits_equal(torch.from_numpy(a), b)


def _quantized_as_parts(sim: Simulator, x: torch.Tensor, platform: str, path, exact: bool):
    """FLOAT gives the model's own bits (``exact``) or its parts' (the model under
    DecomposingMode: parts that reduce in another order than torch's call); FIXED differs
    from it yet keeps each output's direction (cosine above 0.95); on the onnxruntime profile
    the export gives fixed mode's bits."""
    with torch.no_grad(), contextlib.nullcontext() if exact else DecomposingMode():
        want = leaves(sim.model(x))
    for got, ref in zip(leaves(sim.run(x, mode=Mode.FLOAT)), want, strict=True):
        assert_bits_equal(got, ref)
    fixed = leaves(sim.run(x, mode=Mode.FIXED))
    assert not all(torch.equal(a, b) for a, b in zip(fixed, want, strict=True))
    for got, ref in zip(fixed, want, strict=True):
        assert F.cosine_similarity(got.flatten(), ref.flatten(), dim=0) > 0.95
    if platform == "onnxruntime":
        _onnxruntime_gives_fixed_modes_bits(sim, x, path)


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_einsum_attention_becomes_a_traced_program_with_the_captured_bits(monkeypatch, mode):

    build_in_first_run(monkeypatch)
    captured, _ = _einsum_sim("j6m", steady_programs=False)
    torch.manual_seed(0)
    steady = Simulator(_EinsumAttention().eval(), "j6m")  # the three-operand einsum too
    steady.share_calibration(captured)
    _runs_as_a_program(steady, captured, torch.Generator().manual_seed(6), mode)


def test_recurrent_cells_by_their_parts_give_the_cells_bits():
    """nn.LSTMCell, nn.GRUCell and nn.RNNCell (tanh and relu), with and without biases, on
    random sizes: their parts (every FLOAT run's) give the cell call's float bits."""
    g = torch.Generator().manual_seed(9)
    for t in range(60):
        i, h, b = (int(torch.randint(1, 70, (), generator=g)) for _ in range(3))
        bias = t % 3 != 0
        cells = (
            nn.LSTMCell(i, h, bias=bias),
            nn.GRUCell(i, h, bias=bias),
            nn.RNNCell(i, h, bias=bias),
            nn.RNNCell(i, h, bias=bias, nonlinearity="relu"),
        )
        for cell in cells:
            x = torch.randn(b, i, generator=g) * 3
            hx = torch.randn(b, h, generator=g)
            if isinstance(cell, nn.LSTMCell):
                hx = (hx, torch.randn(b, h, generator=g))
            with torch.no_grad():
                want = cell(x, hx)
                with DecomposingMode():
                    got = cell(x, hx)
            for a, w in zip(leaves(got), leaves(want), strict=True):
                assert_bits_equal(a, w)


class _Recurrent(nn.Module):
    """A recurrent head over time steps: an LSTMCell (its state carried, started by the cell),
    a GRUCell and a tanh RNNCell per step, then a linear layer on the last state."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.gru = nn.LSTMCell(6, 8), nn.GRUCell(8, 8)
        self.rnn, self.head = nn.RNNCell(8, 4), nn.Linear(4, 2)

    def forward(self, x):  # (B, T, 6)
        state, g, r = None, torch.zeros(x.shape[0], 8), None
        for t in range(x.shape[1]):
            state = self.lstm(x[:, t], state)
            g = self.gru(state[0], g)
            r = self.rnn(g, r)
        return self.head(r)


def _recurrent_sim(platform: str, **options) -> tuple[Simulator, torch.Tensor]:
    torch.manual_seed(0)
    sim = Simulator(_Recurrent().eval(), _host(platform), **options)
    g = torch.Generator().manual_seed(7)
    sim.calibrate([(torch.randn(2, 3, 6, generator=g),) for _ in range(2)], progress=False)
    return sim, torch.randn(2, 3, 6, generator=g)


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_recurrent_cells_are_quantized_as_their_parts(platform, tmp_path):
    """Each cell call is its projections (linear layers with their weights), gate tables,
    products and sums: nothing left in float; the float run gives the model's own bits, and
    exported, onnxruntime gives fixed mode's bits."""
    sim, x = _recurrent_sim(platform, steady_programs=False)
    ops = sim.ops
    assert not {"lstm_cell", "gru_cell", "rnn_tanh_cell"} & set(ops.op_type)
    assert ops.supported.all()
    linears = ops[ops.op_type == "linear"]
    # each cell's two projections per step, less the first step's hidden projections of the
    # zero states (a constant of the model: the export folds it), and the head
    assert len(linears) == 3 * 2 * 3 - 3 + 1 and linears.has_weight.all()
    assert set(ops[ops.op_type.isin(["sigmoid", "tanh"])].category) == {"LUT"}
    with torch.no_grad():
        want = sim.model(x)
    assert_bits_equal(sim.run(x, mode=Mode.FLOAT), want)
    fixed = sim.run(x, mode=Mode.FIXED)
    assert not torch.equal(fixed, want)
    assert F.cosine_similarity(fixed.flatten(), want.flatten(), dim=0) > 0.95
    if platform == "onnxruntime":
        _onnxruntime_gives_fixed_modes_bits(sim, x, tmp_path / "cells.onnx")


def test_recurrent_sequences_by_their_parts_give_atens_bits():
    """nn.GRU and nn.RNN (tanh, relu) on random sizes, layer counts, directions, batch-first
    or not, with and without biases and initial states: their parts give the call's float
    bits. nn.LSTM's call runs oneDNN's fused kernel on CPU, which differs in the last bits:
    its parts give ATen's own CPU steps' bits (the call with oneDNN off)."""
    g = torch.Generator().manual_seed(10)
    for t in range(24):
        i, h, b, steps = (int(torch.randint(1, hi, (), generator=g)) for hi in (20, 20, 5, 9))
        layers, bidirectional, batch_first = 1 + t % 3, t % 2 == 1, t % 4 < 2
        kinds = (
            (nn.LSTM, {}),
            (nn.GRU, {}),
            (nn.RNN, {"nonlinearity": "tanh"}),
            (nn.RNN, {"nonlinearity": "relu"}),
        )
        for cls, extra in kinds:
            m = cls(
                i, h, layers, bias=t % 5 != 0, batch_first=batch_first,
                bidirectional=bidirectional, **extra,
            ).eval()  # fmt: skip
            shape = (b, steps, i) if batch_first else (steps, b, i)
            x = torch.randn(*shape, generator=g) * 2
            state = torch.randn(layers * (1 + bidirectional), b, h, generator=g)
            args = (x,) if t % 3 else (x, (state, state * 0.5) if cls is nn.LSTM else state)
            with torch.no_grad():
                with torch.backends.mkldnn.flags(enabled=cls is not nn.LSTM):
                    want = m(*args)
                with DecomposingMode():
                    got = m(*args)
            for a, w in zip(leaves(got), leaves(want), strict=True):
                assert_bits_equal(a, w)


class _Sequences(nn.Module):
    """An LSTM and a GRU that stay whole: a packed sequence, projections (proj_size), and
    dropout between layers in training."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 6, batch_first=True)
        self.proj = nn.LSTM(4, 6, proj_size=3, batch_first=True)
        self.gru = nn.GRU(4, 6, num_layers=2, dropout=0.5, batch_first=True)

    def forward(self, x):
        packed = nn.utils.rnn.pack_padded_sequence(x, [3, 2], batch_first=True)
        return self.lstm(packed)[1][0], self.proj(x)[0], self.gru(x)[0]


def test_packed_projected_and_training_dropout_sequences_stay_whole():
    x = torch.randn(2, 3, 4)
    for training in (False, True):
        model = _Sequences().train(training)
        calls, _ = capture(model, x)
        types = [c.op_type for c in calls]
        assert types.count("lstm") == 2 and types.count("gru") == int(training), types


class _Crnn(nn.Module):
    """A text-recognizer shape: convolution, columns as a sequence, a two-layer bidirectional
    LSTM, a GRU, a linear layer per step."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.lstm = nn.LSTM(8 * 4, 8, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = nn.GRU(16, 6)
        self.head = nn.Linear(6, 5)

    def forward(self, x):  # (B, 1, 4, W)
        f = torch.relu(self.conv(x)).flatten(1, 2).transpose(1, 2)  # (B, W, 32)
        y, _ = self.lstm(f)
        z, _ = self.gru(y.transpose(0, 1))
        return self.head(z)


def _crnn_sim(platform: str, **options) -> tuple[Simulator, torch.Tensor]:
    torch.manual_seed(0)
    sim = Simulator(_Crnn().eval(), _host(platform), **options)
    g = torch.Generator().manual_seed(11)
    sim.calibrate([(torch.randn(2, 1, 4, 5, generator=g),) for _ in range(2)], progress=False)
    return sim, torch.randn(2, 1, 4, 5, generator=g)


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_recurrent_sequences_are_quantized_as_their_parts(platform, tmp_path):
    """nn.LSTM (two layers, both directions) and nn.GRU run as their projections, gate tables,
    products, sums, stacks and concatenation: nothing left in float; every FLOAT run gives the
    parts' bits, and exported, onnxruntime gives fixed mode's bits."""
    sim, x = _crnn_sim(platform, steady_programs=False)
    ops = sim.ops
    assert not {"lstm", "gru"} & set(ops.op_type) and ops.supported.all()
    linears = ops[ops.op_type == "linear"]
    # LSTM: per layer and direction one input projection and 5 steps; GRU: 1 + 5; the head
    # less the first step's hidden projection of each zero initial state (4 LSTM, 1 GRU): a
    # constant of the model, which the export folds
    assert len(linears) == 2 * 2 * (1 + 5) + (1 + 5) + 1 - 5 and linears.has_weight.all()
    _quantized_as_parts(sim, x, platform, tmp_path / "crnn.onnx", exact=False)


# model -> (its calibrated Simulator, the model, an input shape)
RECURRENT_MODELS = {
    "cells": (_recurrent_sim, _Recurrent, (2, 3, 6)),
    "sequences": (_crnn_sim, _Crnn, (2, 1, 4, 5)),
}


@pytest.mark.parametrize("model", list(RECURRENT_MODELS))
@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_recurrent_models_become_traced_programs_with_the_captured_bits(monkeypatch, mode, model):

    build_in_first_run(monkeypatch)
    make_sim, cls, shape = RECURRENT_MODELS[model]
    captured, _ = make_sim("j6m", steady_programs=False)
    torch.manual_seed(0)
    steady = Simulator(cls().eval(), "j6m")
    steady.share_calibration(captured)
    _runs_as_a_program(steady, captured, torch.Generator().manual_seed(8), mode, shape)


def test_rms_norm_by_its_parts_gives_the_calls_bits():
    """nn.RMSNorm, F.rms_norm and torch.rms_norm (float32 and float64; one or two normalized
    dims; with and without a weight; eps given or its dtype's epsilon) on random sizes and
    magnitudes (rows of zeros too, where eps alone keeps rsqrt finite): their parts give the
    call's float bits."""
    g = torch.Generator().manual_seed(12)
    for t in range(80):
        dtype = torch.float64 if t % 4 == 3 else torch.float32
        n, m = (int(torch.randint(1, 300, (), generator=g)) for _ in range(2))
        shape = (n,) if t % 3 else (m % 7 + 1, n)
        x = torch.randn(2, 5, *shape, generator=g, dtype=dtype) * 10 ** (t % 7 - 3)
        x[0, 0] = 0
        eps = (None, 1e-6, 1e-5, 0.0)[t % 4]
        w = torch.randn(shape, generator=g, dtype=dtype) if t % 5 else None
        module = nn.RMSNorm(shape, eps=eps, elementwise_affine=w is not None, dtype=dtype)
        if w is not None:
            module.weight.data.copy_(w)
        calls = (
            lambda x, shape, w, eps, module=module: module(x),
            lambda x, shape, w, eps: F.rms_norm(x, list(shape), w, eps),
            lambda x, shape, w, eps: torch.rms_norm(x, shape, weight=w, eps=eps),
        )
        for call in calls:
            with torch.no_grad():
                want = call(x, shape, w, eps)
                with DecomposingMode():
                    got = call(x, shape, w, eps)
            assert_bits_equal(got, want)


class _RmsBlock(nn.Module):
    """A pre-norm block of the LLaMA kind: RMSNorm, a gated SiLU feed-forward, the residual,
    and a final RMSNorm without a weight before a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(32, eps=1e-6)
        self.gate, self.up, self.down = nn.Linear(32, 48), nn.Linear(32, 48), nn.Linear(48, 32)
        self.final = nn.RMSNorm(32, elementwise_affine=False)
        self.head = nn.Linear(32, 8)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)

    def forward(self, x):
        h = self.norm(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return self.head(self.final(x))


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_rms_norm_is_quantized_as_its_parts(platform, tmp_path):
    """Each nn.RMSNorm runs as its square, mean, eps add, rsqrt table and products (the
    weight's too): nothing left in float; the FLOAT run gives the model's own bits, fixed mode
    stays close to it, and exported, onnxruntime gives fixed mode's bits."""
    sim, x = _parts_sim("rms_norm", platform, steady_programs=False)
    ops = sim.ops
    assert "rms_norm" not in set(ops.op_type) and ops.supported.all()
    for op_type, count in (("pow", 2), ("mean", 2), ("rsqrt", 2), ("add", 3)):
        assert (ops.op_type == op_type).sum() == count, op_type
    # per norm: the input times its rsqrt; the weighted one also times its weight; the gate
    assert (ops.op_type == "mul").sum() == 2 + 1 + 1
    _quantized_as_parts(sim, x, platform, tmp_path / "rms.onnx", exact=True)


def test_half_precision_rms_norm_stays_whole():
    for dtype in (torch.float16, torch.bfloat16):
        calls, _ = capture(nn.RMSNorm(8, dtype=dtype), torch.randn(2, 8, dtype=dtype))
        assert [c.op_type for c in calls] == ["rms_norm"]


def _call_and_parts(call, *args) -> tuple:
    """(the call's result, its parts' result under DecomposingMode) on ``args``."""
    want = call(*args)
    with DecomposingMode():
        return want, call(*args)


def _fixed_ops(model: nn.Module, shape: tuple):
    """The ops table of ``model`` (made after torch's seed 0 is set) on J6M after one
    calibration batch and one fixed-mode run on random inputs of ``shape``."""
    sim = Simulator(model.eval(), "j6m")
    sim.calibrate([(torch.randn(*shape),)], progress=False)
    sim.run(torch.randn(*shape), mode=Mode.FIXED)
    return sim.ops


def _parts_give_the_calls_bits(calls, x: torch.Tensor) -> None:
    """Each call's parts (under DecomposingMode) give its float bits, NaN where it has NaN
    (a NaN's sign aside)."""
    for call in calls:
        want, got = _call_and_parts(call, x)
        both = torch.isnan(got) & torch.isnan(want)
        assert_bits_equal(got.masked_fill(both, 1.0), want.masked_fill(both, 1.0))
        assert torch.equal(torch.isnan(got), torch.isnan(want))


def test_neg_square_glu_and_softmin_by_their_parts_give_the_calls_bits():
    """``-x`` (every spelling), ``torch.square``, ``F.glu`` / ``nn.GLU``, ``F.softmin`` /
    ``nn.Softmin`` and ``c / x`` on random sizes and magnitudes (signed zeros, infinities and
    NaN among them): their parts give the call's float bits (a NaN's sign aside: negation
    flips it, the product by -1 keeps the NaN operand as it is); integer and in-place calls
    stay whole."""
    g = torch.Generator().manual_seed(15)
    for t in range(60):
        dtype = torch.float64 if t % 5 == 4 else torch.float32
        n = 2 * int(torch.randint(2, 200, (), generator=g))
        x = torch.randn(3, n, 2, generator=g, dtype=dtype) * 10 ** (t % 9 - 4)
        x[0, :4, 0] = torch.tensor([0.0, -0.0, float("inf"), float("nan")], dtype=dtype)
        calls = (
            lambda x: -x,
            lambda x: x.neg(),
            lambda x: torch.neg(x),
            lambda x: torch.negative(x),
            lambda x: torch.square(x),
            lambda x: x.square(),
            lambda x: F.glu(x, 1),
            lambda x: nn.GLU(dim=1)(x),
            lambda x: F.glu(x[..., :1].squeeze(-1)),
            lambda x: F.softmin(x, 1),
            lambda x: nn.Softmin(dim=-1)(x),
            lambda x: F.softmin(x, 0, dtype=torch.float64),
            lambda x: 1.0 / x,
            lambda x: 1 / x,
            lambda x: -3.5 / x,
            lambda x: x.__rdiv__(7),
        )
        _parts_give_the_calls_bits(calls, x)
    n = torch.arange(4)
    assert decomposition(torch.Tensor.__neg__, (n,), {}) is None
    assert decomposition(torch.square, (n,), {}) is None
    assert decomposition(F.glu, (torch.randn(3, 5),), {}) is None  # odd: torch raises
    assert decomposition(torch.Tensor.__rtruediv__, (n, 2.0), {}) is None
    assert decomposition(torch.Tensor.__rtruediv__, (x, 0.0), {}) is None
    assert decomposition(operator.truediv, (x, 2.0), {}) is None  # x / 2: a division op
    assert decomposition(operator.truediv, (2.0, x), {}) is not None  # fx's trace of 2 / x
    assert not splits(torch.Tensor.neg_) and not splits(torch.Tensor.square_)


class _Gated(nn.Module):
    """Rotary embeddings (rotate_half's negated half), a GLU feed-forward, a squared-ReLU
    branch and a softmin over positions."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.glu = nn.Sequential(nn.Linear(16, 32), nn.GLU())
        angle = torch.arange(6)[:, None] * 0.3 * torch.arange(1, 9)[None, :]
        self.register_buffer("cos", torch.cat([angle.cos()] * 2, -1))
        self.register_buffer("sin", torch.cat([angle.sin()] * 2, -1))

    def forward(self, x):  # (B, 6, 16)
        q = self.proj(x)
        q1, q2 = q.chunk(2, -1)
        q = q * self.cos + torch.cat((-q2, q1), -1) * self.sin
        y = self.glu(q) + torch.square(torch.relu(q))
        return y * F.softmin(y, dim=1)


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_neg_square_glu_and_softmin_are_quantized_as_their_parts(platform, tmp_path):
    """The negated half is a product by -1, the square a product x * x (pow 2), the GLU a
    sigmoid table and a product, the softmin a product by -1 and a softmax: nothing left in
    float; the FLOAT run gives the model's own bits, and exported, onnxruntime gives fixed
    mode's bits."""
    sim, x = _parts_sim("gated", platform, steady_programs=False)
    ops = sim.ops
    assert not {"neg", "square", "glu", "softmin"} & set(ops.op_type) and ops.supported.all()
    assert (ops.op_type == "pow").sum() == 1 and (ops.op_type == "softmax").sum() == 1
    assert (ops.op_type == "sigmoid").sum() == 1
    _quantized_as_parts(sim, x, platform, tmp_path / "gated.onnx", exact=True)


def _parts_near_the_calls(calls, x: torch.Tensor, epsilons: int) -> None:
    """Each call's parts (under DecomposingMode) give its shape and its values within
    ``epsilons`` float32 epsilons, relative."""
    for call in calls:
        want, got = _call_and_parts(call, x)
        assert got.shape == want.shape
        assert ((got - want).abs() <= epsilons * torch.finfo().eps * want.abs()).all()


def test_norms_by_their_parts_are_the_sum_of_squares_root():
    """Order-2 norms (``x.norm``, ``torch.norm``, ``torch.linalg.vector_norm``, of all elements
    or over dims, keepdim or not) and ``F.normalize`` are ``sqrt(sum(x * x))`` and its
    division: within 4 float32 epsilons of the call (torch's kernel sums in another order);
    other orders, a dtype, ``out=`` and integer inputs stay whole."""
    g = torch.Generator().manual_seed(18)
    for t in range(40):
        x = torch.randn(3, int(torch.randint(1, 300, (), generator=g)), 4, generator=g)
        x = x * 10 ** (t % 7 - 3)
        calls = (
            lambda x: x.norm(dim=-1),
            lambda x: x.norm(),
            lambda x: x.norm(2, 1, True),
            lambda x: torch.norm(x, p="fro", dim=(1, 2), keepdim=True),
            lambda x: torch.linalg.vector_norm(x, dim=(0, 2)),
            lambda x: torch.linalg.vector_norm(x, 2, keepdim=True),
            lambda x: F.normalize(x, dim=1),
            lambda x: F.normalize(x, p=2.0, dim=-1, eps=1e-6),
        )
        _parts_near_the_calls(calls, x, epsilons=4)
    x = torch.randn(2, 5)
    for func, args, kwargs in (
        (torch.Tensor.norm, (x, 1, -1), {}),
        (torch.Tensor.norm, (x,), {"p": float("inf")}),
        (torch.linalg.vector_norm, (x,), {"dtype": torch.float64}),
        (torch.norm, (x.long(),), {}),
        (F.normalize, (x,), {"out": torch.empty(2, 5)}),
    ):
        assert decomposition(func, args, kwargs) is None
    # torch.norm hands a function mode its call with out=None and dtype=None (Resemblyzer's
    # torch.norm(e, dim=1, keepdim=True) stayed one op, not modelled)
    handed = {"p": "fro", "dim": 1, "keepdim": True, "out": None, "dtype": None}
    assert decomposition(torch.norm, (x,), handed) is not None
    ops = _fixed_ops(_NormedByTorchNorm(), (2, 8))
    assert "norm" not in set(ops.op_type) and ops.supported.all()


class _NormedByTorchNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        e = torch.relu(self.linear(x))
        return e / torch.norm(e, dim=1, keepdim=True)


def test_cosine_similarity_by_its_parts_is_within_a_few_epsilons():
    """F.cosine_similarity (same shapes, broadcast operands, any dim, eps, zero vectors) is
    each operand over its clamped 2-norm, their product summed: within 8 float32 epsilons of
    the call (a value in [-1, 1]) and of its shape; other calls stay whole."""
    g = torch.Generator().manual_seed(27)
    for t in range(30):
        n = int(torch.randint(1, 200, (), generator=g))
        a = torch.randn(3, n, 2, generator=g) * 10 ** (t % 5 - 2)
        b = torch.randn(3, n, 2, generator=g)
        a[0, :, 0] = 0.0  # a zero vector: its norm clamped to eps, a similarity of 0
        calls = (
            lambda a, b: F.cosine_similarity(a, b),
            lambda a, b: F.cosine_similarity(a, b[:1], dim=-1),
            lambda a, b: torch.cosine_similarity(a[:, :, :1], b, 0, 1e-4),
            lambda a, b: F.cosine_similarity(a, b, dim=1, eps=0.5),
        )
        for call in calls:
            want, got = _call_and_parts(call, a, b)
            assert got.shape == want.shape
            assert float((got - want).abs().max()) <= 8 * torch.finfo().eps
    x = torch.randn(2, 5)
    for args, kwargs in (((x.long(), x.long()), {}), ((x, x.double()), {}), ((x, x, 2), {})):
        assert decomposition(torch.cosine_similarity, args, kwargs) is None


class _Embedder(nn.Module):
    """Two sentence-embedding heads: a masked mean over tokens then F.normalize, and a
    projection divided by its own norm (``e / e.norm(dim=1, keepdim=True)``); and their
    cosine similarity."""

    def __init__(self) -> None:
        super().__init__()
        self.encode = nn.Linear(16, 16)
        self.project = nn.Linear(16, 8)

    def forward(self, x):  # (B, T, 16)
        h = torch.tanh(self.encode(x))
        pooled = F.normalize(h.mean(1), dim=1)
        e = torch.relu(self.project(h[:, -1])) + 0.1
        head = pooled[:, :8]
        return pooled, e / e.norm(dim=1, keepdim=True), F.cosine_similarity(head, head + 0.2 * e)


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_normalized_embeddings_are_quantized_as_their_parts(platform, tmp_path):
    """Each norm is a product, a sum and a square root, F.normalize's and cosine similarity's
    clamps and divisions ops too: nothing left in float on J6; every FLOAT run gives the
    parts' bits, fixed mode keeps the unit vectors' directions, and exported, onnxruntime
    gives fixed mode's bits."""
    sim, x = _parts_sim("embedder", platform, steady_programs=False)
    ops = sim.ops
    assert not {"norm", "normalize", "linalg_vector_norm", "cosine_similarity"} & set(ops.op_type)
    assert (ops.op_type == "sqrt").sum() == 4 and (ops.op_type == "div").sum() == 4
    if platform == "j6m":
        assert ops.supported.all()
    _quantized_as_parts(sim, x, platform, tmp_path / "embed.onnx", exact=False)


def test_logsumexp_by_its_parts_gives_the_calls_bits():
    """torch.logsumexp and the method, over one or two dims, keepdim or not, float32 and
    float64, with infinite maxima (+inf in a row, a row of -inf): the parts give the call's
    float bits; no dim, an empty or an integer input stay whole."""
    g = torch.Generator().manual_seed(21)
    for t in range(60):
        dtype = torch.float64 if t % 5 == 4 else torch.float32
        x = torch.randn(3, int(torch.randint(1, 300, (), generator=g)), 5, generator=g)
        x = (x * 10 ** (t % 6 - 2)).to(dtype)
        if t % 4 == 0:
            x[0, 0, 0] = float("inf")
            x[1] = float("-inf")
        calls = (
            lambda x: torch.logsumexp(x, 1),
            lambda x: x.logsumexp(-1, keepdim=True),
            lambda x: torch.logsumexp(x, dim=(0, 2)),
            lambda x: torch.logsumexp(x, (2, 1), True),
        )
        _parts_give_the_calls_bits(calls, x)
    for args in ((torch.randn(2, 0), 1), (torch.arange(6).reshape(2, 3), 1)):
        assert decomposition(torch.logsumexp, args, {}) is None


class _LogSumExpPool(nn.Module):
    """A log-sum-exp pooling of per-class scores over positions (a CRF's forward score)."""

    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Linear(16, 5)

    def forward(self, x):  # (B, T, 16)
        s = self.score(x)
        return torch.logsumexp(s, dim=1) - s.mean(1)


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_logsumexp_is_quantized_as_its_parts(platform, tmp_path):
    """logsumexp runs as its maximum, exp and log tables, sum and adds: the FLOAT run gives
    the model's own bits and fixed mode stays close to it; on J6 nothing is left in float
    (the runtime profiles run the masked_fill of an infinite maximum in float), and exported,
    onnxruntime gives fixed mode's bits."""
    sim, x = _parts_sim("logsumexp", platform, steady_programs=False)
    ops = sim.ops
    assert "logsumexp" not in set(ops.op_type)
    assert {"amax", "exp", "sum", "log"} <= set(ops.op_type)
    if platform == "j6m":
        assert ops.supported.all()
    _quantized_as_parts(sim, x, platform, tmp_path / "lse.onnx", exact=True)


def test_variance_and_std_by_their_parts_stay_within_a_few_epsilons():
    """var / std (function and method; dims, unbiased, correction, keepdim; offset rows where
    the mean cancels), and var_mean / std_mean, are the two-pass mean, squared difference and
    sum: within 64 float32 epsilons of torch's Welford reduction, the same shape; calls torch
    refuses or that divide by zero or less, integer inputs and ``out=`` stay whole."""
    g = torch.Generator().manual_seed(24)
    for t in range(40):
        x = torch.randn(3, int(torch.randint(2, 300, (), generator=g)), 4, generator=g)
        x = x * 10 ** (t % 5 - 2) + (t % 3) * 5
        calls = (
            lambda x: x.var(1),
            lambda x: x.std(-1, keepdim=True),
            lambda x: torch.var(x, (0, 2), unbiased=False),
            lambda x: torch.std(x, dim=1, correction=0, keepdim=True),
            lambda x: x.var(1, True, True),
            lambda x: x.std(),
            lambda x: x.var(False),
            lambda x: x.var(dim=None, keepdim=True),
        )
        _parts_near_the_calls(calls, x, epsilons=64)
        for pair in (  # (var or std, mean): the spread as above, the mean within 64 epsilons
            lambda x: torch.std_mean(x, 1),  # of the largest |x| (it may cancel to near 0)
            lambda x: torch.var_mean(x, (0, 2), keepdim=True),
            lambda x: torch.std_mean(x, dim=-1, correction=0),
            lambda x: torch.var_mean(x),
        ):
            _parts_near_the_calls([lambda x, pair=pair: pair(x)[0]], x, epsilons=64)
            want, got = _call_and_parts(lambda x, pair=pair: pair(x)[1], x)
            assert got.shape == want.shape
            assert float((got - want).abs().max()) <= 64 * torch.finfo().eps * float(x.abs().max())
    x = torch.randn(2, 5)
    for func, args, kwargs in (
        (torch.var, (x, 1), {"unbiased": True, "correction": 1}),
        (torch.var, (x.long(), 1), {}),
        (torch.std, (x, 1), {"out": torch.empty(2)}),
        (torch.Tensor.var, (x[:, :1], 1), {}),  # one value over N - 1 = 0: torch's nan
        (torch.Tensor.std, (x, 0), {"correction": 2}),
    ):
        assert decomposition(func, args, kwargs) is None


class _ClassicNorm(nn.Module):
    """The Annotated Transformer's LayerNorm, ``a * (x - mean) / (std + eps) + b``, after a
    linear layer, a batch-variance scale and a number over a tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.a, self.b = nn.Parameter(torch.rand(16) + 0.5), nn.Parameter(torch.randn(16) * 0.1)

    def forward(self, x):
        h = self.linear(x)
        mean, std = h.mean(-1, keepdim=True), h.std(-1, keepdim=True)
        y = self.a * (h - mean) / (std + 1e-6) + self.b
        return y * torch.rsqrt(h.var(0, unbiased=False, keepdim=True) + 1.0) + 0.5 / (h + 3.0)


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_a_hand_written_layer_norm_is_quantized_as_its_parts(platform, tmp_path):
    """std and var run as means, differences, products, sums and a square-root table: nothing
    left in float on J6; every FLOAT run gives the parts' bits, fixed mode stays close, and
    exported, onnxruntime gives fixed mode's bits."""
    sim, x = _parts_sim("classic_norm", platform, steady_programs=False)
    ops = sim.ops
    assert not {"std", "var"} & set(ops.op_type) and (ops.op_type == "sqrt").sum() == 1
    assert (ops.op_type == "reciprocal").sum() == 1  # 0.5 / (h + 3): a table, then a product
    if platform == "j6m":
        assert ops.supported.all()
    _quantized_as_parts(sim, x, platform, tmp_path / "classic.onnx", exact=False)


# model -> (its class, the calibration inputs' seed, an input shape): models whose calls split
# into parts that quantize (RMSNorm, neg / square / GLU / softmin, norms, logsumexp, var / std)
def test_local_response_norm_by_its_parts_gives_the_calls_bits():
    """F.local_response_norm and nn.LocalResponseNorm on 3-, 4- and 5-d inputs, windows of 1
    to 7 channels (wider than the tensor's channels too), random alpha, beta and k: the parts
    (an average pool of (size, 1) windows over the channels of x seen as (N, C, L)) give the
    call's float bits, torch's avg_pool3d for 4 or more dims included; 2-d, empty and integer
    inputs stay whole."""
    g = torch.Generator().manual_seed(27)
    for t in range(45):
        dims = [int(torch.randint(1, 9, (), generator=g)) for _ in range(t % 3 + 1)]
        x = torch.randn(2, int(torch.randint(1, 24, (), generator=g)), *dims, generator=g)
        x = x * 10 ** (t % 5 - 2)
        size = int(torch.randint(1, 8, (), generator=g))
        alpha, beta, k = (float(v) for v in torch.rand(3, generator=g) * torch.tensor([2, 2, 3]))
        calls = (
            functools.partial(F.local_response_norm, size=size, alpha=alpha, beta=beta, k=k + 0.1),
            nn.LocalResponseNorm(size),
            functools.partial(F.local_response_norm, size=size, k=2.0),
        )
        _parts_give_the_calls_bits(calls, x)
    for args in (
        (torch.randn(2, 5), 3),
        (torch.randn(2, 0, 4), 3),
        (torch.ones(2, 3, 4).long(), 2),
    ):
        assert decomposition(F.local_response_norm, args, {}) is None


class _ResponseNormed(nn.Module):
    """AlexNet-style local response norms: over the channels of a 1-d convolution's output,
    and of the same values seen as 4-d maps with other constants."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(6, 8, 3, padding=1)
        self.lrn = nn.LocalResponseNorm(5)

    def forward(self, x):  # (B, 6, 16)
        h = torch.relu(self.conv(x))
        maps = F.local_response_norm(h.reshape(2, 8, 4, 4), 3, alpha=0.5, beta=0.75, k=2.0)
        return self.lrn(h), maps


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_local_response_norm_is_quantized_as_its_parts(platform, tmp_path):
    """A local response norm runs as its square, pad, average pool, product, add, power
    table and division: nothing left in float on J6; the FLOAT run gives the model's own
    bits, fixed mode stays close, and exported, onnxruntime gives fixed mode's bits."""
    sim, x = _parts_sim("local_response_norm", platform, steady_programs=False)
    ops = sim.ops
    assert "local_response_norm" not in set(ops.op_type)
    assert {"pad", "avg_pool2d", "pow", "div"} <= set(ops.op_type)
    if platform == "j6m":
        assert ops.supported.all()
    _quantized_as_parts(sim, x, platform, tmp_path / "lrn.onnx", exact=True)


PARTS_MODELS = {
    "rms_norm": (_RmsBlock, 13, (2, 6, 32)),
    "gated": (_Gated, 16, (2, 6, 16)),
    "embedder": (_Embedder, 19, (2, 6, 16)),
    "logsumexp": (_LogSumExpPool, 22, (2, 6, 16)),
    "classic_norm": (_ClassicNorm, 25, (2, 6, 16)),
    "local_response_norm": (_ResponseNormed, 28, (2, 6, 16)),
}


def _parts_sim(model: str, platform: str, **options) -> tuple[Simulator, torch.Tensor]:
    """``PARTS_MODELS[model]`` calibrated on ``platform`` (two random batches) and an input."""
    cls, seed, shape = PARTS_MODELS[model]
    torch.manual_seed(0)
    sim = Simulator(cls().eval(), _host(platform), **options)
    g = torch.Generator().manual_seed(seed)
    sim.calibrate([(torch.randn(*shape, generator=g),) for _ in range(2)], progress=False)
    return sim, torch.randn(*shape, generator=g)


@pytest.mark.parametrize("model", list(PARTS_MODELS))
@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_models_of_parts_become_traced_programs_with_the_captured_bits(monkeypatch, mode, model):

    build_in_first_run(monkeypatch)
    captured, _ = _parts_sim(model, "j6m", steady_programs=False)
    cls, seed, shape = PARTS_MODELS[model]
    torch.manual_seed(0)
    steady = Simulator(cls().eval(), "j6m")
    steady.share_calibration(captured)
    _runs_as_a_program(steady, captured, torch.Generator().manual_seed(seed + 1), mode, shape)


def test_clamps_with_tensor_bounds_are_maximum_and_minimum_with_the_calls_bits():
    """clamp / clip / clamp_min / clamp_max with tensor bounds (broadcast, infinities and NaN
    in the input) are torch.maximum then torch.minimum: the call's bits; number bounds, a
    number beside a tensor bound (torch raises) and in-place calls stay whole. In a model
    whose bounds are activations, they quantize as maximum / minimum ops."""
    g = torch.Generator().manual_seed(31)
    for _ in range(20):
        x = torch.randn(3, 40, generator=g) * 4
        x[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
        lo = torch.randn(40, generator=g) - 1
        hi = lo + torch.rand(40, generator=g) * 3
        for call in (
            lambda x, lo, hi: torch.clamp(x, lo, hi),
            lambda x, lo, hi: x.clamp(min=lo),
            lambda x, lo, hi: x.clip(max=hi),
            lambda x, lo, hi: torch.clamp_min(x, lo),
            lambda x, lo, hi: x.clamp_max(hi[None]),
        ):
            want, got = _call_and_parts(call, x, lo, hi)
            assert_bits_equal(got, want)
    x, t = torch.randn(2, 5), torch.randn(5)
    assert decomposition(torch.clamp, (x, -1.0, 1.0), {}) is None
    assert decomposition(torch.clamp, (x, t, 1.0), {}) is None
    assert not splits(torch.Tensor.clamp_)

    class Bounded(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6)

        def forward(self, x):
            lo = self.b(x)
            return torch.clamp(self.a(x), min=lo, max=lo + 1.0)

    torch.manual_seed(0)
    ops = _fixed_ops(Bounded(), (4, 6))
    assert {"maximum", "minimum"} <= set(ops.op_type) and "clamp" not in set(ops.op_type)
    assert ops.supported.all() and not ops.fixed_in_float.any()


class _BufferClamp(nn.Module):
    """A clamp after a convolution whose bounds are 0-d buffers, or the same numbers."""

    def __init__(self, buffers: bool) -> None:
        super().__init__()
        self.buffers_ = buffers
        self.c = nn.Conv2d(3, 4, 1)
        self.register_buffer("lo", torch.tensor(-0.5))
        self.register_buffer("hi", torch.tensor(0.7))

    def forward(self, x):
        if self.buffers_:
            return torch.clamp(self.c(x), min=self.lo, max=self.hi) * 2
        return torch.clamp(self.c(x), min=-0.5, max=0.7) * 2


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_a_clamp_with_0d_buffer_bounds_is_the_clamp_of_their_numbers(platform):
    """Bounds held in 0-d buffers (numbers needing no gradient) leave the clamp whole with
    their values: the same ops (J6: fused into the convolution) and bits, in every mode, as
    the model with number bounds; it was a maximum and a minimum left in float."""
    x0 = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    assert_bits_equal(
        *_call_and_parts(
            lambda x, lo, hi: torch.clamp(x, lo, hi), x0, torch.tensor(-0.5), torch.tensor(0.7)
        )
    )
    sim = _same_ops_and_bits(_BufferClamp, platform, x0)
    assert "clamp" in set(sim.ops.op_type)


def _same_ops_and_bits(make, platform, x: torch.Tensor) -> Simulator:
    """Simulators of ``make(True)`` and ``make(False)`` (a model and its form written with
    clamps), seeded and calibrated alike on ``platform``: the same op table (names, types,
    kernels) and the same bits on ``x`` in every mode. Returns the first."""
    sims = []
    for variant in (True, False):
        torch.manual_seed(0)
        sim = Simulator(make(variant).eval(), platform)
        g = torch.Generator().manual_seed(6)
        sim.calibrate([(torch.randn(2, 3, 8, 8, generator=g),) for _ in range(2)], progress=False)
        sims.append(sim)
    cols = ["name", "op_type", "category", "fixed_kernel", "supported"]
    assert sims[0].ops[cols].equals(sims[1].ops[cols])
    for mode in (Mode.FLOAT, Mode.FAKE, Mode.FIXED):
        assert_bits_equal(sims[0].run(x, mode=mode), sims[1].run(x, mode=mode))
    return sims[0]


class _HeldBoundExtremes(nn.Module):
    """A floor and a ceiling after a convolution, as torch.maximum / torch.minimum with 0-d
    buffers (a TF or JAX export's ``Max(x, 0.0)`` converts so), or the clamp of the numbers."""

    def __init__(self, extremes: bool) -> None:
        super().__init__()
        self.extremes = extremes
        self.c = nn.Conv2d(3, 4, 1)
        self.register_buffer("lo", torch.tensor(-0.5))
        self.register_buffer("hi", torch.tensor(0.7))

    def forward(self, x):
        if self.extremes:
            return torch.minimum(self.hi, torch.maximum(self.c(x), self.lo)) * 2
        return torch.clamp(torch.clamp(self.c(x), min=-0.5), max=0.7) * 2


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_maximum_and_minimum_with_a_held_number_are_its_clamp(platform):
    """torch.maximum / minimum / max / min of a float tensor and a 0-d buffer, either order,
    are the clamp with its number: the same values on NaN, infinities and signed zeros (the
    sign of a zero or a NaN aside), the same ops and bits in every mode as the
    model written with clamps; before, each was an op left in float. A NaN bound and two
    tensors with values stay whole."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(400, generator=g) * 3
    x[:5] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0])
    for f in (torch.maximum, torch.minimum, torch.max, torch.min, torch.Tensor.maximum):
        for c in (0.0, -0.4, float("inf"), -float("inf")):
            for args in ((x, torch.tensor(c)), (torch.tensor(c), x)):
                want, got = f(*args), decomposition(f, args, {})()
                assert torch.equal(want.isnan(), got.isnan())
                assert torch.equal(want.nan_to_num(), got.nan_to_num())
    assert decomposition(torch.maximum, (x, torch.tensor(float("nan"))), {}) is None
    assert decomposition(torch.maximum, (x, x), {}) is None
    assert decomposition(torch.maximum, (x, nn.Parameter(torch.tensor(0.0))), {}) is None
    x0 = torch.randn(2, 3, 8, 8, generator=g)
    sim = _same_ops_and_bits(_HeldBoundExtremes, platform, x0)
    assert not {"maximum", "minimum"} & set(sim.ops.op_type)


class _InfiniteFloor(nn.Module):
    """magika's guard before its softmax: the maximum with -inf (an open bound)."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(3, 4, 1)
        self.register_buffer("floor", torch.tensor(float("-inf")))

    def forward(self, x):
        y = self.c(x).amax(1)  # a pass-through op: the clamp is an op of its own
        return torch.maximum(self.floor, y), y.clamp(max=float("inf"))


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_an_infinite_clamp_bound_is_open_in_fixed_mode(platform):
    """clamp(min=-inf) / clamp(max=inf): every code passes (the bound's code was the rounding of
    an infinite quotient, which raised)."""
    g = torch.Generator().manual_seed(4)
    torch.manual_seed(0)
    sim = Simulator(_InfiniteFloor().eval(), platform)
    sim.calibrate([(torch.randn(2, 3, 8, 8, generator=g),) for _ in range(2)], False)
    x = torch.randn(2, 3, 8, 8, generator=g)
    floored, capped = sim.run(x, mode=Mode.FIXED)
    assert_bits_equal(floored, capped)
    assert torch.isfinite(floored).all()


def test_threshold_and_shrinks_are_selects_with_the_calls_bits():
    """F.threshold / nn.Threshold, hardshrink and softshrink (function, method, module) on
    random magnitudes with NaN, infinities and signed zeros: their selects give the call's
    bits (softshrink: its values, a zero's sign aside); in a model they quantize as where ops
    (and nan_to_num as a pass-through op), nothing left in float on J6."""
    g = torch.Generator().manual_seed(33)
    for t in range(30):
        x = torch.randn(300, generator=g) * 10 ** (t % 5 - 2)
        x[:5] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.5, -0.0])
        calls = (
            lambda x: F.threshold(x, 0.1, -2.0),
            lambda x: nn.Threshold(0.3, 0.7)(x),
            lambda x: F.hardshrink(x),
            lambda x: x.hardshrink(0.3),
        )
        _parts_give_the_calls_bits(calls, x)
        # softshrink: the same values; a zero's sign aside (ATen's vector loop gives -0.0 for a
        # negative input inside the band, its scalar tail +0.0)
        for call in (lambda x: F.softshrink(x, 0.3), lambda x: nn.Softshrink()(x)):
            want, got = _call_and_parts(call, x)
            assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
            assert torch.equal(got.isnan(), want.isnan())
    assert decomposition(F.threshold, (x, 0.1, 0.0, True), {}) is None  # in place

    class Shrunk(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            y = self.a(x)
            z = F.softshrink(y, 0.2) + F.hardshrink(y, 0.3) + nn.Threshold(0.1, -0.5)(y)
            return self.b(z + torch.nan_to_num(y))

    torch.manual_seed(0)
    ops = _fixed_ops(Shrunk(), (4, 6, 8))
    assert not {"threshold", "hardshrink", "softshrink"} & set(ops.op_type)
    assert (ops.op_type == "where").sum() == 4 and ops.supported.all()
    assert not ops.fixed_in_float.any()
