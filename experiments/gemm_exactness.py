"""Are quantlab's fast integer GEMM paths exact, and what do they cost?

For each shape (matmul / conv1d / conv2d), operand dtype pair and data kind (random codes, or
adversarial: all odd, near the maximum, one sign), the fast path (``int_matmul`` /
``int_conv*d``, AUTO: int32 sums of torch's int8 matrix product for int8 matmuls and 1x1
convolutions, float32 K-chunks, split halves or float64 for the others; the ``path`` column) is
compared bit for bit with the numpy int64 reference; plain float32 (no K-chunking) is compared
too, to show what the chunking buys. The exact sums then go through
the int32 accumulator contract (``accumulate`` with the configured overflow mode), counting
overflows. Times: fast path against float32 torch on the same shapes (medians), measured at a
stated thread count: ``measure`` sets torch's intra-op thread count to ``exp.threads`` for the
timed loop and restores the caller's count after (a benchmark-like measurement; quantlab's
library code never sets it).
"""

from __future__ import annotations

import enum
import math
import statistics
import time
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.nn.functional as F
from tqdm import tqdm

from quantlab.config import register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment
from quantlab.numerics import reference as ref
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import (
    FLOAT32_EXACT,
    GemmPath,
    Overflow,
    accumulate,
    int_conv1d,
    int_conv2d,
    int_matmul,
    plan_conv,
    plan_matmul,
)
from quantlab.report import Plot, PlotKind


class GemmOp(enum.Enum):
    """The product a shape describes."""

    MATMUL = "matmul"
    CONV1D = "conv1d"
    CONV2D = "conv2d"


class DataKind(enum.Enum):
    """RANDOM: uniform codes over the dtype. ADVERSARIAL: all odd, within 4 of the maximum, one
    sign per tensor, so that partial sums exceed 2**24 and stay odd (what breaks float32)."""

    RANDOM = "random"
    ADVERSARIAL = "adversarial"


@dataclass
class GemmShape:
    """One product. MATMUL: (rows, c_in) @ (c_in, c_out), K = c_in. CONV: input
    (batch, c_in, size[, size]), weight (c_out, c_in/groups, kernel[, kernel]), K =
    c_in/groups * kernel**spatial_dims."""

    op: GemmOp = GemmOp.MATMUL
    c_in: int = 64
    c_out: int = 64
    size: int = 64  # MATMUL: rows of the left operand; CONV: spatial size (H = W, or L)
    batch: int = 1
    kernel: int = 3
    groups: int = 1
    stride: int = 1
    padding: int = 0

    def __post_init__(self) -> None:
        for name in ("c_in", "c_out", "size", "batch", "kernel", "groups", "stride"):
            if getattr(self, name) < 1:
                raise ValueError(f"exp.shapes[].{name} must be >= 1, got {getattr(self, name)}")
        if self.c_in % self.groups or self.c_out % self.groups:
            raise ValueError(
                f"exp.shapes[].groups={self.groups} must divide c_in={self.c_in} and "
                f"c_out={self.c_out}"
            )
        if self.op is not GemmOp.MATMUL and self.size + 2 * self.padding < self.kernel:
            raise ValueError(
                f"exp.shapes[]: kernel {self.kernel} is larger than the padded size "
                f"{self.size + 2 * self.padding}"
            )

    @property
    def k(self) -> int:
        if self.op is GemmOp.MATMUL:
            return self.c_in
        nsp = 2 if self.op is GemmOp.CONV2D else 1
        return self.c_in // self.groups * self.kernel**nsp

    @property
    def label(self) -> str:
        if self.op is GemmOp.MATMUL:
            return f"matmul {self.size}x{self.c_in} @ {self.c_in}x{self.c_out}"
        sp = f"{self.size}x{self.size}" if self.op is GemmOp.CONV2D else f"{self.size}"
        g = f" g{self.groups}" if self.groups > 1 else ""
        return (
            f"{self.op.value} {self.batch}x{self.c_in}x{sp} k{self.kernel}{g} "
            f"s{self.stride} p{self.padding} -> {self.c_out}"
        )


def _default_shapes() -> list[GemmShape]:
    return [
        GemmShape(GemmOp.MATMUL, c_in=512, c_out=64, size=64),
        GemmShape(GemmOp.MATMUL, c_in=2048, c_out=32, size=32),
        GemmShape(GemmOp.CONV2D, c_in=32, c_out=32, size=16, padding=1),
        GemmShape(GemmOp.CONV2D, c_in=32, c_out=32, size=16, groups=32, padding=1),
        GemmShape(GemmOp.CONV2D, c_in=256, c_out=16, size=8, padding=1),
        GemmShape(GemmOp.CONV2D, c_in=1152, c_out=40, size=7, batch=2, kernel=1),
        GemmShape(GemmOp.CONV1D, c_in=64, c_out=32, size=32, batch=2, kernel=5, stride=2),
    ]


@dataclass
class GemmExactnessExp:
    """Schema of ``+exp=gemm_exactness``."""

    shapes: list[GemmShape] = field(default_factory=_default_shapes)
    x_dtypes: list[DType] = field(default_factory=lambda: [DType.INT8, DType.INT16])
    w_dtypes: list[DType] = field(default_factory=lambda: [DType.INT8, DType.INT16])
    data: list[DataKind] = field(default_factory=lambda: [DataKind.RANDOM, DataKind.ADVERSARIAL])
    overflow: Overflow = Overflow.SATURATE
    repeats: int = 5  # timed runs per measurement (median)
    threads: int = 1  # intra-op threads while timing (both paths alike)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("shapes", "x_dtypes", "w_dtypes", "data"):
            if not list(getattr(self, name)):
                raise ValueError(f"exp.{name} must not be empty")
        for name in ("x_dtypes", "w_dtypes"):
            for dt in getattr(self, name):
                if dt not in (DType.INT8, DType.INT16):
                    raise ValueError(
                        f"exp.{name} holds GEMM operand dtypes; allowed: INT8, INT16, got {dt.name}"
                    )
        if self.repeats < 1:
            raise ValueError(f"exp.repeats must be >= 1, got {self.repeats}")
        if self.threads < 1:
            raise ValueError(f"exp.threads must be >= 1, got {self.threads}")


register_schema("exp", "gemm_exactness_schema", GemmExactnessExp)


def _operands(shape: GemmShape, xd: DType, wd: DType, kind: DataKind, gen: torch.Generator):
    if shape.op is GemmOp.MATMUL:
        xs, ws = (shape.size, shape.c_in), (shape.c_in, shape.c_out)
    else:
        nsp = 2 if shape.op is GemmOp.CONV2D else 1
        xs = (shape.batch, shape.c_in) + (shape.size,) * nsp
        ws = (shape.c_out, shape.c_in // shape.groups) + (shape.kernel,) * nsp
    return _codes(xs, xd, kind, gen), _codes(ws, wd, kind, gen)


def _codes(shape, dt: DType, kind: DataKind, gen: torch.Generator) -> torch.Tensor:
    if kind is DataKind.RANDOM:
        t = torch.randint(dt.qmin, dt.qmax + 1, shape, generator=gen)
    else:
        mag = dt.qmax - 2 * torch.randint(0, 3, shape, generator=gen)
        t = mag * (int(torch.randint(0, 2, (), generator=gen)) * 2 - 1)
    return t.to(dt.torch_dtype)


def _fns(shape: GemmShape, x: torch.Tensor, w: torch.Tensor):
    """(fast exact, plain float32 on the same operands, numpy int64 reference)."""
    kw = dict(stride=shape.stride, padding=shape.padding, groups=shape.groups)
    if shape.op is GemmOp.MATMUL:
        return (
            lambda: int_matmul(x, w),
            lambda xf, wf: xf @ wf,
            lambda: ref.int_matmul(x, w),
        )
    if shape.op is GemmOp.CONV2D:
        return (
            lambda: int_conv2d(x, w, **kw),
            lambda xf, wf: F.conv2d(xf, wf, **kw),
            lambda: ref.int_conv2d(x, w, shape.stride, shape.padding, 1, shape.groups),
        )
    return (
        lambda: int_conv1d(x, w, **kw),
        lambda xf, wf: F.conv1d(xf, wf, **kw),
        lambda: ref.int_conv1d(x, w, shape.stride, shape.padding, 1, shape.groups),
    )


def _median_time(fn, repeats: int, *args) -> float:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def measure(exp: GemmExactnessExp, progress: bool = True) -> pd.DataFrame:
    """One row per (shape, x dtype, w dtype, data kind), timed at ``exp.threads`` threads: the
    process-wide intra-op thread count is set to it for this loop and restored after, also on
    an error."""
    threads = torch.get_num_threads()
    torch.set_num_threads(exp.threads)
    try:
        return _measure(exp, progress)
    finally:
        torch.set_num_threads(threads)


def _measure(exp: GemmExactnessExp, progress: bool) -> pd.DataFrame:
    gen = torch.Generator().manual_seed(exp.seed)
    cases = [
        (s, xd, wd, kind)
        for s in exp.shapes
        for xd in exp.x_dtypes
        for wd in exp.w_dtypes
        for kind in exp.data
    ]
    rows = []
    for shape, xd, wd, kind in tqdm(cases, desc="gemm_exactness", disable=not progress):
        x, w = _operands(shape, xd, wd, kind, gen)
        fast, plain, slow = _fns(shape, x, w)
        units = shape.c_in // shape.groups
        if shape.op is GemmOp.MATMUL:
            plan = plan_matmul(x, w)
        else:
            plan = plan_conv(x, w, shape.groups, stride=shape.stride, padding=shape.padding)
        t0 = time.perf_counter()
        expected = torch.from_numpy(slow())
        t_ref = time.perf_counter() - t0
        got = fast()
        xf, wf = x.to(torch.float32), w.to(torch.float32)
        naive = plain(xf, wf).to(torch.int64)
        acc32, n_over = accumulate(got, DType.INT32, exp.overflow)
        max_acc = int(expected.abs().max()) if expected.numel() else 0
        t_fast = _median_time(fast, exp.repeats)
        t_f32 = _median_time(plain, exp.repeats, xf, wf)
        f32 = plan.path in (GemmPath.FLOAT32, GemmPath.FLOAT32_SPLIT)
        n_chunks = math.ceil(units / plan.chunk) if f32 else 0
        rows.append(
            {
                "shape": shape.label,
                "op": shape.op.value,
                "K": shape.k,
                "operands": f"{xd.value} x {wd.value}",
                "data": kind.value,
                "path": plan.path.name,
                "float32_chunks": n_chunks,
                "bound_K_amax_bmax": shape.k * plan.bound,
                "outputs": expected.numel(),
                "mismatches_fast": int((got != expected).sum()),
                "mismatches_plain_float32": int((naive != expected).sum()),
                "plain_float32_wrong_pct": 100.0 * float((naive != expected).float().mean()),
                "max_abs_acc": max_acc,
                "acc_bits": max_acc.bit_length() + 1,
                "int32_overflows": n_over,
                "overflow_mode": exp.overflow.name,
                "acc_changed_by_int32": int((acc32 != got).sum()),
                "t_fast_ms": 1e3 * t_fast,
                "t_float32_ms": 1e3 * t_f32,
                "time_ratio_fast_over_float32": t_fast / t_f32 if t_f32 > 0 else float("nan"),
                "t_reference_ms": 1e3 * t_ref,
                "reference_over_fast": t_ref / t_fast if t_fast > 0 else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def _findings(df: pd.DataFrame, exp: GemmExactnessExp) -> list[str]:
    f = []
    n_bad = int((df.mismatches_fast > 0).sum())
    f.append(
        f"The fast path equals the int64 reference bit for bit in {len(df) - n_bad} of "
        f"{len(df)} cases ({int(df.mismatches_fast.sum())} differing outputs out of "
        f"{int(df.outputs.sum())})."
    )
    beyond = df[df.bound_K_amax_bmax > FLOAT32_EXACT]
    within = df[df.bound_K_amax_bmax <= FLOAT32_EXACT]
    wrong = beyond[beyond.mismatches_plain_float32 > 0]
    if len(beyond):
        worst = beyond.loc[beyond.mismatches_plain_float32.idxmax()]
        f.append(
            f"Plain float32 without K-chunking is wrong in {len(wrong)} of {len(beyond)} cases "
            f"whose bound K*max|a|*max|b| exceeds 2**24; worst: "
            f"{int(worst.mismatches_plain_float32)} of {int(worst.outputs)} outputs for "
            f"{worst['shape']} ({worst.operands}, {worst.data} data). Within the bound it is "
            f"wrong in {int((within.mismatches_plain_float32 > 0).sum())} of {len(within)} cases."
        )
    over = df[df.int32_overflows > 0]
    if len(over):
        top = over.loc[over.acc_bits.idxmax()]
        f.append(
            f"The int32 accumulator overflows in {len(over)} of {len(df)} cases "
            f"({int(over.int32_overflows.sum())} outputs, mode {exp.overflow.name}); the widest "
            f"exact sum needs {int(top.acc_bits)} bits ({top['shape']}, {top.operands}, "
            f"{top.data})."
        )
    else:
        f.append(
            f"No exact sum leaves int32 (widest: {int(df.acc_bits.max())} bits), so the "
            f"{exp.overflow.name} mode never acts here."
        )
    for ops, g in df.groupby("operands", sort=False):
        r = g.time_ratio_fast_over_float32
        f.append(
            f"{ops}: fast path / float32 time, median {r.median():.2f}x (range "
            f"{r.min():.2f}-{r.max():.2f}x); the numpy int64 reference is "
            f"{g.reference_over_fast.median():.0f}x slower than the fast path (median)."
        )
    return f


@experiment(GemmExactnessExp, "gemm_exactness")
def gemm_exactness(exp: GemmExactnessExp, ctx: RunContext) -> ExperimentResult:
    df = measure(exp, ctx.progress)
    summary = (
        df.groupby(["operands", "data"], sort=False)
        .agg(
            cases=("shape", "count"),
            mismatches_fast=("mismatches_fast", "sum"),
            mismatches_plain_float32=("mismatches_plain_float32", "sum"),
            int32_overflows=("int32_overflows", "sum"),
            median_time_ratio=("time_ratio_fast_over_float32", "median"),
        )
        .reset_index()
    )
    plots = [
        Plot(
            name="time_ratio",
            x="K",
            y="time_ratio_fast_over_float32",
            xlabel="K (terms per output)",
            ylabel="fast exact time / float32 time (x)",
            title="Cost of exactness per shape and operand dtypes",
            hue="operands",
            facet="data",
            kind=PlotKind.SCATTER,
            logx=True,
        ),
        Plot(
            name="plain_float32_errors",
            x="bound_K_amax_bmax",
            y="plain_float32_wrong_pct",
            xlabel="K * max|a| * max|b| (exactness bound; float32 is exact up to 2^24)",
            ylabel="wrong outputs of plain float32 (% of outputs)",
            title="Plain float32 without K-chunking",
            hue="operands",
            kind=PlotKind.SCATTER,
            logx=True,
        ),
    ]
    notes = [
        "Fast path (quantlab.numerics.gemm): int8 x int8 matmuls and convolutions with one "
        "group by torch's int8 matrix product with int32 sums, K <= 2^16 (INT32), the same "
        "products with int16 operands within +-32639 as their exact int8 halves "
        "(INT32_SPLIT); depthwise convolutions by a C loop with int32 sums when "
        "kh*kw*max|a|*max|b| <= 2^31 - 1 (INT32_DEPTHWISE); else float32 BLAS on K-chunks "
        "with K*max|a|*max|b| <= 2^24 summed in "
        "float64; for convolutions with int16 inputs and int8 weights the input split exactly "
        "into two int8-range halves (FLOAT32_SPLIT); else float64 when the bound 2^53 holds. "
        "The chosen path and the number of float32 chunks are columns of results.csv.",
        "Reference: numpy int64 (quantlab.numerics.reference), timed once.",
        "Plain float32: the same operands as float32 through F.conv*d / @ without chunking.",
        f"Times are medians of {exp.repeats} runs at {exp.threads} intra-op thread(s) on a "
        "shared machine; ratios are indicative. "
        "benchmarks/bench_gemm.py times large shapes.",
    ]
    return ExperimentResult(
        table=df,
        title="Exactness and cost of the integer GEMM fast paths",
        findings=_findings(df, exp),
        tables={"summary": summary},
        plots=plots,
        notes=notes,
    )
