"""How far onnxruntime running quantlab's exported QDQ model is from quantlab's fixed mode.

``measure(sim, inputs, folder, encoding)`` exports the model, runs it in onnxruntime, runs
quantlab fixed mode on the same inputs and compares the outputs (values and output LSBs). A
second export exposes every op's output tensor as a graph output; comparing them op by op in
execution order finds the first op whose output differs, with the onnxruntime kernel that
computed it (from the optimized graph onnxruntime saves).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.utils._pytree import tree_flatten

from quantlab.export import ActivationEncoding, to_onnx_qdq
from quantlab.export import runtime as R
from quantlab.simulate import Mode
from quantlab.simulate.qtensor import values_hold


@dataclass
class Fidelity:
    """One model's comparison: ``summary`` (one row's values) and ``per_op`` (one row per
    captured op in execution order)."""

    summary: dict
    per_op: pd.DataFrame
    kernels: dict  # onnxruntime node counts of the optimized plain graph


def _quantlab_output(trace, name: str):
    """(value, QInfo of its integer grid or None) of op ``name``'s first output in a fixed-mode
    trace; (None, None) where it is no tensor."""
    info = trace.qinfo.get(name)
    value = trace.outputs.get(name)
    if isinstance(info, list):
        info = info[0] if info else None
    if isinstance(value, (tuple, list)):
        value = value[0]
    if not isinstance(value, torch.Tensor):
        return None, None
    if info is not None and info.dtype.is_int and info.scale is not None:
        return value, info
    return value, None


def _runtime_values(codes: np.ndarray, q, offset: bool) -> np.ndarray:
    """float32 values (codes - zero point) * scale of a runtime codes tensor that quantlab holds
    as float values (an op with no node of its own, such as an eval-mode dropout, passing its
    quantized input on)."""
    c = R.codes_from_runtime(codes, offset) - q.zero_point
    return c.astype(np.float32) * np.asarray(q.scale, np.float32)


def value_gap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in float64, 0 where both hold the same value: equal infinities (a -inf attention
    mask) and two NaNs; inf where only one is infinite or NaN."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):
        gap = np.abs(a - b)
    return np.where(same, 0.0, np.where(np.isnan(gap), np.inf, gap))


def _compare_outputs(ort_out: list, ql_out: list, scales: list) -> dict:
    compared = differing = 0
    max_lsb, max_abs = 0.0, 0.0
    for a, b, s in zip(ort_out, ql_out, scales):
        d = value_gap(a, b.detach().numpy())
        compared += d.size
        differing += int((d != 0).sum())
        max_abs = max(max_abs, float(d.max(initial=0.0)))
        if s is not None:
            lsb = d / np.asarray(s, np.float64)  # shaped to broadcast (QDQExport)
            max_lsb = max(max_lsb, float(lsb.max(initial=0.0)))
        else:
            max_lsb = float("nan")
    return {
        "outputs_compared": compared,
        "outputs_differing": differing,
        "max_diff_lsb": max_lsb,
        "max_abs_diff": max_abs,
    }


def _per_op(sim, inputs, encoding, folder: Path, trace) -> tuple[pd.DataFrame, bool]:
    probe_path = folder / "probe.onnx"
    info = to_onnx_qdq(sim, probe_path, inputs, probe=True, encoding=encoding)
    opt = folder / "probe_optimized.onnx"
    sess = R.session(probe_path, opt)
    names = info.probe_outputs
    values = dict(zip(names, R.run(sess, info.input_names, inputs, names)))
    order = list(trace.order)
    kernels = R.kernels_by_op(opt, order)
    ops = sim.ops.set_index("name")
    rows = []
    for k, name in enumerate(order):
        tensor = info.op_tensors.get(name)
        value, grid = _quantlab_output(trace, name)
        row = {
            "order": k,
            "name": name,
            "op_type": ops.loc[name, "op_type"] if name in ops.index else "",
            "ort_kernel": "+".join(kernels.get(name, [])) or "(no node)",
            "computes_float": R.computes_in_float(kernels.get(name, [])),
            "elements": 0,
            "differing": 0,
            "differing_share": 0.0,
            "max_diff_lsb": 0.0,
        }
        if tensor in values and value is not None:
            v = values[tensor]
            # codes where quantlab's output has a grid, unless the export passes a float value
            # on here (the op keeps no grid of its own in onnxruntime): then the values, or,
            # where quantlab's value already lies on its grid (the quantization onnxruntime
            # applies to that float after it, as at a float op before an eval-mode dropout),
            # the codes of onnxruntime's float on that grid
            passed_float = tensor not in info.tensor_quant and v.dtype.kind == "f"
            quantized_here = passed_float and grid is not None and values_hold(value, grid)
            is_codes = grid is not None and (not passed_float or quantized_here)
            ql = grid.codes_of(value).numpy() if is_codes else value.detach().numpy()
            if quantized_here:  # as the profile quantizes (onnxruntime's QuantizeLinear)
                q = sim.platform.quantize_codes(
                    torch.from_numpy(v), grid.scale, grid.dtype, grid.zero_point
                )
                v = q.to(torch.int64).numpy()
            elif is_codes:
                v = R.codes_from_runtime(v, tensor in info.offset_tensors)
            elif tensor in info.tensor_quant and np.issubdtype(v.dtype, np.integer):
                v = _runtime_values(v, info.tensor_quant[tensor], tensor in info.offset_tensors)
            if v.shape != ql.shape and v.size == ql.size:
                v = v.reshape(ql.shape)
            if v.shape == ql.shape:
                d = value_gap(v, ql)
                row["elements"] = int(d.size)
                row["differing"] = int((d != 0).sum())
                row["differing_share"] = row["differing"] / max(d.size, 1)
                row["max_diff_lsb"] = float(d.max(initial=0.0)) if is_codes else float("nan")
        rows.append(row)
    return pd.DataFrame(rows), opt


def measure(sim, inputs: tuple, folder: Path, stem: str, encoding: ActivationEncoding) -> Fidelity:
    """Export ``sim`` to ``folder/<stem>.onnx`` and compare onnxruntime with quantlab's fixed
    mode on ``inputs`` (see the module docstring)."""
    folder = Path(folder)
    path = folder / f"{stem}.onnx"
    info = to_onnx_qdq(sim, path, inputs, encoding=encoding)
    with tempfile.TemporaryDirectory() as tmp:
        opt = Path(tmp) / "optimized.onnx"
        sess = R.session(path, opt)
        ort_out = R.run(sess, info.input_names, inputs, info.output_names)
        kernels = R.kernel_counts(opt)
        trace = sim.trace(*inputs, mode=Mode.FIXED)
        ql_out = [t for t in tree_flatten(trace.result)[0] if isinstance(t, torch.Tensor)]
        summary = _compare_outputs(ort_out, ql_out, info.output_scales)
        per_op, probe_opt = _per_op(sim, inputs, encoding, Path(tmp), trace)
        probe_kernels = R.kernel_counts(probe_opt)
    summary["probe_kernels_match"] = _same_compute(kernels, probe_kernels)
    diff = per_op[per_op.differing > 0]
    if len(diff):
        first = diff.iloc[0]
        summary.update(
            first_diverging_op=first["name"],
            first_diverging_type=first["op_type"],
            first_diverging_kernel=first["ort_kernel"],
            first_diverging_order=int(first["order"]),
        )
    else:
        summary.update(
            first_diverging_op="",
            first_diverging_type="",
            first_diverging_kernel="",
            first_diverging_order=-1,
        )
    summary["onnx_file"] = path.name
    return Fidelity(summary, per_op, kernels)


def _same_compute(a: dict, b: dict) -> bool:
    """Whether two optimized graphs run the same computing kernels (Q/DQ, data movement and
    layout variants left out: the probe graph only exposes more tensors)."""

    def computing(counts: dict) -> dict:
        out: dict = {}
        for k, v in counts.items():
            k = k.removeprefix("Nhwc")
            if k in ("QuantizeLinear", "DequantizeLinear") or k in R.MOVING_KERNELS:
                continue
            out[k] = out.get(k, 0) + v
        return out

    return computing(a) == computing(b)


def float_islands(per_op: pd.DataFrame) -> pd.DataFrame:
    """Per op family and onnxruntime kernel: ops, whether onnxruntime computes them in float32
    between Dequantize and Quantize, ops whose output differs and differing elements."""
    return (
        per_op.groupby(["op_type", "ort_kernel", "computes_float"], sort=False)
        .agg(
            ops=("name", "size"),
            ops_differing=("differing", lambda v: int((v > 0).sum())),
            differing_elements=("differing", "sum"),
            elements=("elements", "sum"),
            max_diff_lsb=("max_diff_lsb", "max"),
        )
        .reset_index()
    )
