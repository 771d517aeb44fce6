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
        raise ValueError(f"data=synthetic needs the input shape of model {name}: {_ask(model)}")
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


def _ask(model: ModelInputs) -> str:
    """What to set: ``model.input_shape``, one list per input where the model has several (an
    ONNX graph's known sizes shown, ? for a dynamic one)."""
    known = model.partial_shapes
    if not known:
        return "set model.input_shape (one list per input for several: [[6], [3]])"
    shown = ", ".join(
        "[N, " + ", ".join("?" if d is None else str(d) for d in s) + "]" for s in known
    )
    per_input = "[" + ", ".join("[" + ", ".join("..." for _ in s) + "]" for s in known) + "]"
    form = per_input if len(known) > 1 else "[" + ", ".join("..." for _ in known[0]) + "]"
    return f"its inputs are {shown}; set model.input_shape={form} (without the batch dimension)"
