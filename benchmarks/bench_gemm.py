"""Speed of quantlab's exact integer GEMM fast paths against float32 torch on the same shapes.

One run times, interleaved (every repeat runs every method once, so machine load hits all of
them alike), and reports medians and ratios to float32 torch:
  * float32 torch (``F.conv2d`` / ``@`` on float tensors): the baseline;
  * exact int8 x int8, int16 x int8 and int16 x int16 (``int_conv2d`` / ``int_matmul``, AUTO),
    the int16 ones on the whole int16 range and on J6's int16 operand range (|code| <= 32639,
    which the INT32_SPLIT path takes as int8 halves);
  * the full quantized op (``qconv2d`` / ``qmatmul``: exact sum + bias + requantization);
  * onnxruntime QLinearConv / QLinearMatMul on the same int8 shapes;
  * a depthwise conv2d (one input channel per group, MobileNetV2's 144 x 56 x 56 layer): float32
    torch, exact int8 x int8 and J6-range int16 x int8 (the INT32_DEPTHWISE path), qconv2d and
    onnxruntime's grouped QLinearConv;
  * the numpy int64 reference (``quantlab.numerics.reference``, the tests' oracle) and torch
    int64 kernels, timed on a reduced shape (1/16 of the MACs) and scaled linearly to the full shape
    (marked "scaled" in the table).
Exactness is checked too: every timed exact GEMM equals torch's int64 kernel on output strips,
and qconv2d / qmatmul equal onnxruntime's QLinearConv / QLinearMatMul on the whole output.

Run: .venv/bin/python benchmarks/bench_gemm.py [--threads 2 1] [--repeats 7]
Writes reports/benchmarks/gemm.json and reports/benchmarks/gemm.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform as pyplatform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from host_info import cpu_description  # noqa: E402
from ort_baseline import session  # noqa: E402

from quantlab.numerics import reference as ref  # noqa: E402
from quantlab.numerics.dtypes import DType  # noqa: E402
from quantlab.numerics.gemm import (  # noqa: E402
    GemmPath,
    int_conv2d,
    int_matmul,
    plan_conv,
    plan_matmul,
    qconv2d,
    qmatmul,
)
from quantlab.numerics.gemm.plan import INT8_HALVES_MAX  # noqa: E402
from quantlab.platforms import load_platform  # noqa: E402
from quantlab.report.io import atomic_write_text  # noqa: E402

CONV_X = (1, 256, 56, 56)
CONV_W = (256, 256, 3, 3)
CONV_X_REDUCED = (1, 256, 14, 14)  # 1/16 of the MACs
MM_A = (1024, 2048)
MM_B = (2048, 1024)
MM_A_REDUCED = (64, 2048)  # 1/16 of the MACs
DW_X = (1, 144, 56, 56)
DW_W = (144, 1, 3, 3)


J6_16x8 = "int16 in +-32639 x int8"
J6_16x16 = "int16 x int16, both in +-32639"


def _j6_range(codes: torch.Tensor) -> torch.Tensor:
    """int16 codes clamped to J6's int16 GEMM operand range (``int16_operand_max``)."""
    return codes.clamp(-INT8_HALVES_MAX, INT8_HALVES_MAX)


def _codes(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    info = torch.iinfo(dtype)
    lo = info.min + 1 if dtype == torch.int8 else info.min  # weights: [-127, 127]
    return torch.randint(lo, info.max + 1, shape, generator=g).to(dtype)


def _ort_session(op: str, threads: int, x_shape, w: np.ndarray, sw: np.ndarray, group: int = 1):
    """A one-node QLinearConv / QLinearMatMul model of int8 codes in an onnxruntime session
    (``ort_baseline.session``: ``threads`` intra-op threads, spinning off)."""
    from onnx import TensorProto, helper, numpy_helper

    def f32(v, n):
        return numpy_helper.from_array(np.asarray(v, dtype=np.float32), n)

    def i8(v, n):
        return numpy_helper.from_array(np.asarray(v, dtype=np.int8), n)

    inits = [f32(0.02, "sx"), i8(0, "zx"), i8(w, "w"), f32(sw, "sw")]
    inits += [i8(np.zeros(sw.shape), "zw"), f32(2.0, "sy"), i8(0, "zy")]
    ins = ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"]
    attrs = {"pads": [1, 1, 1, 1], "group": group} if op == "QLinearConv" else {}
    node = helper.make_node(op, ins, ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.INT8, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.INT8, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return session(model.SerializeToString(), threads)


def _methods(threads: int):
    """(op, method, operands, fn, macs, scale) for every timed method."""
    onnx_rt = load_platform("onnxruntime").gemm_contract()
    x8, w8 = _codes(CONV_X, torch.int8, 1), _codes(CONV_W, torch.int8, 2)
    x16, w16 = _codes(CONV_X, torch.int16, 3), _codes(CONV_W, torch.int16, 4)
    x16j, w16j = _j6_range(x16), _j6_range(w16)
    xf, wf = x8.float(), w8.float()
    xr = _codes(CONV_X_REDUCED, torch.int8, 5)
    sw = (torch.rand(CONV_W[0]) * 0.01 + 1e-3).float()
    conv_macs = int(np.prod(CONV_X)) * CONV_W[0] * 9
    a8, b8 = _codes(MM_A, torch.int8, 6), _codes(MM_B, torch.int8, 7)
    a16, b16 = _codes(MM_A, torch.int16, 8), _codes(MM_B, torch.int16, 9)
    a16j, b16j = _j6_range(a16), _j6_range(b16)
    af, bf = a8.float(), b8.float()
    ar = _codes(MM_A_REDUCED, torch.int8, 10)
    swm = (torch.rand(MM_B[1]) * 0.01 + 1e-3).float()
    mm_macs = MM_A[0] * MM_A[1] * MM_B[1]
    ort_conv = _ort_session("QLinearConv", threads, CONV_X, w8.numpy(), sw.numpy())
    ort_mm = _ort_session("QLinearMatMul", threads, MM_A, b8.numpy(), swm.numpy())
    x8n, a8n = x8.numpy(), a8.numpy()
    c = DW_X[1]
    xd8, wd8 = _codes(DW_X, torch.int8, 11), _codes(DW_W, torch.int8, 12)
    xd16j = _j6_range(_codes(DW_X, torch.int16, 13))
    xdf, wdf = xd8.float(), wd8.float()
    swd = (torch.rand(c) * 0.01 + 1e-3).float()
    dw_macs = int(np.prod(DW_X)) * 9
    ort_dw = _ort_session("QLinearConv", threads, DW_X, wd8.numpy(), swd.numpy(), c)
    xd8n = xd8.numpy()
    depthwise = [
        ("depthwise", "float32 torch", "float32", lambda: F.conv2d(xdf, wdf, None, 1, 1, 1, c)),
        ("depthwise", "exact", "int8 x int8", lambda: int_conv2d(xd8, wd8, 1, 1, groups=c)),
        ("depthwise", "exact", J6_16x8, lambda: int_conv2d(xd16j, wd8, 1, 1, groups=c)),
        (
            "depthwise",
            "qconv2d (exact + requant)",
            "int8 x int8",
            lambda: qconv2d(
                xd8, 0.02, wd8, swd, None, 2.0, DType.INT8, onnx_rt, padding=1, groups=c
            ),
        ),
        (
            "depthwise",
            "onnxruntime QLinearConv",
            "int8 x int8",
            lambda: ort_dw.run(None, {"x": xd8n}),
        ),
    ]
    dw_operands = (xd8, wd8, xd16j, swd, ort_dw)
    return [
        ("conv2d", "float32 torch", "float32", lambda: F.conv2d(xf, wf, padding=1), conv_macs, 1),
        ("conv2d", "exact", "int8 x int8", lambda: int_conv2d(x8, w8, padding=1), conv_macs, 1),
        ("conv2d", "exact", "int16 x int8", lambda: int_conv2d(x16, w8, padding=1), conv_macs, 1),
        ("conv2d", "exact", J6_16x8, lambda: int_conv2d(x16j, w8, padding=1), conv_macs, 1),
        ("conv2d", "exact", J6_16x16, lambda: int_conv2d(x16j, w16j, padding=1), conv_macs, 1),
        (
            "conv2d",
            "exact",
            "int16 x int16",
            lambda: int_conv2d(x16, w16, padding=1),
            conv_macs,
            1,
        ),
        (
            "conv2d",
            "qconv2d (exact + requant)",
            "int8 x int8",
            lambda: qconv2d(x8, 0.02, w8, sw, None, 2.0, DType.INT8, onnx_rt, padding=1),
            conv_macs,
            1,
        ),
        (
            "conv2d",
            "onnxruntime QLinearConv",
            "int8 x int8",
            lambda: ort_conv.run(None, {"x": x8n}),
            conv_macs,
            1,
        ),
        (
            "conv2d",
            "numpy int64 reference (scaled)",
            "int8 x int8",
            lambda: ref.int_conv2d(xr, w8, 1, 1),
            conv_macs,
            16,
        ),
        (
            "conv2d",
            "torch int64 (scaled)",
            "int8 x int8",
            lambda: int_conv2d(xr, w8, padding=1, path=GemmPath.INT64),
            conv_macs,
            16,
        ),
        ("matmul", "float32 torch", "float32", lambda: af @ bf, mm_macs, 1),
        ("matmul", "exact", "int8 x int8", lambda: int_matmul(a8, b8), mm_macs, 1),
        ("matmul", "exact", "int16 x int8", lambda: int_matmul(a16, b8), mm_macs, 1),
        ("matmul", "exact", J6_16x8, lambda: int_matmul(a16j, b8), mm_macs, 1),
        ("matmul", "exact", J6_16x16, lambda: int_matmul(a16j, b16j), mm_macs, 1),
        ("matmul", "exact", "int16 x int16", lambda: int_matmul(a16, b16), mm_macs, 1),
        (
            "matmul",
            "qmatmul (exact + requant)",
            "int8 x int8",
            lambda: qmatmul(a8, 0.02, b8, swm, None, 2.0, DType.INT8, onnx_rt),
            mm_macs,
            1,
        ),
        (
            "matmul",
            "onnxruntime QLinearMatMul",
            "int8 x int8",
            lambda: ort_mm.run(None, {"x": a8n}),
            mm_macs,
            1,
        ),
        (
            "matmul",
            "numpy int64 reference (scaled)",
            "int8 x int8",
            lambda: ref.int_matmul(ar, b8),
            mm_macs,
            16,
        ),
        (
            "matmul",
            "torch int64 (scaled)",
            "int8 x int8",
            lambda: int_matmul(ar, b8, GemmPath.INT64),
            mm_macs,
            16,
        ),
        *[(*m, dw_macs, 1) for m in depthwise],
    ], ((x8, w8, x16, w16, a8, b8, a16, b16, sw, swm, onnx_rt), (ort_conv, ort_mm), dw_operands)


def _int64_conv_rows(x: torch.Tensor, w: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    """Output rows [r0, r1) of conv2d(x, w, padding=1) with torch's int64 kernel (exact)."""
    xp = F.pad(x.to(torch.int64), (1, 1, 1, 1))
    return F.conv2d(xp[:, :, r0 : r1 + 2], w.to(torch.int64))


def _check_exact(ops, sessions, depthwise) -> dict[str, bool]:
    """Every timed fast result against an independent exact computation: torch int64 kernels
    on output strips (first, middle and last rows; the whole shape in int64 is too slow; the
    depthwise convolution whole), and the quantized ops against onnxruntime's QLinear ops on
    the whole output."""
    x8, w8, x16, w16, a8, b8, a16, b16, sw, swm, onnx_rt = ops
    ort_conv, ort_mm = sessions
    xd8, wd8, xd16j, swd, ort_dw = depthwise
    h = CONV_X[2]
    strips = [(0, 4), (h // 2 - 2, h // 2 + 2), (h - 4, h)]
    checks = {}
    for name, (x, w) in {
        "int8 x int8": (x8, w8),
        "int16 x int8": (x16, w8),
        "int16 x int16": (x16, w16),
        J6_16x8: (_j6_range(x16), w8),
        J6_16x16: (_j6_range(x16), _j6_range(w16)),
    }.items():
        path = plan_conv(x, w, padding=1).path.name
        fast = int_conv2d(x, w, padding=1)
        ok = all(
            torch.equal(fast[:, :, r0:r1], _int64_conv_rows(x, w, r0, r1)) for r0, r1 in strips
        )
        checks[f"conv2d {name} ({path}) == torch int64, rows {strips}"] = ok
    rows = [slice(0, 64), slice(MM_A[0] - 64, MM_A[0])]
    for name, (a, b) in {
        "int8 x int8": (a8, b8),
        "int16 x int8": (a16, b8),
        "int16 x int16": (a16, b16),
        J6_16x8: (_j6_range(a16), b8),
        J6_16x16: (_j6_range(a16), _j6_range(b16)),
    }.items():
        path = plan_matmul(a, b).path.name
        fast = int_matmul(a, b)
        ok = all(torch.equal(fast[r], a[r].to(torch.int64) @ b.to(torch.int64)) for r in rows)
        checks[f"matmul {name} ({path}) == torch int64, rows 0-63 and last 64"] = ok
    yq, _ = qconv2d(x8, 0.02, w8, sw, None, 2.0, DType.INT8, onnx_rt, padding=1)
    (y_ort,) = ort_conv.run(None, {"x": x8.numpy()})
    checks["qconv2d == onnxruntime QLinearConv (whole output)"] = bool(
        np.array_equal(yq.numpy(), y_ort)
    )
    yq, _ = qmatmul(a8, 0.02, b8, swm, None, 2.0, DType.INT8, onnx_rt)
    (y_ort,) = ort_mm.run(None, {"x": a8.numpy()})
    checks["qmatmul == onnxruntime QLinearMatMul (whole output)"] = bool(
        np.array_equal(yq.numpy(), y_ort)
    )
    c = DW_X[1]
    for name, x in {"int8 x int8": xd8, J6_16x8: xd16j}.items():
        path = plan_conv(x, wd8, c, padding=1).path.name
        fast = int_conv2d(x, wd8, 1, 1, groups=c)
        int64 = F.conv2d(x.to(torch.int64), wd8.to(torch.int64), None, 1, 1, 1, c)
        checks[f"depthwise {name} ({path}) == torch int64 (whole output)"] = torch.equal(
            fast, int64
        )
    yq, _ = qconv2d(xd8, 0.02, wd8, swd, None, 2.0, DType.INT8, onnx_rt, padding=1, groups=c)
    (y_ort,) = ort_dw.run(None, {"x": xd8.numpy()})
    checks["depthwise qconv2d == onnxruntime QLinearConv group 144 (whole output)"] = bool(
        np.array_equal(yq.numpy(), y_ort)
    )
    return checks


def _time_all(threads: int, repeats: int) -> tuple[list[dict], tuple]:
    """Median time of every method at ``threads`` intra-op threads (interleaved repeats)."""
    torch.set_num_threads(threads)
    methods, operands = _methods(threads)
    for _op, _m, _d, fn, _macs, scale in methods:  # warm-up (and the exactness self-test)
        if scale == 1:
            fn()
    times: dict[int, list[float]] = {i: [] for i in range(len(methods))}
    for r in range(repeats):
        for i, (_op, _m, _d, fn, _macs, scale) in enumerate(methods):
            if scale != 1 and r >= 3:  # the slow int64 paths: three repeats are enough
                continue
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    rows, base = [], {}
    for i, (op, method, dtypes, _fn, macs, scale) in enumerate(methods):
        med = statistics.median(times[i]) * scale
        if method == "float32 torch":
            base[op] = med
        rows.append(
            {
                "threads": threads,
                "op": op,
                "method": method,
                "operands": dtypes,
                "gmac": round(macs / 1e9, 3),
                "median_s": med,
                "runs": len(times[i]),
                "scaled_from_reduced_shape": scale != 1,
            }
        )
    for row in rows:
        row["ratio_vs_float32"] = row["median_s"] / base[row["op"]]
    return rows, operands


def _targets(rows: list[dict]) -> tuple[dict[str, bool], dict[str, float]]:
    by = {(r["op"], r["method"], r["operands"]): r for r in rows}
    ops = ("conv2d", "matmul")
    ref_speedup = {
        f"{op} vs {slow}": by[(op, slow, "int8 x int8")]["median_s"]
        / by[(op, "exact", "int8 x int8")]["median_s"]
        for op in ops
        for slow in ("numpy int64 reference (scaled)", "torch int64 (scaled)")
    }
    targets = {
        "int8 exact <= 1.5x float32": all(
            by[(op, "exact", "int8 x int8")]["ratio_vs_float32"] <= 1.5 for op in ops
        ),
        "int16 exact <= 2.5x float32": all(
            by[(op, "exact", d)]["ratio_vs_float32"] <= 2.5
            for op in ops
            for d in ("int16 x int8", "int16 x int16")
        ),
        ">= 50x faster than the numpy int64 reference (quantlab.numerics.reference)": all(
            v >= 50 for k, v in ref_speedup.items() if "numpy" in k
        ),
        ">= 50x faster than torch int64": all(
            v >= 50 for k, v in ref_speedup.items() if "torch" in k
        ),
    }
    return targets, ref_speedup


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "reports" / "benchmarks"))
    args = ap.parse_args(argv)
    load_before = os.getloadavg()[0]
    runs = []
    operands = None
    for threads in args.threads:
        rows, operands = _time_all(threads, args.repeats)
        targets, ref_speedup = _targets(rows)
        runs.append(
            {
                "threads": threads,
                "rows": rows,
                "int64_reference_over_exact_int8": ref_speedup,
                "targets_met": targets,
            }
        )
    load_after = os.getloadavg()[0]
    result = {
        "shapes": {
            "conv2d": f"x {CONV_X} * w {CONV_W}, pad 1 (K = 2304)",
            "matmul": f"{MM_A} @ {MM_B} (K = 2048)",
            "depthwise": f"x {DW_X} * w {DW_W}, pad 1, groups {DW_X[1]} (K = 9)",
            "reduced (reference)": f"conv x {CONV_X_REDUCED}; matmul a {MM_A_REDUCED}",
        },
        "repeats": args.repeats,
        "load_average_1min": [round(load_before, 2), round(load_after, 2)],
        "cpu_count": os.cpu_count(),
        "cpu": cpu_description(),
        "torch": torch.__version__,
        "python": pyplatform.python_version(),
        "runs": runs,
        "exactness": _check_exact(*operands),
        "command": ".venv/bin/python benchmarks/bench_gemm.py --threads "
        + " ".join(str(t) for t in args.threads)
        + f" --repeats {args.repeats}",
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "gemm.json", json.dumps(result, indent=2) + "\n")
    md = _markdown(result)
    atomic_write_text(out / "gemm.md", md)
    print(md)
    return 0 if all(result["exactness"].values()) else 1


def _markdown(res: dict) -> str:
    lines = [
        "# Exact integer GEMM: speed against float32 torch",
        "",
        f"Shapes: conv2d {res['shapes']['conv2d']}; matmul {res['shapes']['matmul']}; "
        f"depthwise {res['shapes']['depthwise']}. "
        f"Median of {res['repeats']} interleaved runs (3 for the int64 paths), torch "
        f"{res['torch']}, {res['cpu']}, {res['cpu_count']} CPUs, 1-minute load average "
        f"{res['load_average_1min'][0]} before / {res['load_average_1min'][1]} after. "
        "onnxruntime runs each one-node model with the run's intra-op threads and "
        "`session.intra_op.allow_spinning` = 0 (an idle worker sleeps instead of spinning "
        "into the next timing). "
        "On a shared machine absolute times are noisy; ratios within one run less so, but "
        "extra parallel regions (chunks, conversions) pay for every thread wake-up when the "
        "machine is oversubscribed.",
        "",
    ]
    for run in res["runs"]:
        lines += [
            f"## {run['threads']} thread(s)",
            "",
            "| op | method | operands | GMAC | median (s) | x float32 |",
            "|---|---|---|---|---|---|",
        ]
        for r in run["rows"]:
            note = " (scaled from 1/16 shape)" if r["scaled_from_reduced_shape"] else ""
            lines.append(
                f"| {r['op']} | {r['method']}{note} | {r['operands']} | {r['gmac']} | "
                f"{r['median_s']:.4f} | {r['ratio_vs_float32']:.2f} |"
            )
        lines += ["", "Slow int64 time / exact int8 time:"]
        lines += [f"- {op}: {v:.0f}x" for op, v in run["int64_reference_over_exact_int8"].items()]
        lines += ["", "Targets:"]
        lines += [f"- {k}: {'met' if v else 'NOT met'}" for k, v in run["targets_met"].items()]
        lines.append("")
    lines += ["Exactness checks (bit for bit, against an independent exact computation):"]
    lines += [f"- {k}: {v}" for k, v in res["exactness"].items()]
    lines += [
        "",
        f"Reproduce: `{res['command']}`",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
