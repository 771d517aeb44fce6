"""On J6P, MobileNetV2's activation-side ranking includes its int8 GEMM inputs (the INPUT pass),
and the recipe raises some of them to int16 (two photos, downscaled to 96 x 96 to stay quick)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quantlab.analysis.recipe import RecipeTarget, run_recipe
from quantlab.analysis.sensitivity import SensitiveType, sensitivity
from quantlab.data import load_data
from quantlab.data.schema import DataConfig
from quantlab.models import build_model
from quantlab.numerics.dtypes import DType
from quantlab.platforms import load_platform
from quantlab.simulate import Mode, Simulator


def test_j6p_ranks_and_raises_mobilenet_v2_gemm_inputs():
    bundle = build_model("mobilenet_v2")
    data = load_data(DataConfig(name="photos", num_calib=1, num_eval=1), bundle.name)
    small = [(F.interpolate(b[0], size=(96, 96), mode="area"),) for b in data.calib + data.eval]
    calib, batches = small[:1], small[1:]
    sim = Simulator(bundle.module, load_platform("j6p"))
    sim.calibrate(calib, progress=False)
    # the activation-side passes: INPUT (the GEMMs' own int8 inputs); the ACTIVATION pass would
    # only see float16 outputs here (no int8 output to raise), so it is left out to stay quick
    ranking = sensitivity(sim, batches, kinds=["input"], metrics=["l1"], progress=False).table
    ops = sim.ops
    gemms = ops.loc[(ops.category == "GEMM") & (ops.fused_into == ""), "name"]
    inputs = ranking[ranking.sensitive_type == SensitiveType.INPUT.value]
    assert set(inputs.op_name) == set(gemms) and len(gemms) == 53
    assert set(inputs.quant_dtype) == {"INT8"} and (inputs.value > 0).all()
    outputs = set(ops.loc[ops.supported & (ops.category != "PASS_THROUGH"), "output_dtype"])
    assert outputs == {"FLOAT16", "FLOAT32"}  # no activation output is int8 on J6P
    start = run_recipe(sim, batches, ranking, RecipeTarget(min_sqnr_db=0.0), None)
    floor = start.steps[0].sqnr_db + 3.0  # a target the float16/int8 start misses
    res = run_recipe(
        sim, batches, ranking, RecipeTarget(min_sqnr_db=floor), None, steps=2, refine=0
    )
    assert res.chosen is not None and res.chosen.direction == "raise"
    raised = [n for n, k in res.chosen.raised if k is SensitiveType.INPUT]
    assert raised and len(raised) < len(gemms)
    assert all(res.chosen.spec.by_name[n].input_dtype is DType.INT16 for n in raised)
    sim.set_qconfig(res.chosen.spec)
    ops = sim.ops.set_index("name")
    assert all(ops.at[n, "input_dtype"].split(",")[0] == "INT16" for n in raised)
    assert sim.run(*batches[0], mode=Mode.FIXED).shape == (1, 1000)
    assert torch.isfinite(sim.run(*batches[0], mode=Mode.FIXED)).all()
