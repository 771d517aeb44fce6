"""Masks built from integer model inputs, exported: the calls a model makes on an integer or
boolean tensor before any float tensor meets it (comparisons, logic, where, sums, cumulative
sums, tensors made like another) are written as graph nodes, so the exported graph computes the
mask of whatever input it is given. Checked against fixed mode (onnxruntime profile) on inputs
other than the one the graph was exported with, on a toy and on small Hugging Face models
(random weights from their configs). A result the exporter cannot write (``isnan``) is refused
where the graph would read it, not written as the example input's constant."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bits import assert_bits_equal
from torch import nn

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from quantlab.export import UnsupportedOpError, to_onnx_qdq  # noqa: E402
from quantlab.export import runtime as R  # noqa: E402
from quantlab.export.ort_host import onnxruntime_profile  # noqa: E402
from quantlab.simulate import Mode, Simulator  # noqa: E402

ORT_PROFILE = onnxruntime_profile()


class _MaskedAttention(nn.Module):
    """Attention whose masks come from an int64 padding mask (1 = token) by comparisons,
    boolean logic, sums, cumulative sums, minimum, where and full_like / zeros_like on
    integer tensors, then meet the float scores through masked_fill, where and an additive
    bias (1 - mask) * -30 (float32 arithmetic on the integer mask); a neg of an integer (a Neg
    node) and of a float tensor (a product by -1, quantized)."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.k = nn.Linear(8, 8)

    def forward(self, x, mask):
        keep = mask != 0
        pad = mask == 0
        count = mask.sum(-1, keepdim=True)
        pos = mask.cumsum(-1) * mask - 1
        inside = (pos >= 0) & (pos < count) | pad
        pair = keep[:, None, :] & keep[:, :, None]
        near = torch.minimum(pos, torch.full_like(pos, 3))
        near = torch.where(keep, near, torch.zeros_like(near))
        far = torch.logical_not(near > 1) ^ ~inside
        cap = torch.maximum(pos, -(4 - pos.max())) + 1
        scores = self.q(x) @ self.k(x).transpose(-1, -2)
        scores = scores.masked_fill(~pair, -1e4) + (1.0 - mask[:, None, :]) * -30.0
        scores = torch.where(far[:, None, :] & (cap > 2)[:, :, None], scores, scores * 0.5)
        return torch.softmax(scores, -1) @ x + torch.neg(x)


def _masks(g: torch.Generator, n: int = 4) -> list[tuple]:
    """(x, mask) pairs with padding of several lengths (none, some, most)."""
    out = []
    for pad in (0, 2, 5, 1)[:n]:
        mask = torch.ones(2, 7, dtype=torch.long)
        if pad:
            mask[1, 7 - pad :] = 0
            mask[0, :1] = 0
        out.append((torch.randn(2, 7, 8, generator=g), mask))
    return out


def _exported_matches_fixed(model, calib, example, inputs, tmp_path, name="m"):
    sim = Simulator(model.eval(), ORT_PROFILE)
    sim.calibrate(calib, progress=False)
    info = to_onnx_qdq(sim, tmp_path / f"{name}.onnx", example)
    sess = R.session(info.path)
    for x in inputs:
        (got,) = R.run(sess, info.input_names, x, info.output_names[:1])
        assert_bits_equal(torch.from_numpy(got), sim.run(*x, mode=Mode.FIXED))
    return sim, info


def _masked_model_matches(make_model, seed: int, tmp_path, name: str) -> list[tuple]:
    """``_exported_matches_fixed`` on (x, mask) pairs (``_masks``) from ``seed``, the model
    made after torch's seed is set; returns the inputs."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    calib = _masks(g)
    inputs = _masks(g)
    _exported_matches_fixed(make_model(), calib, inputs[1], inputs, tmp_path, name)
    return inputs


def test_a_mask_built_from_an_integer_input_is_computed_by_the_graph(tmp_path):
    inputs = _masked_model_matches(_MaskedAttention, 0, tmp_path, "m")
    import onnx

    written = {n.op_type for n in onnx.load(tmp_path / "m.onnx").graph.node}
    assert {"Equal", "Not", "GreaterOrEqual", "Less", "Greater", "And", "Or", "Xor"} <= written
    assert {"ReduceSum", "CumSum", "Min", "Max", "ReduceMax", "Where", "Neg"} <= written
    # the graph reads the mask: another mask gives another output (nothing was baked in)
    a, b = (inputs[0][0], inputs[0][1]), (inputs[0][0], inputs[2][1])
    sess = R.session(tmp_path / "m.onnx")
    names = ["input0", "input1"]
    assert not torch.equal(
        torch.from_numpy(R.run(sess, names, a)[0]), torch.from_numpy(R.run(sess, names, b)[0])
    )


class _AliasedComparisons(nn.Module):
    """Masks from comparisons called by torch's alias names (``torch.greater`` for ``>``, ...),
    as onnx2torch's converters of ONNX's Greater, Less, GreaterOrEqual and LessOrEqual call
    them, on the integer mask and on a float tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)

    def forward(self, x, mask):
        pos = mask.cumsum(-1)
        keep = torch.not_equal(mask, 0) & torch.greater_equal(pos, 1) & torch.less_equal(pos, 6)
        far = torch.greater(pos, 5) | torch.less(mask, 0)
        scores = self.q(x) @ x.transpose(-1, -2)
        scores = scores.masked_fill(~(keep & ~far)[:, None, :], -1e4)
        positive = torch.greater(scores, 0.0)  # on a float tensor: a comparison, not an op
        return torch.softmax(torch.where(positive, scores, scores * 0.5), -1) @ x


def test_comparisons_by_their_alias_names_are_comparisons(tmp_path):
    """torch.greater and its kin are what ``>`` is: capture passes over them, the exporter
    writes them (it refused ``greater`` as an op type it cannot export, which failed every ONNX
    graph with a Greater node on an integer input in onnx_fidelity)."""
    _masked_model_matches(_AliasedComparisons, 2, tmp_path, "alias")
    import onnx

    written = {n.op_type for n in onnx.load(tmp_path / "alias.onnx").graph.node}
    assert {"Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Equal", "Not"} <= written
    sim = Simulator(_AliasedComparisons().eval(), ORT_PROFILE)
    sim.calibrate(_masks(torch.Generator().manual_seed(0)), progress=False)
    assert not {"greater", "less", "greater_equal", "less_equal", "not_equal"} & set(
        sim.ops.op_type
    )


def _hf_text(name: str):
    tf = pytest.importorskip("transformers")
    tf.logging.set_verbosity_error()
    small = dict(vocab_size=64, max_position_embeddings=32)
    configs = {
        "distilbert": lambda: tf.DistilBertModel(
            tf.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, **small)
        ),
        "gpt2": lambda: tf.GPT2Model(
            tf.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32)
        ),
        "opt": lambda: tf.OPTModel(
            tf.OPTConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                ffn_dim=64,
                word_embed_proj_dim=32,
                **small,
            )
        ),
        "gemma": lambda: tf.GemmaModel(
            tf.GemmaConfig(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=8,
                **small,
            )
        ),
        "t5": lambda: tf.T5EncoderModel(
            tf.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
        ),
        "qwen2": lambda: tf.Qwen2Model(
            tf.Qwen2Config(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                **small,
            )
        ),
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        m = configs[name]().eval()

    class Hidden(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = m

        def forward(self, ids, mask):
            return self.m(input_ids=ids, attention_mask=mask).last_hidden_state

    return Hidden()


def _text_inputs(g: torch.Generator, pads=(0, 3, 6, 1)) -> list[tuple]:
    out = []
    for pad in pads:
        mask = torch.ones(2, 10, dtype=torch.long)
        mask[1, 10 - pad :] = 0
        out.append((torch.randint(0, 64, (2, 10), generator=g), mask))
    return out


@pytest.mark.parametrize("name", ["distilbert", "gpt2", "opt", "gemma", "t5", "qwen2"])
def test_hugging_face_text_models_export_with_their_masks(name, tmp_path):
    """DistilBERT (padding mask), GPT-2 (causal and padding masks, Conv1D GEMMs, an empty
    key cache concatenated), OPT (positions from the mask's cumulative sum, cast to long),
    Gemma (RMSNorm's type_as, one key / value head), T5's encoder (padding_mask[batch_idx,
    kv_idx], relative position buckets added in place to a constant) and Qwen2 (grouped-query
    attention, rotary embeddings with neg): fixed mode's bits in onnxruntime on masks other than the
    example's."""
    g = torch.Generator().manual_seed(2)
    calib = _text_inputs(g)
    inputs = _text_inputs(g)
    _exported_matches_fixed(_hf_text(name), calib, inputs[1], inputs, tmp_path, name)


class _ReadsIsnan(nn.Module):
    """x zeroed where it is NaN: ``isnan`` is no op the exporter writes."""

    def forward(self, x):
        return torch.relu(x) * torch.isnan(x).logical_not().float()


class _BranchesOnIsnan(nn.Module):
    """``isnan`` only steers Python control flow: nothing in the graph reads it."""

    def forward(self, x):
        if bool(torch.isnan(x).any()):
            x = x.nan_to_num()
        return torch.relu(x)


def test_a_result_the_exporter_cannot_write_is_refused_where_the_graph_reads_it(tmp_path):
    x = torch.randn(2, 8)
    sim = Simulator(_ReadsIsnan(), ORT_PROFILE)
    sim.calibrate([(x,)], progress=False)
    with pytest.raises(UnsupportedOpError, match="the result of `isnan`"):
        to_onnx_qdq(sim, tmp_path / "isnan.onnx", (x,))
    _exported_matches_fixed(_BranchesOnIsnan(), [(x,)], (x,), [(x,), (x * 3,)], tmp_path, "b")


class _TableBias(nn.Module):
    """Scores plus a bias gathered from a parameter table by a buffer of indices (Swin's
    relative position bias): a call on constants of the model alone."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(9, 2))
        self.register_buffer("index", torch.randint(0, 9, (16,)))
        self.q = nn.Linear(8, 8)

    def forward(self, x):
        bias = self.table[self.index].reshape(2, 4, 4)
        scores = self.q(x) @ x.transpose(-1, -2)
        return torch.softmax(scores + bias, -1)


def test_a_call_on_constants_alone_is_written_as_its_value(tmp_path):
    torch.manual_seed(4)
    g = torch.Generator().manual_seed(5)
    calib = [(torch.randn(2, 4, 8, generator=g),) for _ in range(2)]
    inputs = [(torch.randn(2, 4, 8, generator=g),) for _ in range(3)]
    _exported_matches_fixed(_TableBias(), calib, inputs[0], inputs, tmp_path, "table")


class _IndexedMask(nn.Module):
    """transformers' padding mask function: ``mask[batch_idx, kv_idx]`` with constant index
    tensors (negative ones too), then the scores masked by it."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)

    def forward(self, x, mask):
        b, t = mask.shape
        batch_idx = torch.arange(b)[:, None, None]
        kv_idx = torch.arange(t)[None, None, :] - t  # negative: counted from the end
        keep = mask.bool()[batch_idx, kv_idx]  # (b, 1, t)
        scores = self.q(x) @ x.transpose(-1, -2)
        return torch.softmax(scores.masked_fill(~keep, -1e4), -1)


def test_a_mask_indexed_by_constant_index_tensors_is_gathered(tmp_path):
    _masked_model_matches(_IndexedMask, 6, tmp_path, "indexed")
    import onnx

    assert "GatherND" in {n.op_type for n in onnx.load(tmp_path / "indexed.onnx").graph.node}


class _GatheredByIndexTensors(nn.Module):
    """Indexing by one integer tensor at one axis, the rest whole: a parameter table's rows by
    ids computed from the input, in the list form onnx2torch's Gather indexes with
    (``table[[ids]]``, a tuple to torch); an activation's last axis by those ids and by a
    constant; the batch by a list of ints (one index tensor to torch)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(10, 8))
        self.q = nn.Linear(8, 8)

    def forward(self, x, mask):
        ids = (mask.cumsum(-1) - 1).clamp(min=0)  # (b, t), 0 to 6
        h = self.q(x + self.table[[ids]])
        picked = h[..., ids[0]]  # (b, t, t)
        fixed = h[:, :, torch.tensor([3, 0, 7, 7])]
        return torch.cat([picked, fixed], -1)[[1, 0]]


@pytest.mark.filterwarnings("ignore:Using a non-tuple sequence")
def test_one_index_tensor_at_one_axis_is_a_gather(tmp_path):
    """Before, every index by a computed tensor was refused (an embedding table of an ONNX
    graph, indexed by its token ids, failed onnx_fidelity), a list of ints was read as a tuple
    of integers (x[[1, 0]] as x[1, 0]: a graph onnxruntime could not run) and a clamp of
    integers (the ids here) had no ONNX form."""
    _masked_model_matches(_GatheredByIndexTensors, 9, tmp_path, "gathered")
    import onnx

    written = [n.op_type for n in onnx.load(tmp_path / "gathered.onnx").graph.node]
    assert written.count("Gather") >= 3 and "GatherND" in written


class _RepeatsOutsideCapture(nn.Module):
    """repeat / tile of tensors no float activation enters: the integer mask (to more dims
    too) and a buffer, as DETR-style decoders repeat their anchors and masks."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.register_buffer("pos", torch.randn(1, 1, 4))

    def forward(self, x, mask):
        wide = mask.repeat(2, 1, 2)[0, :, : mask.shape[1]]  # (b, t) again, through 3-d
        tiled = mask.tile(1, 1)
        pos = self.pos.repeat(1, 1, 2)  # (1, 1, 8)
        keep = (wide * tiled).bool()
        return self.q(x + pos).masked_fill(~keep[..., None], 0.0)


def test_repeat_and_tile_outside_capture_export(tmp_path):
    """repeat / tile of a tensor that is no activation read the shape of an activation that
    was not there (IndexError; kornia's RT-DETR failed its export so)."""
    _masked_model_matches(_RepeatsOutsideCapture, 10, tmp_path, "repeats")


class _WritesAConstant(nn.Module):
    """A tensor the model makes (a constant), read, then changed in place from the input
    (T5's relative_buckets += where(...)), then read again."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(8, 8)

    def forward(self, x, mask):
        pos = torch.ones(mask.shape, dtype=torch.long)
        early = self.emb(pos)  # reads the constant as it is now
        pos += mask * 2  # in place, from the input
        return x + self.emb(pos) + early


def test_a_constant_written_in_place_keeps_the_values_each_read_saw(tmp_path):
    _masked_model_matches(_WritesAConstant, 8, tmp_path, "writes")


class _BoolSelected(nn.Module):
    """Columns selected by a bool buffer: a mask selects, it does not gather."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("keep", torch.tensor([True, False, True, True]))

    def forward(self, x, mask):
        return x[:, self.keep] * 2 + mask.bool()[:, self.keep].float()


def test_indexing_by_a_bool_constant_is_refused(tmp_path):
    x, mask = torch.randn(2, 4), torch.ones(2, 4, dtype=torch.long)
    sim = Simulator(_BoolSelected(), ORT_PROFILE)
    sim.calibrate([(x, mask)], progress=False)
    with pytest.raises(UnsupportedOpError, match="indexing with tensors"):
        to_onnx_qdq(sim, tmp_path / "bool.onnx", (x, mask))


class _InfinityMask(nn.Module):
    """-inf where the integer mask is 0, a where of an activation (as a converted ONNX graph's
    Where writes its attention bias)."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)

    def forward(self, x, mask):
        return torch.where(mask.bool()[..., None], self.q(x), float("-inf"))


def test_fidelity_counts_equal_infinities_as_equal(tmp_path):
    """The mask's -inf in onnxruntime and in fixed mode is the same value: before, inf - inf
    made it a differing element of NaN LSB, and the mask's where the first op to differ."""
    from quantlab.analysis.onnx_fidelity import measure, value_gap
    from quantlab.export import ActivationEncoding

    gap = value_gap(np.array([-np.inf, np.inf, np.nan, 1.0, np.inf]),
                    np.array([-np.inf, np.inf, np.nan, 1.5, 2.0]))  # fmt: skip
    assert gap.tolist() == [0.0, 0.0, 0.0, 0.5, np.inf]
    g = torch.Generator().manual_seed(3)
    calib = _masks(g)
    sim = Simulator(_InfinityMask().eval(), ORT_PROFILE)
    sim.calibrate(calib, progress=False)
    f = measure(sim, calib[1], tmp_path, "inf", ActivationEncoding.UNSIGNED_OFFSET)
    assert f.per_op["differing"].sum() == 0 and f.summary["first_diverging_op"] == ""
