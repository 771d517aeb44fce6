"""Does each runtime profile give its runtime's bits? Profiles x runtimes on one-op models.

The seeded one-op cases of the runtime tests (``tests/runtime``: CONV_2D, DEPTHWISE_CONV_2D,
TRANSPOSE_CONV, FULLY_CONNECTED, ADD, SUB, LOGISTIC, TANH, RESIZE_BILINEAR,
RESIZE_NEAREST_NEIGHBOR, QUANTIZE of float32 values; int8 with nonzero
zero points and 16x8 or int16; onnxruntime QLinearConv and QLinearMatMul with uint8 / int8
activations and nonzero zero points, QuantizeLinear to uint8, int8 and int16 (near-ties, NaN,
infinities, values beyond the int32 range), and every table op the exporter writes
(``ort_lut_models.OPS``: Sigmoid, Tanh, Exp, ..., HardSigmoid, HardSwish, LeakyRelu, Elu,
Softplus) between DequantizeLinear and QuantizeLinear on every 8-bit code) run in the real
runtime (LiteRT's reference kernels, LiteRT's default interpreter with XNNPACK, onnxruntime) and
through quantlab's public numerics under each named profile
(``tests/runtime/quantlab_bridge.py``); a row counts the outputs compared and those that differ.
The case generators and model builders are the tests' own, so the report measures what the tests
check.

LiteRT's default interpreter runs an op that XNNPACK declines with its own builtin kernel:
XNNPACK declines an int8 TRANSPOSE_CONV with SAME padding and a kernel smaller than the stride,
and LiteRT's kernel requantizes those cases by the ``tflite`` rule, so the ``litert_xnnpack``
profile misses some of their outputs. The run reports whether XNNPACK took the op; the findings
count the declined cases and where the differing outputs are.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from quantlab.config import register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment
from quantlab.export.ort_host import onnxruntime_profile
from quantlab.platforms import load_platform
from quantlab.report import Plot, PlotKind

RUNTIME_TESTS = Path(__file__).resolve().parent.parent / "tests" / "runtime"


class Runtime(enum.Enum):
    """LITERT_REFERENCE: LiteRT single-threaded with OpResolverType.BUILTIN_REF.
    LITERT_DEFAULT: a plain LiteRT Interpreter (XNNPACK takes the int8 ops it supports,
    LiteRT's builtin kernels run the others).
    ONNXRUNTIME: onnxruntime CPU, one thread, graph optimizations off (QLinear ops) or on
    (the LUT ops, so that Sigmoid becomes QLinearSigmoid)."""

    LITERT_REFERENCE = "litert_reference"
    LITERT_DEFAULT = "litert_default"
    ONNXRUNTIME = "onnxruntime"


@dataclass
class RuntimeFidelityExp:
    """Schema of ``+exp=runtime_fidelity``."""

    runtimes: list[Runtime] = field(default_factory=lambda: list(Runtime))
    profiles: list[str] = field(
        default_factory=lambda: ["tflite", "litert_xnnpack", "onnxruntime", "onnxruntime_no_vnni"]
    )
    cases: int = 300  # seeded cases per op family and dtype

    def __post_init__(self) -> None:
        if self.cases < 1:
            raise ValueError(f"exp.cases must be >= 1, got {self.cases}")
        for name in ("runtimes", "profiles"):
            if not list(getattr(self, name)):
                raise ValueError(f"exp.{name} must not be empty")
        for p in self.profiles:
            load_platform(p)  # a clear error naming the allowed platforms


register_schema("exp", "runtime_fidelity_schema", RuntimeFidelityExp)


@dataclass(frozen=True)
class Family:
    """One op family and dtype of one runtime: cases, the runtime's output, quantlab's."""

    runtime: Runtime
    op: str
    dtype: str
    make: object  # seed -> case
    run: object  # case -> runtime output codes, or LiteRT's RunResult (codes, delegated)
    ours: object  # (case, platform) -> quantlab output codes
    platform_fields: tuple = ()  # (field, value) the model sets on every profile (bias dtype)
    declined_when: str = ""  # LITERT_DEFAULT: the cases XNNPACK declines, for the findings


def _modules():
    if str(RUNTIME_TESTS) not in sys.path:
        sys.path.insert(0, str(RUNTIME_TESTS))
    import litert_cases
    import litert_models
    import quantlab_bridge

    return litert_cases, litert_models, quantlab_bridge


def _litert_families(runtime: Runtime) -> list[Family]:
    C, L, B = _modules()
    kernels = L.Kernels.REFERENCE if runtime is Runtime.LITERT_REFERENCE else L.Kernels.DEFAULT
    i8, i16, i32, i64 = np.int8, np.int16, np.int32, np.int64

    def conv(c):
        return L.run(L.conv2d_model(c), [c.x], kernels)

    def transpose_conv(bias_type=None):
        return lambda c: L.run(L.transpose_conv_model(c, bias_type), [c.x], kernels)

    def fc(c):
        return L.run(L.fully_connected_model(c), [c.x], kernels)

    def add(c):
        return L.run(L.add_model(c), [c.a, c.b], kernels)

    def sub(c):
        return L.run(L.sub_model(c), [c.a, c.b], kernels)

    def lut(c):
        return L.run(L.lut_model(c), [c.x], kernels)

    def resize(c):
        return L.run(L.resize_model(c), [c.x], kernels)

    rows = [
        ("CONV_2D", "int8", lambda s: C.conv_case(s, False, i8, i32), conv, B.litert_conv),
        ("DEPTHWISE_CONV_2D", "int8", lambda s: C.conv_case(s, True, i8, i32), conv, B.litert_conv),
        (
            "TRANSPOSE_CONV",
            "int8",
            lambda s: C.transpose_conv_case(s, i8, i32),
            transpose_conv(),
            B.litert_transpose_conv,
        ),
        (
            "FULLY_CONNECTED",
            "int8",
            lambda s: C.fully_connected_case(s, i8, i32, s % 2 == 0),
            fc,
            B.litert_fully_connected,
        ),
        ("ADD", "int8", lambda s: C.add_case(s, i8), add, B.litert_add),
        ("SUB", "int8", lambda s: C.add_case(s, i8), sub, B.litert_sub),
        ("LOGISTIC", "int8", lambda s: C.lut_case(s, "sigmoid"), lut, B.litert_lut),
        ("TANH", "int8", lambda s: C.lut_case(s, "tanh"), lut, B.litert_lut),
    ]
    if runtime is Runtime.LITERT_REFERENCE:  # XNNPACK does not take 16x8 ops
        # DEPTHWISE_CONV_2D 16x8 has an int64-bias kernel only (LiteRT refuses an int32 bias)
        for op, dw, bias, bias_dt in (
            ("CONV_2D", False, "int64 bias", i64),
            ("DEPTHWISE_CONV_2D", True, "int64 bias", i64),
            ("CONV_2D", False, "int32 bias", i32),
        ):
            rows.append((op, f"16x8 {bias}", _conv_case(C, dw, bias_dt), conv, B.litert_conv))
        # int32 bias: the options say quantized_bias_type=INT32 also on the cases without a bias
        for bias, bias_dt, option in (("int64 bias", i64, None), ("int32 bias", i32, i32)):
            rows.append(
                (
                    "TRANSPOSE_CONV",
                    f"16x8 {bias}",
                    lambda s, b=bias_dt: C.transpose_conv_case(s, i16, b),
                    transpose_conv(option),
                    B.litert_transpose_conv,
                )
            )
        for bias, bias_dt in (("int64 bias", i64), ("int32 bias", i32)):
            rows.append(
                (
                    "FULLY_CONNECTED",
                    f"16x8 {bias}",
                    lambda s, b=bias_dt: C.fully_connected_case(s, i16, b, s % 2 == 0),
                    fc,
                    B.litert_fully_connected,
                )
            )
        rows.append(("ADD", "int16", lambda s: C.add_case(s, i16), add, B.litert_add))
        rows.append(("SUB", "int16", lambda s: C.add_case(s, i16), sub, B.litert_sub))
    # the default interpreter: XNNPACK resizes int8 codes bilinearly, LiteRT's own kernels do
    # the rest (XNNPACK takes no nearest resize)
    for op, nearest in (("RESIZE_BILINEAR", False), ("RESIZE_NEAREST_NEIGHBOR", True)):
        for act, dt in (("int8", i8), ("int16", i16)):
            rows.append((op, act, lambda s, d=dt, n=nearest: C.resize_case(s, d, n), resize,
                         B.litert_resize))  # fmt: skip

    def quantize(c):
        return L.run(L.quantize_model(c), [c.x], kernels)

    # float32 -> codes: the model's input and every float island (XNNPACK takes 8-bit QUANTIZE,
    # LiteRT's own kernel int16)
    for name, dt in (("int8", i8), ("int16", i16)):
        rows.append(("QUANTIZE", name, lambda s, d=dt: C.quantize_case(s, d), quantize,
                     B.quantize_case_codes))  # fmt: skip
    declined = {"TRANSPOSE_CONV": "SAME padding with a kernel smaller than the stride"}
    return [
        Family(
            runtime,
            *r,
            platform_fields=_bias_fields(r[1]),
            declined_when=declined.get(r[0], "") if runtime is Runtime.LITERT_DEFAULT else "",
        )
        for r in rows
    ]


def _conv_case(C, depthwise: bool, bias_dtype):
    return lambda s: C.conv_case(s, depthwise, np.int16, bias_dtype)


def _bias_fields(dtype: str) -> tuple:
    """A 16x8 model converted with an int32 bias (quantized_bias_type=INT32) sets the profile's
    ``int16_bias_dtype``; the converter's default int64 bias is the profile default."""
    from quantlab.numerics.dtypes import DType

    return (("int16_bias_dtype", DType.INT32),) if dtype.endswith("int32 bias") else ()


def _ort_families() -> list[Family]:
    _modules()
    import onnx_qlinear_models as Q
    import quantlab_bridge as B

    def conv_case(act):
        return lambda s: dataclasses.replace(Q.qlinearconv_case(s, act, np.int8), zw=0)

    def matmul_case(act):
        def make(s):
            m = Q.qlinearmatmul_case(s, act, np.int8)
            return dataclasses.replace(m, zb=np.zeros_like(m.zb))

        return make

    import ort_lut_models as LUT

    def lut_case(op, act):
        return lambda s: LUT.lut_case(s, op, act)

    rows = []
    for act, name in ((np.uint8, "uint8"), (np.int8, "int8")):
        rows.append(("QLinearConv", name, conv_case(act), Q.run_qlinearconv, B.ort_qlinearconv))
        rows.append(
            ("QLinearMatMul", name, matmul_case(act), Q.run_qlinearmatmul, B.ort_qlinearmatmul)
        )
    import litert_cases as C
    from ort_graphs import quantize_linear

    def run_quantize(c):
        return quantize_linear(c.x, c.yq.scale, c.yq.zero_point, c.dtype)

    for act, name in ((np.uint8, "uint8"), (np.int8, "int8"), (np.int16, "int16")):
        rows.append(("QuantizeLinear", name, lambda s, d=act: C.quantize_case(s, d), run_quantize,
                     B.quantize_case_codes))  # fmt: skip
    # DQ -> op(s) -> Q: Sigmoid fused into QLinearSigmoid, the others in float32
    for op, graph in LUT.OPS.items():
        label = "QLinearSigmoid" if op == "sigmoid" else "+".join(graph)
        for act, name in ((np.uint8, "uint8"), (np.int8, "int8")):
            rows.append((label, name, lut_case(op, act), LUT.run_lut, B.ort_lut))
    return [Family(Runtime.ONNXRUNTIME, *r) for r in rows]


def _zero_points(case) -> bool:
    """Whether a case has a nonzero activation zero point (input or output)."""
    for name in ("xq", "aq", "yq"):
        q = getattr(case, name, None)
        if q is not None and q.zero_point != 0:
            return True
    return any(getattr(case, n, 0) != 0 for n in ("zx", "za", "zy"))


def measure(exp: RuntimeFidelityExp, progress: bool = True) -> pd.DataFrame:
    """One row per (runtime, op family, dtype, profile): cases, outputs, differing outputs."""
    return _measure(exp, progress)[0]


def _measure(exp: RuntimeFidelityExp, progress: bool = True) -> tuple[pd.DataFrame, dict]:
    """``measure``'s rows, and per LITERT_DEFAULT family with a ``declined_when``, by (runtime,
    family label), the cases XNNPACK declined: {"when": declined_when, "cases", "outputs",
    "differing": {profile: differing outputs in those cases}}."""
    families: list[Family] = []
    for rt in exp.runtimes:
        families += _ort_families() if rt is Runtime.ONNXRUNTIME else _litert_families(rt)
    platforms = {name: load_platform(name) for name in exp.profiles}
    return _count(families, platforms, exp.cases, progress)


def _count(families: list[Family], platforms: dict, cases: int, progress: bool):
    """``_measure`` on given families and profiles (name -> PlatformConfig), seeds 0..cases-1."""
    rows = []
    declined: dict[tuple[str, str], dict] = {}
    for fam in tqdm(families, desc="runtime_fidelity", disable=not progress):
        counts = {name: [0, 0] for name in platforms}
        with_zp = 0
        dec = dict(when=fam.declined_when, cases=0, outputs=0)
        dec["differing"] = dict.fromkeys(platforms, 0)
        for seed in range(cases):
            case = fam.make(seed)
            result = fam.run(case)
            theirs = getattr(result, "y", result)
            was_declined = bool(fam.declined_when) and not result.delegated
            with_zp += _zero_points(case)
            dec["cases"] += was_declined
            dec["outputs"] += int(theirs.size) if was_declined else 0
            for name, platform in platforms.items():
                platform = dataclasses.replace(platform, **dict(fam.platform_fields))
                mine = fam.ours(case, platform)
                differing = int((mine != theirs).sum())
                counts[name][0] += int(theirs.size)
                counts[name][1] += differing
                dec["differing"][name] += differing if was_declined else 0
        if fam.declined_when:
            declined[(fam.runtime.value, f"{fam.op} {fam.dtype}")] = dec
        for name, (outputs, differing) in counts.items():
            rows.append(
                dict(
                    runtime=fam.runtime.value,
                    op=fam.op,
                    dtype=fam.dtype,
                    family=f"{fam.op} {fam.dtype}",
                    profile=name,
                    label=f"{fam.op} {fam.dtype} | {name}",
                    cases=cases,
                    cases_with_zero_points=with_zp,
                    outputs=outputs,
                    differing=differing,
                    differing_pct=100.0 * differing / max(outputs, 1),
                )
            )
    return pd.DataFrame(rows), declined


def matching_profiles() -> dict[str, str]:
    """The profile written for each runtime; onnxruntime's is the one of this machine's CPU
    (``onnxruntime_no_vnni`` where its uint8 x int8 product pairs saturate)."""
    return {
        Runtime.LITERT_REFERENCE.value: "tflite",
        Runtime.LITERT_DEFAULT.value: "litert_xnnpack",
        Runtime.ONNXRUNTIME.value: onnxruntime_profile(),
    }


def _findings(df: pd.DataFrame, declined: dict | None = None) -> list[str]:
    f = []
    matching = matching_profiles()
    own = df[df.profile == df.runtime.map(matching)]
    for rt, g in own.groupby("runtime", sort=False):
        f.append(
            f"{rt} vs the `{matching[rt]}` profile: {int(g.differing.sum())} differing outputs "
            f"of {int(g.outputs.sum())} over {len(g)} op families / dtypes "
            f"({int(g.cases.sum())} cases, {int(g.cases_with_zero_points.sum())} with nonzero "
            "activation zero points)."
        )
    f += _declined_findings(own, declined or {}, matching)
    other = df[(df.profile != df.runtime.map(matching)) & (df.differing > 0)]
    for _, r in other.sort_values("differing_pct", ascending=False).head(3).iterrows():
        f.append(
            f"The `{r.profile}` profile on {r.runtime} {r.family}: {int(r.differing)} of "
            f"{int(r.outputs)} outputs differ ({r.differing_pct:.2f}%): the rules are not "
            "interchangeable."
        )
    return f


def _declined_findings(own: pd.DataFrame, declined: dict, matching: dict) -> list[str]:
    """Why a LITERT_DEFAULT row differs from its profile: the cases XNNPACK declined, which
    LiteRT's own kernel ran (compared with the reference kernels' profile when measured)."""
    f = []
    ref = matching[Runtime.LITERT_REFERENCE.value]
    for _, r in own[own.differing > 0].iterrows():
        dec = declined.get((r.runtime, r.family))
        if dec is None or dec["cases"] == 0:
            continue
        kernel = "LiteRT's own kernel runs them"
        if ref in dec["differing"]:
            d = dec["differing"][ref]
            rule = f" by the `{ref}` rule" if d == 0 else ""
            kernel += f"{rule} ({d} of their {dec['outputs']} outputs differ from `{ref}`)"
        f.append(
            f"{r.runtime} {r.family}: XNNPACK declines {dec['when']} ({dec['cases']} of "
            f"{int(r.cases)} cases) and {kernel}; they hold {dec['differing'][r.profile]} of "
            f"the `{r.profile}` profile's {int(r.differing)} differing outputs."
        )
    return f


@experiment(RuntimeFidelityExp, "runtime_fidelity")
def runtime_fidelity(exp: RuntimeFidelityExp, ctx: RunContext) -> ExperimentResult:
    df, declined = _measure(exp, ctx.progress)
    own = df[df.profile == df.runtime.map(matching_profiles())][
        [
            "runtime",
            "profile",
            "op",
            "dtype",
            "cases",
            "cases_with_zero_points",
            "outputs",
            "differing",
        ]
    ].reset_index(drop=True)
    plots = [
        Plot(
            name="differing_by_profile",
            x="label",
            y="differing_pct",
            xlabel="op family, dtype | quantlab profile",
            ylabel="outputs differing from the runtime (% of outputs)",
            title="Each profile against each runtime (no bar = bit-exact)",
            facet="runtime",
            kind=PlotKind.BAR,
        )
    ]
    notes = [
        "Cases: tests/runtime/litert_cases.py, onnx_qlinear_models.py and ort_lut_models.py "
        "(seeds 0..cases-1; plain, tie-provoking power-of-two scales, RELU6 tie scales, "
        "observer output scales whose saturated outputs land on ties and, for 16x8, sums past "
        "2^31). onnxruntime cases use symmetric int8 weights (weight zero point 0), as quantlab "
        "quantizes weights.",
        "quantlab side: qconv2d / qconv_transpose / qlinear / qmatmul with the profile's "
        "per-family contract (platform.gemm_contract(op type, activation=dtype)), the fused "
        "activation's code bounds by the profile's bound_rule, ADD by its add_rule and SUB as "
        "the add of a and -b (fixed_common.sub_codes), LOGISTIC / TANH and onnxruntime's "
        "table ops by the zero-point LUT (numerics.lut.zero_point), the resizes by its resize "
        "rule (numerics.litert_resize: LiteRT's own kernels, or XNNPACK's for int8 bilinear "
        "resizes under litert_xnnpack), QUANTIZE and QuantizeLinear by the profile's "
        "quantize_codes (its divide, rounding, NaN and overflow rule and, for LiteRT's own "
        "int16 kernel, the scalar tail after blocks of 8; tests/runtime/quantlab_bridge.py). "
        "onnxruntime runs a table op as DequantizeLinear -> op(s) -> QuantizeLinear, the "
        "Sigmoid group fused into QLinearSigmoid, the others in float32 (silu: Sigmoid+Mul, "
        "rsqrt: Sqrt+Reciprocal); the onnxruntime profiles compute each entry as its float32 "
        "kernels do (platform.lut_table_values RUNTIME_FLOAT32).",
        "onnxruntime's matching profile is chosen by asking onnxruntime on this machine "
        f"(quantlab.export.ort_host): here `{onnxruntime_profile()}`. On x86 CPUs without VNNI "
        "its uint8 x int8 kernels saturate each pair of adjacent products to int16 "
        "(`onnxruntime_no_vnni`); elsewhere they sum exactly (`onnxruntime`).",
        "LiteRT 16x8 models take the converter's default int64 bias, or an int32 bias "
        "(quantized_bias_type=INT32: other kernels, an int32 accumulator), which every profile "
        "is told by platform.int16_bias_dtype=INT32; DEPTHWISE_CONV_2D 16x8 has no int32-bias "
        "kernel (LiteRT refuses the model).",
        "Resize cases: inputs of 1-9 x 1-9 pixels to outputs of 1-20 x 1-20, the extreme codes "
        "included, the mappings torch's calls give in turn (bilinear: half-pixel centres or "
        "align_corners; nearest: neither, or half-pixel centres for nearest-exact); LiteRT's "
        "default interpreter gives XNNPACK the int8 bilinear ones.",
        "QUANTIZE / QuantizeLinear cases: float32 tensors of 1 to 4 dims with 1 to 8 "
        "elements per dim (every count mod 8), 70% of the values within 3 ulps of a rounding "
        "tie, the rest across the code range and beyond, NaN, infinities and values beyond "
        "the int32 range in every third case; a 4-d case is LiteRT's N, H, W, C tensor.",
        "TRANSPOSE_CONV cases (strides 1-3, kernels 1-5, SAME and VALID, every 8th without a "
        "bias, also codes and int8 zero points at the ends of their range) are drawn only "
        "where torch's conv_transpose2d reproduces TFLite's padding (SAME with TFLite padding "
        "one row more after than before is left out). LiteRT's default interpreter gives "
        "XNNPACK the int8 ones except SAME with a kernel smaller than the stride, which its own "
        "kernel runs; the findings count those cases from each run.",
    ]
    return ExperimentResult(
        table=df,
        title="Runtime fidelity: quantlab profiles against LiteRT and onnxruntime",
        findings=_findings(df, declined),
        tables={"matching_profiles": own},
        plots=plots,
        notes=notes,
    )
