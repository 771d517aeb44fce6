"""Whole real networks: onnxruntime running quantlab's exported QDQ model (uint8 activations
with zero point 128, default graph optimizations) computes exactly what quantlab's fixed mode
computes under the ``onnxruntime`` profile: 0 differing output values on real photos.

Calibration on the photos' first 2 calibration items and 2 evaluation items keep the test
short; ``python -m quantlab +exp=onnx_fidelity`` measures 8 items and every op.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")

from quantlab.export.ort_host import onnxruntime_profile  # noqa: E402

# the profile of this machine's onnxruntime (onnxruntime_no_vnni on x86 without VNNI)
ORT_PROFILE = onnxruntime_profile()
pytest.importorskip("PIL")

from quantlab.data import load_data  # noqa: E402
from quantlab.export import runtime as R  # noqa: E402
from quantlab.export import to_onnx_qdq  # noqa: E402
from quantlab.models import build_model  # noqa: E402
from quantlab.simulate import Mode, Simulator  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mobilenet_v2", "efficientnet_lite0"])
def test_whole_network_matches_onnxruntime_on_photos(tmp_path, model):
    bundle = build_model(model)
    data = load_data("photos", bundle.name)
    sim = Simulator(bundle.module, ORT_PROFILE)
    sim.calibrate(data.calib[:2], progress=False)
    x = torch.cat([b[0] for b in data.eval[:2]])
    info = to_onnx_qdq(sim, tmp_path / f"{model}.onnx", (x,))
    (y,) = R.run(R.session(info.path), info.input_names, (x,))
    ref = sim.run(x, mode=Mode.FIXED).numpy()
    assert y.shape == ref.shape and y.size == 2000
    differing = int((y != ref).sum())
    assert differing == 0, f"{model}: {differing} of {y.size} output values differ"
    assert not np.isnan(y).any()
