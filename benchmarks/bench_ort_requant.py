"""What J6's requantization would cost inside onnxruntime: QLinearConv against the cheapest
integer-operator form of a per-channel multiply-and-shift requantization, on MobileNetV2's
convolution shapes.

onnxruntime's QLinearConv rescales its int32 sums by a float32 multiplier and rounds half to
even; J6 multiplies by an integer per channel, adds half and shifts (half up), so QLinearConv
cannot give J6's codes and quantlab computes them itself. The only exact way to run J6's
numerics in onnxruntime is to write the requantization in integer operators after
ConvInteger's int32 sums. The form timed here, ConvInteger -> Cast(int64) -> Mul(M) ->
Add(2**(s-1)) -> Div(2**s) -> Clip -> Cast(int8), is cheaper than an exact one (ONNX's integer
Div truncates toward zero, so the floor of a negative sum needs more operators): a lower bound
of what an exact export would cost. Each layer is one InferenceSession per form, 2 intra-op
threads, ``session.intra_op.allow_spinning`` = 0, medians of interleaved runs, each timed run
after 3 untimed ones of the same session.

Run: ``.venv/bin/python benchmarks/bench_ort_requant.py``; writes
``reports/benchmarks/ort_requant.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from host_info import cpu_description, shown_path  # noqa: E402
from ort_baseline import session  # noqa: E402

from quantlab.report.io import atomic_write_text  # noqa: E402

OUT = ROOT / "reports" / "benchmarks"
# MobileNetV2's convolutions at 224x224: (name, in channels, out channels, kernel, stride,
# input size, groups)
LAYERS = [
    ("features.0 (stem)", 3, 32, 3, 2, 224, 1),
    ("features.2 depthwise", 96, 96, 3, 2, 112, 96),
    ("features.3 expand", 24, 144, 1, 1, 56, 1),
    ("features.3 depthwise", 144, 144, 3, 1, 56, 144),
    ("features.3 project", 144, 24, 1, 1, 56, 1),
    ("features.14 expand", 96, 576, 1, 1, 14, 1),
    ("features.17 project", 960, 320, 1, 1, 7, 1),
]


def _session(model, threads: int) -> ort.InferenceSession:
    return session(model.SerializeToString(), threads)


def _models(cin: int, cout: int, k: int, stride: int, size: int, groups: int):
    """(QLinearConv model, ConvInteger + integer requantization model) of one layer, uint8
    input, int8 weights per output channel."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (cout, cin // groups, k, k)).astype(np.int8)
    out = (size + 2 * (k // 2) - k) // stride + 1
    attrs = dict(group=groups, pads=[k // 2] * 4, kernel_shape=[k, k], strides=[stride] * 2)
    x = helper.make_tensor_value_info("x", TensorProto.UINT8, [1, cin, size, size])
    opset = [helper.make_opsetid("", 13)]

    def const(name, value):
        return numpy_helper.from_array(np.asarray(value), name)

    q_inits = [const("w", w), const("xs", np.float32(0.02)), const("xz", np.uint8(128))]
    q_inits += [const("ws", np.full(cout, 0.01, np.float32)), const("wz", np.zeros(cout, np.int8))]
    q_inits += [const("ys", np.float32(0.05)), const("yz", np.uint8(128))]
    q_in = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    y = helper.make_tensor_value_info("y", TensorProto.UINT8, [1, cout, out, out])
    qlinear = helper.make_model(
        helper.make_graph(
            [helper.make_node("QLinearConv", q_in, ["y"], **attrs)], "q", [x], [y], q_inits
        ),
        opset_imports=opset,
    )
    m = rng.integers(1 << 14, 1 << 15, (1, cout, 1, 1)).astype(np.int64)  # per channel
    i_inits = [const("w", w), const("xz", np.uint8(128)), const("m", m)]
    i_inits += [const("half", np.int64(1 << 20)), const("unit", np.int64(1 << 21))]
    i_inits += [const("lo", np.int64(-128)), const("hi", np.int64(127))]
    nodes = [
        helper.make_node("ConvInteger", ["x", "w", "xz"], ["acc"], **attrs),
        helper.make_node("Cast", ["acc"], ["a64"], to=TensorProto.INT64),
        helper.make_node("Mul", ["a64", "m"], ["p"]),
        helper.make_node("Add", ["p", "half"], ["ph"]),
        helper.make_node("Div", ["ph", "unit"], ["q"]),
        helper.make_node("Clip", ["q", "lo", "hi"], ["qc"]),
        helper.make_node("Cast", ["qc"], ["y"], to=TensorProto.INT8),
    ]
    yi = helper.make_tensor_value_info("y", TensorProto.INT8, [1, cout, out, out])
    integer = helper.make_model(
        helper.make_graph(nodes, "i", [x], [yi], i_inits), opset_imports=opset
    )
    return qlinear, integer


def time_layer(layer: tuple, threads: int, rounds: int) -> dict:
    name, cin, cout, k, stride, size, groups = layer
    forms = _models(cin, cout, k, stride, size, groups)
    sessions = {f: _session(mdl, threads) for f, mdl in zip(("qlinear", "integer"), forms)}
    x = np.random.default_rng(1).integers(0, 256, (1, cin, size, size)).astype(np.uint8)
    times: dict[str, list[float]] = {f: [] for f in sessions}
    for i in range(rounds):
        order = list(sessions) if i % 2 == 0 else list(sessions)[::-1]
        for f in order:
            s = sessions[f]
            for _ in range(3):
                s.run(None, {"x": x})
            t = time.perf_counter()
            s.run(None, {"x": x})
            times[f].append(time.perf_counter() - t)
    q, i = (statistics.median(times[f]) * 1e6 for f in ("qlinear", "integer"))
    shape = f"{cin}->{cout}, {k}x{k}/{stride}, {size}x{size}" + (
        f", groups {groups}" if groups > 1 else ""
    )
    return {"layer": name, "shape": shape, "qlinearconv_us": q, "integer_us": i, "ratio": i / q}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    rows = []
    for layer in LAYERS:
        print(f"timing {layer[0]} ...", flush=True)
        rows.append(time_layer(layer, args.threads, args.rounds))
    q_sum = sum(r["qlinearconv_us"] for r in rows)
    i_sum = sum(r["integer_us"] for r in rows)
    command = "python benchmarks/bench_ort_requant.py" + (
        f" --out {shown_path(args.out)}" if args.out.resolve() != OUT.resolve() else ""
    )
    meta = {
        "command": command,
        "threads": args.threads,
        "rounds": args.rounds,
        "load_average_1_5_15_before": [round(v, 2) for v in load],
        "onnxruntime": ort.__version__,
        "cpu": cpu_description(),
    }
    md = [
        "# J6's requantization in onnxruntime's integer operators, against QLinearConv",
        "",
        f"Reproduce: `{command}`. onnxruntime {ort.__version__}, {args.threads} intra-op "
        f"threads, spinning off; medians of {args.rounds} interleaved runs per form (each "
        "after 3 untimed runs of its session). Load average (1, 5, 15 min) "
        f"{meta['load_average_1_5_15_before']} before.",
        "",
        f"CPU: {meta['cpu']}.",
        "",
        "QLinearConv rescales by a float32 multiplier with half-to-even rounding, so it cannot "
        "give J6's codes (an integer multiplier per channel, add half, shift: half up). The "
        "integer form is ConvInteger, then Cast(int64), Mul, Add, Div, Clip, Cast(int8): "
        "cheaper than an exact form (ONNX's integer Div truncates toward zero; the floor of a "
        "negative sum needs more operators), so its time is a lower bound of what running J6's "
        "numerics in onnxruntime would cost.",
        "",
        "| layer | shape | QLinearConv (us) | integer form (us) | integer / QLinearConv |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        md.append(
            f"| {r['layer']} | {r['shape']} | {r['qlinearconv_us']:.0f} | "
            f"{r['integer_us']:.0f} | {r['ratio']:.2f} |"
        )
    md.append(f"| **these layers** | | {q_sum:.0f} | {i_sum:.0f} | **{i_sum / q_sum:.2f}** |")
    md.append("")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"meta": meta, "layers": rows, "total_ratio": i_sum / q_sum}
    atomic_write_text(args.out / "ort_requant.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(args.out / "ort_requant.md", "\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
