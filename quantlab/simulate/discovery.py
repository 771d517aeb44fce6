"""Op discovery: what one run of the model reveals about its ops.

Each captured call leaves a record (type, module, input shapes and producers, fusable post-op
parameters); the first run with new ops finds the fused Conv/Linear -> batch_norm -> relu6
chains, the GEMMs that feed a model output and the ops that build a grid_sample grid
(``OpContext``, read by qconfig templates), then checks every op's resolved qconfig against the
platform. ``Simulator.ops`` is the resulting op-support table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from torch import Tensor
from torch.utils._pytree import tree_flatten

from quantlab.capture import OpCall
from quantlab.numerics.dtypes import DType
from quantlab.numerics.split import check_split_target
from quantlab.numerics.split_matmul import SPLIT_OPERAND_DTYPE
from quantlab.op_kinds import OpCategory
from quantlab.qconfig import GEMM_TYPES, OpContext, validate_names
from quantlab.simulate import args as A
from quantlab.simulate import calls, fixed_ops
from quantlab.simulate.fusion import find_fusions
from quantlab.simulate.run_state import RunState
from quantlab.simulate.same_grid import LAYOUT_OPS

# layout ops that move a GEMM's wide model output on as it is (a constant pad's fill would
# need the grid the wide output does not have)
WIDE_MOVERS = LAYOUT_OPS - {"pad"}


@dataclass(slots=True)
class _OpInfo:
    name: str
    op_type: str
    category: OpCategory | None
    module: str
    call_index: int
    input_shapes: list
    output_shape: tuple | None
    has_weight: bool
    flops: int
    producers: list  # producer op name (or None) of each activation input
    input_dtypes: list = field(default_factory=list)
    post: tuple | None = None  # batch_norm: (mean, var, weight, bias, eps); clamp: (lo, hi)
    inplace: bool = False  # the call writes into its first argument
    # an op not modelled that returned its first float input itself (an eval-mode dropout, a
    # cast to the dtype it has): its output is that input, codes and all
    returns_input: bool = False


class OpDiscovery:
    """The Simulator's op records, graph discovery, validation and op table."""

    @property
    def ops(self) -> pd.DataFrame:
        """One row per captured op call of the latest run, in execution order
        (``float16_overflow``: finite values beyond +-65504 it cast to float16 in that run;
        ``fixed_in_float``: its fixed kernel declined its latest fixed-mode call for an integer
        output, so it was computed in float and its output quantized; ``producers``: the op
        producing each activation input, None for a model input or a constant)."""
        rows = []
        for name in self._order:
            inf = self._info[name]
            rq = self.qconfig_of(name) if inf.category is not None else None
            rows.append(
                {
                    "name": name,
                    "op_type": inf.op_type,
                    "module": inf.module,
                    "call_index": inf.call_index,
                    "input_shapes": inf.input_shapes,
                    "output_shape": inf.output_shape,
                    "supported": self.supported(inf.op_type, inf.category),
                    "category": inf.category.name if inf.category else "NONE",
                    "fixed_kernel": (
                        f"fused into {self._fused_into[name]}"
                        if name in self._fused_into
                        else self._table_kernel(name, inf, rq)
                    ),
                    # its fixed kernel declined the latest fixed-mode call: float, quantized
                    "fixed_in_float": name in self._fixed_in_float,
                    "input_dtype": calls.dt_names(inf.input_dtypes),
                    "weight_dtype": rq.weight_dtype.name if rq and inf.has_weight else "",
                    "output_dtype": self._op_out_dtype(name, inf).name if rq else "FLOAT32",
                    "has_weight": inf.has_weight,
                    "weight_split": rq.weight_split if rq else 0,
                    "fused_into": self._fused_into.get(name, ""),  # the GEMM computing this op
                    # the op producing each activation input (None: a model input or constant)
                    "producers": list(inf.producers),
                    "flops": inf.flops,
                    # values beyond +-65504 this op cast to float16 (before saturation)
                    "float16_overflow": self._float16_overflow.get(name, 0),
                }
            )
        return pd.DataFrame(rows)

    @property
    def recorded_ops(self) -> int:
        """How many ops the run in progress has captured so far (after a run: its op count);
        where a call outside the op table sits in it (quantlab.simulate.patterns)."""
        st = self._state
        return len(st.order) if st is not None else len(self._order)

    def _discover(self, out: Any, st: RunState) -> None:
        self._find_fusions(st)
        feeds = set()
        for leaf in tree_flatten(out)[0]:
            if not isinstance(leaf, Tensor) or not leaf.is_floating_point():
                continue  # no values of an op (the indices of a max over a dimension)
            p = st.producers.get(leaf)
            while p is not None:
                inf = st.infos[p]
                # an op that returns its input itself (eval dropout) moves it on as it is
                if inf.category is not OpCategory.PASS_THROUGH and not inf.returns_input:
                    feeds.add(self._fused_into.get(p, p))
                    break
                p = inf.producers[0] if inf.producers else None
        self._wide_moves |= _output_only_layout_ops(st, out)
        chain = set()
        for name in st.order:
            inf = st.infos[name]
            if inf.category is OpCategory.GRID_SAMPLE and len(inf.producers) > 1:
                todo, depth = [inf.producers[1]], 0
                while todo and depth < 64:
                    p = todo.pop()
                    depth += 1
                    if p is None or p in chain:
                        continue
                    chain.add(p)
                    pinf = st.infos[p]
                    if pinf.op_type not in GEMM_TYPES:
                        todo.extend(pinf.producers)
        for name in st.order:
            if name not in self._ctx:
                inf = st.infos[name]
                self._ctx[name] = OpContext(
                    name, inf.op_type, inf.module, name in feeds, name in chain
                )
                self._resolved.pop(name, None)
        self._discovered = True
        self._validate()

    def _find_fusions(self, st: RunState) -> None:
        find_fusions(st.order, st.infos, self._chain, self._fused_into)
        self._routes.clear()  # a route holds its op's fused chain

    def _validate(self) -> None:
        from quantlab.op_kinds import KNOWN_OP_TYPES

        validate_names(self.spec, self._order, set(KNOWN_OP_TYPES))
        out_dt: dict[str, DType] = {}
        for name in self._order:
            inf = self._info[name]
            if inf.category is None or not self.supported(inf.op_type, inf.category):
                kept = out_dt.get(inf.producers[0]) if inf.returns_input and inf.producers else None
                out_dt[name] = kept or DType.FLOAT32
                inf.input_dtypes = [kept] if kept is not None else []
                continue
            rq = self.qconfig_of(name)
            ins = [
                rq.input_dtype or (out_dt.get(p) if p else None) or rq.output_dtype
                for p in inf.producers
            ]
            split_operand = rq.weight_split and inf.op_type == "matmul" and len(ins) > 1
            if split_operand:  # the int15 split: B arrives as int16, runs as two int8 halves
                ins[1] = SPLIT_OPERAND_DTYPE
            inf.input_dtypes = ins
            self._check_float_inputs(name, inf, out_dt)
            self._check_high_precision(name, inf, rq)
            out_dt[name] = self._op_out_dtype(name, inf)
            if inf.category is OpCategory.GEMM:
                ops = ins + ([rq.weight_dtype] if inf.has_weight else [])
                if split_operand:
                    ops = [ins[0], DType.INT8]
                self._check_gemm(name, inf.op_type, ops)
            if rq.weight_split:
                check_split_target(name, inf.op_type, inf.has_weight, rq.weight_split)
                if inf.has_weight and rq.weight_dtype is not DType.INT8:
                    raise ValueError(
                        f"op {name}: weight_split={rq.weight_split} splits an INT8 weight, but "
                        f"weight_dtype={rq.weight_dtype.name}; allowed: INT8"
                    )
            if inf.category is OpCategory.GRID_SAMPLE and inf.input_shapes:
                self._check_grid(name, inf.input_shapes[0])

    def _table_kernel(self, name: str, inf, rq) -> str:
        """The ops table's kernel (``fixed_ops.kernel_name``); an op other than a GEMM or a
        pass-through op whose output dtype is a float one (float16 on J6H/P) computes in that
        float, whatever integer kernel the platform has for its integer dtypes."""
        kernel = fixed_ops.kernel_name(inf.op_type, inf.category, self)
        if rq is None or inf.category in (None, OpCategory.GEMM, OpCategory.PASS_THROUGH):
            return kernel
        out = self._out_dtype(name)
        if out.is_int or kernel.startswith("float"):
            return kernel
        return f"{out.name.lower()} ({fixed_ops.FLOAT_OUTPUT})"

    def _op_out_dtype(self, name: str, inf) -> DType:
        """A modelled op's output dtype: a pass-through op's is its input's (it moves codes;
        ``_moved_dtype``), any other op's its own."""
        if inf.category is OpCategory.PASS_THROUGH and inf.input_dtypes:
            return self._moved_dtype(name, inf, inf.input_dtypes[0])
        return self._out_dtype(name)

    def _moved_dtype(self, name: str, inf, kept: DType) -> DType:
        """A pass-through op's output dtype: ``kept``, its input's (it moves codes), except
        for a GEMM's wide output that it does not pass on (``passes_wide_output``), which it
        quantizes at its own point."""
        producer = inf.producers[0] if inf.producers else None
        if self._wide_gemm_output(producer) and not self.passes_wide_output(name, producer):
            return self._out_dtype(name)
        return kept

    def moves_wide_output(self, name: str) -> bool:
        """Whether op ``name`` moves a GEMM's high-precision output (int32 on J6E/M/B, float32
        on J6H/P: the accumulator, not requantized) to a model output as it is: a layout op
        (``WIDE_MOVERS``) between such a GEMM and model outputs that feeds nothing else
        (``_output_only_layout_ops``). A layout op whose output another op also reads
        quantizes its input, as every op does (with its own output dtype)."""
        inf = self._info.get(name)
        return (
            inf is not None
            and bool(inf.producers)
            and self.passes_wide_output(name, inf.producers[0])
        )

    def passes_wide_output(self, name: str, producer: str | None) -> bool:
        """``moves_wide_output`` with the producer of the op's input given."""
        return name in self._wide_moves and self._wide_gemm_output(producer)

    def _wide_gemm_output(self, name: str | None) -> bool:
        """Whether op ``name``'s output is a high-precision GEMM output, directly or through
        layout ops (``WIDE_MOVERS``)."""
        inf = self._info.get(name) if name is not None else None
        while inf is not None and inf.op_type in WIDE_MOVERS and inf.producers:
            name = inf.producers[0]
            inf = self._info.get(name) if name is not None else None
        if inf is None or inf.category is not OpCategory.GEMM:
            return False
        return bool(self.qconfig_of(self._fused_into.get(name, name)).high_precision_output)

    def _out_dtype(self, name: str) -> DType:
        rq = self.qconfig_of(name)
        inf = self._info.get(name)
        if inf is not None and inf.category is OpCategory.GEMM and rq.high_precision_output:
            return self.platform.high_precision_output
        return rq.output_dtype

    def _check_gemm(self, name: str, op_type: str, dtypes: list) -> None:
        n16 = sum(1 for d in dtypes if d is DType.INT16)
        if n16 < 2:
            return
        p = self.platform
        int32_out = self._out_dtype(name) is DType.INT32
        if p.int16_gemm_operands(op_type, int32_out) < 2:
            if op_type == "matmul" and not int32_out:
                raise ValueError(
                    f"op {name} (matmul): MatMul with both inputs INT16 needs toolchain >= "
                    f"{p.dual_int16_matmul_since.value} on {p.name} "
                    f"(platform.dual_int16_matmul_since); platform.toolchain="
                    f"{p.toolchain.name}. Set platform.toolchain to your release "
                    "if it is newer, or make one input INT8"
                )
            raise ValueError(
                f"op {name} ({op_type}): int16 x int16 GEMM is not available on "
                f"{p.name} (platform.max_int16_gemm_operands="
                f"{p.max_int16_gemm_operands}); make the input or the weight INT8"
            )

    def _check_high_precision(self, name: str, inf: _OpInfo, rq) -> None:
        """A high-precision (int32 / float32) output only on a GEMM feeding a model output
        (TAE: int32 output only at a model output layer, seed 002 line 17)."""
        wide = rq.high_precision_output or rq.output_dtype is DType.INT32
        ctx = self._ctx.get(name)
        if not wide or inf.category is OpCategory.GEMM and ctx is not None and ctx.feeds_output:
            return
        what = "high_precision_output=true" if rq.high_precision_output else "output_dtype=INT32"
        where = "is not a GEMM" if inf.category is not OpCategory.GEMM else "feeds no model output"
        raise ValueError(
            f"op {name} ({inf.op_type}): {what}, but it {where}; a high-precision (int32 / "
            "float32) output is allowed only on a Conv/Linear/MatMul that feeds a model output "
            "(TAE: int32 output only at the model output layer, seed 002 line 17); set "
            "high_precision_output=false and an INT8/INT16 output_dtype for this op"
        )

    def _check_float_inputs(self, name: str, inf: _OpInfo, out_dt: dict) -> None:
        """On a platform without float in TAE/VAE, no fixed-point op takes a float tensor that
        a quantized op produced (it would silently compute in float)."""
        if self.platform.float16_available or inf.category is OpCategory.PASS_THROUGH:
            return
        for p in inf.producers:
            pinf = self._info.get(p) if p else None
            while pinf is not None and pinf.category is OpCategory.PASS_THROUGH:
                p = pinf.producers[0] if pinf.producers else None
                pinf = self._info.get(p) if p else None
            dt = out_dt.get(p) if p else None
            if dt is None or not dt.is_float or pinf is None:
                continue
            if pinf.category is None or not self.supported(pinf.op_type, pinf.category):
                continue  # a float op's output is quantized on entry (a Quantize node)
            raise ValueError(
                f"op {name} ({inf.op_type}): its input from {p} arrives in {dt.name} (that "
                f"op's output dtype), but {self.platform.name} has no float in TAE/VAE "
                "(platform.float16_available=false, seed 002 lines 8-10): a fixed-point op takes "
                f"INT8/INT16 there. Give {p} an INT8/INT16 output_dtype, or leave "
                f"{inf.op_type!r} out of platform.supported_ops so that it runs in float as a "
                "listed CPU fallback"
            )

    def _check_grid(self, name: str, shape) -> None:
        if len(shape) != 4:
            return
        h, w = int(shape[2]), int(shape[3])
        side, area = self.platform.grid_max_side, self.platform.grid_max_area
        if side and (h > side or w > side) or area and h * w > area:
            raise ValueError(
                f"op {name} (grid_sample): input H={h}, W={w} exceeds the {self.platform.name} "
                f"limits H, W <= {side} (platform.grid_max_side) and H*W <= {area} "
                "(platform.grid_max_area)"
            )

    def _record(self, call: OpCall, plan: A.ArgPlan, st: RunState) -> _OpInfo:
        shapes, producers = [], []
        args, kwargs, prod = call.args, call.kwargs, st.producers
        for slot in plan.acts:
            v = A.get(args, kwargs, slot)
            if isinstance(v, Tensor):
                shapes.append(tuple(v.shape))
                producers.append(prod.get(v))
            else:
                shapes.append(())
                producers.append(None)
        name = call.name
        inf = _OpInfo(
            name,
            call.op_type,
            call.category,
            call.module,
            call.call_index,
            shapes,
            None,
            plan.weight is not None and A.get(args, kwargs, plan.weight) is not None,
            0,
            producers,
        )
        old = self._info.get(name)
        if old is not None:  # a run that replays or skips the op keeps what was learnt
            inf.input_dtypes = old.input_dtypes
            inf.returns_input = old.returns_input
        inf.post = calls.post_params(call)
        inf.inplace = calls.is_inplace(call)
        st.infos[name] = inf
        st.order.append(name)
        return inf


def _output_only_layout_ops(st: RunState, out: Any) -> set[str]:
    """The layout ops (``WIDE_MOVERS``) of a run whose output reaches model outputs only: it
    is a model output, or read by such layout ops alone, and read by nothing else."""
    outputs = {
        st.producers.get(leaf)
        for leaf in tree_flatten(out)[0]
        if isinstance(leaf, Tensor) and leaf.is_floating_point()
    }
    readers: dict[str, list[str]] = {}
    for name in st.order:
        for p in st.infos[name].producers:
            if p is not None:
                readers.setdefault(p, []).append(name)
    only: set[str] = set()
    for name in reversed(st.order):  # readers come after the op they read
        read_by = readers.get(name, [])
        if (
            st.infos[name].op_type in WIDE_MOVERS
            and (name in outputs or read_by)
            and all(r in only for r in read_by)
        ):
            only.add(name)
    return only
