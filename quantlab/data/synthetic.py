"""``synthetic``: seeded random inputs shaped for the model (quantlab.models.example_inputs).

Calibration batch i uses seed ``1_000_003 * cfg.seed + i``; evaluation batch j uses seed
``1_000_003 * cfg.seed + 500_000 + j`` (disjoint while fewer than 500,000 batches). Images are
smooth random fields in the model's input format; token models get random token ids; other
models get their own tensors (normal features, boxes in (0, 1), pixel coordinates); a user's
model gets inputs of its input shape (smooth images in [0, 1] for (3, H, W), else standard
normal; an ONNX graph's integer inputs integers, ``quantlab.models.onnx_inputs``). Without a
model the inputs are those of ``small_cnn`` (3x32x32 images).
"""

from __future__ import annotations

import math

from quantlab.data.dataset import Dataset
from quantlab.data.schema import DataConfig
from quantlab.models.inputs import ModelInputs
from quantlab.models.registry import model_inputs

EVAL_SEED_OFFSET = 500_000
SEED_STRIDE = 1_000_003


def load(cfg: DataConfig, model: ModelInputs | None = None) -> Dataset:
    model = model or model_inputs("small_cnn")
    name = model.name
    if model.example_inputs is None:
        raise ValueError(
            f"data=synthetic needs the input shape of model {name}: set model.input_shape"
        )
    make = model.example_inputs
    base = SEED_STRIDE * cfg.seed
    nc, ne = math.ceil(cfg.num_calib / cfg.batch_size), math.ceil(cfg.num_eval / cfg.batch_size)
    calib = [make(cfg.batch_size, base + i) for i in range(nc)]
    evals = [make(cfg.batch_size, base + EVAL_SEED_OFFSET + j) for j in range(ne)]
    return Dataset(
        name="synthetic",
        calib=calib,
        eval=evals,
        labels=None,
        description=f"seeded random inputs for {name}: {nc} calibration + {ne} evaluation "
        f"batches of {cfg.batch_size} (seed {cfg.seed})",
        calib_ids=[f"seed{base + i}" for i in range(nc)],
        eval_ids=[f"seed{base + EVAL_SEED_OFFSET + j}" for j in range(ne)],
    )
