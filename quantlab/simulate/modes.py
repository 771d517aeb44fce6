"""Run modes, per-op overrides, comparison views and recorded traces."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class Mode(enum.Enum):
    """FLOAT: the model as written. FAKE: QAT numerics (exact float functions on fake-quantized
    tensors, float16 fake casts). FIXED: deployed numerics (integer GEMM + requantization,
    segment LUTs, int16 grids, period reduction). HYBRID: the vendor's ``ptq.onnx`` stage:
    segment-LUT ops (``fixed_lut.DEPLOYED_CATEGORIES``: sigmoid, tanh, exp, ..., sin/cos with
    the platform's period handling, softmax) as FIXED computes them, every other op as FAKE."""

    __hash__ = object.__hash__  # members are singletons: identity hashing, done in C

    FLOAT = "float"
    FAKE = "fake"
    FIXED = "fixed"
    HYBRID = "hybrid"

    @classmethod
    def parse(cls, value: Mode | str) -> Mode:
        if isinstance(value, Mode):
            return value
        for m in cls:
            if isinstance(value, str) and value in (m.name, m.value):
                return m
        raise ValueError(f"unknown mode {value!r}; allowed: {', '.join(m.name for m in cls)}")


class FakeOps(enum.Enum):
    """How FAKE mode computes segment-LUT ops (a ``Simulator`` option).

    QAT: the exact float function, then output fake quant (what QAT frameworks compute); a
    softmax the platform computes by segment LUTs is the vendor's QAT SegmentLUTSoftmax, whose
    exp, row sum and reciprocal are fake-quantized too (``fixed_softmax.softmax_fake_op``), and a
    log_softmax it composes the QAT LogSoftmax (``fixed_log_softmax.log_softmax_fake_op``);
    sqrt, reciprocal, tan, atanh, asin and acos clip their input, and log is hard_log, where
    the platform's QAT does so (``fixed_lut.lut_fake_op``).
    DEPLOYED: the deployed segment table of the op's dividing strategy (integer table values,
    the platform's sin/cos period handling) and the deployed softmax: forward values equal FIXED
    mode's for the op's input. Gradients (deployment-aware QAT): a LUT op's is its table's own
    piecewise-linear slope; softmax's is the float softmax's at the same input (a
    straight-through estimator: the deployed exp table, sum and division are not
    differentiated).

    The model input is not an op: how the chip receives it is the model's input format
    (``quantlab.models.input_path``, ``model.input_format``): the deployed model takes integer
    codes at a fixed scale (``InputQuant``), the same values in FAKE and FIXED mode. A
    deployment-aware run of an image model is DEPLOYED on that deployed model."""

    QAT = "qat"
    DEPLOYED = "deployed"


class ScaleTraining(enum.Enum):
    """What training does with activation scales (``Simulator.train_step``).

    FIXED: the calibrated scales stay frozen (the vendor's fixed-scale QAT); LEARNED: each
    calibrated activation scale becomes a parameter trained by LSQ's gradient (points with
    ``observer: FIXED`` keep their fixed scale)."""

    FIXED = "fixed"
    LEARNED = "learned"


class View(enum.Enum):
    """ISOLATED: each op of run b is fed the inputs run a gave it. ACCUMULATED: errors propagate."""

    ISOLATED = "isolated"
    ACCUMULATED = "accumulated"


@dataclass(frozen=True)
class OpMode:
    """Per-op override of a run's default mode.

    quantize_output=False keeps this op's output in float (sensitivity "weight" pass);
    quantize_weight=False keeps its weights in float (sensitivity "activation" pass);
    quantize_float_inputs=True quantizes activation inputs that come from an op run in float
    (by default they stay float; sensitivity "input" pass, a GEMM's inputs alone).
    """

    mode: Mode
    quantize_output: bool = True
    quantize_weight: bool = True
    quantize_float_inputs: bool = False


@dataclass
class Trace:
    """Every captured op's output in one run (detached), with its quantization side info."""

    mode: Mode
    order: list[str] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    qinfo: dict[str, Any] = field(default_factory=dict)  # name -> QInfo, list of them, or None
    float16_overflow: dict[str, int] = field(default_factory=dict)  # op -> values beyond 65504
    result: Any = None  # what the model returned
    float_ops: set[str] = field(default_factory=set)  # ops the run kept in float by its mode
    fused: set[str] = field(default_factory=set)  # GEMMs that ran with their fused chain
    # ops whose output shared an input's memory: the op returned an argument itself (its index
    # among the leaves of tree_flatten((args, kwargs))), or a torch view of one (None)
    aliases: dict[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class ObservedCall:
    """One captured call as a run computed it, handed to ``Simulator.trace(on_call=...)``.

    ``call``: the captured call (quantlab.capture.OpCall; its tensors are the run's own, not to
    be changed). ``incoming[i]``: the QInfo activation argument ``plan.acts[i]``
    (quantlab.simulate.args) carried when the call was reached (None: float, or not a tensor),
    read before the op ran, so in-place ops report their input's quantization. ``output``: what
    the call returned. ``bounds``: (lo, hi) of a relu6 / hardtanh / clamp with constant bounds
    (None for an open side), else None. Read-only: nothing the observer does changes the run.
    """

    call: Any
    plan: Any
    incoming: list
    output: Any
    bounds: tuple | None = None


CallObserver = Callable[[ObservedCall], None]
