"""Op dispatch: what each captured call becomes in a run.

A call is replayed from a recorded trace, passed through (an op fused into its GEMM, or not
modelled), run in float (FLOAT mode, unsupported ops; calibration observes it), or run
quantized: activation inputs quantized, weights fake-quantized or coded, batch_norm folded into
its GEMM, then the fixed-point kernel (FIXED) or the float function with a quantized output.
In-place ops keep the model's aliasing; the side tables carry codes and producers. A steady FAKE
or FIXED run (no per-op overrides, replay, trace, observer, calibration or gradients) follows an
op's prepared call (``steady``, kept per op and mode) when every check of it holds, with the same
bits.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten

from quantlab.capture import OpCall
from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import dequantize
from quantlab.numerics.split_matmul import SPLIT_OPERAND_DTYPE, split_operand_fake
from quantlab.op_kinds import OpCategory
from quantlab.simulate import args as A
from quantlab.simulate import (
    blocked_dispatch,
    calls,
    fixed_gemm,
    fixed_lut,
    fixed_ops,
    replay,
    same_grid,
    steady,
    steady_prepare,
    trace_record,
)
from quantlab.simulate.batch_norm_folding import BatchNormFolding
from quantlab.simulate.fake_kernels import fake_kernel
from quantlab.simulate.fixed_sampling import keeps_input_quantization
from quantlab.simulate.modes import FakeOps, Mode, ObservedCall
from quantlab.simulate.op_route import OpRoute, make_route, route_matches
from quantlab.simulate.qat import fake_grid, fake_single_period
from quantlab.simulate.qtensor import QInfo
from quantlab.simulate.run_state import RunState
from quantlab.simulate.straight_through import through


class OpDispatch(BatchNormFolding):
    """The Simulator's per-call handler and the quantized run of one op."""

    def _handle(self, call: OpCall) -> Any:
        st = self._state
        assert st is not None
        if st.on_call is None:
            return self._dispatch(call, st)
        plan = A.plan_of(call, self._plans) if call.category is not None else None
        acts = [A.get(call.args, call.kwargs, s) for s in plan.acts] if plan else []
        incoming = [st.qt.get(v) for v in acts]
        out = self._dispatch(call, st)
        bounds = calls.post_params(call) if call.op_type in ("relu6", "clamp") else None
        st.on_call(ObservedCall(call, plan, incoming, out, bounds))
        return out

    def _dispatch(self, call: OpCall, st: RunState) -> Any:
        prep = self._prepared.get((call.name, st.mode)) if self._prepared else None
        if prep is not None and st.steady():
            hit = steady.prepared_value(self, prep, call, st)
            if hit is not None:
                plan, out, info = hit
                if st.prepared_hits is not None:
                    st.prepared_hits.add(call.name)
                inf = self._record(call, plan, st)
                inf.output_shape = tuple(out.shape)
                inf.flops = calls.flops(call, plan, out)
                self._set_out_info(out, info, st, call.name)
                return out
        om = st.op_modes.get(call.name) if st.op_modes else None
        grid = None  # the grid a float op's output stays on (same_grid)
        if call.category is not None:
            plan = A.plan_of(call, self._plans)
        else:
            plan = A.ArgPlan(calls.float_slots(call))
        inf = self._record(call, plan, st)
        if st.replay_active:
            if om is not None or call.name in st.replay_stops:
                st.replay_active = False
            elif call.name in st.replay.outputs:
                out = replay.replayed_output(call, st)
                self._set_out_info(out, st.replay.qinfo.get(call.name), st, call.name)
                if replay.kept_float(call.name, st):
                    st.float_ops.add(call.name)
                if call.name in st.replay.fused:  # its chain's ops after the stop pass through
                    st.fused_done.add(call.name)
                return out
        if st.pending:  # computed from here: replayed outputs it reads take their values
            st.materialize_read(call.args, call.kwargs)
        if st.blocked is not None:
            out = blocked_dispatch.blocked_value(self, call, plan, inf, om, st)
            if out is not None:
                return out
            call = blocked_dispatch.dense_read(self, call, st)
        mode = om.mode if om is not None else st.mode
        deployed = mode is Mode.HYBRID or (mode is Mode.FAKE and self.fake_ops is FakeOps.DEPLOYED)
        if mode is Mode.HYBRID:
            mode = Mode.FAKE
        target = calls.inplace_target(call)
        head = self._fused_into.get(call.name)
        if head is not None and head in st.fused_done:  # computed by its GEMM already
            out = A.get(call.args, call.kwargs, plan.acts[0])
            info = st.qt.get(out)
            if head in st.float_ops:  # the chain's output stayed float (quantize_output=False)
                st.float_ops.add(call.name)
        elif call.result is not None:  # not modelled: ran in float already
            out, info = call.result, None
            grid = self._float_grid(call, out, st, mode)
            inf.returns_input = same_grid.returns_input(call, out)
        elif mode is Mode.FLOAT or not self.supported(call.op_type, call.category):
            if st.calibrating:  # before the call: an in-place op writes its input
                self._observe_inputs(call, plan)
            out, info = call.run(), None
            if mode is Mode.FLOAT:
                st.float_ops.add(call.name)
            else:  # a float fallback: its output may stay on its input's grid, as a float op's
                grid = self._float_grid(call, out, st, mode)
            if st.calibrating:
                self._observe_output(call, out)
        else:
            out, info = self._run_quantized(call, plan, mode, om, st, deployed, target)
            if om is not None and not om.quantize_output and mode is Mode.FAKE:
                st.float_ops.add(call.name)  # its float output is not re-quantized downstream
        inf.output_shape = tuple(out.shape) if type(out) is Tensor else calls.shape_of(out)
        inf.flops = calls.flops(call, plan, out)
        if st.trace is not None:
            trace_record.record(call, out, st, target)
            st.trace.qinfo[call.name] = info
        if st.isolate is not None and call.name in st.isolate.outputs:
            out = calls.substitute(call, st.isolate.outputs[call.name])
            info, grid = st.isolate.qinfo.get(call.name), None
        self._set_out_info(out, info, st, call.name, grid)
        return out

    def _float_grid(self, call: OpCall, out: Any, st: RunState, mode: Mode) -> Any:
        """The grid the output of ``call``, an op not modelled that ran in float, stays on in a
        run of ``mode`` (``same_grid.grid_of``), or None."""
        if mode is Mode.FLOAT or st.grad:
            return None
        return same_grid.grid_of(call, out, st.qt, mode is Mode.FIXED)

    def _kept_float(self, call: OpCall, st: RunState) -> Any:
        """``_dispatch`` of ``call``, an op not modelled that ran in float (``call.result``, a
        tensor) and is not fused into a GEMM, in a run that records nothing per op (a traced
        program's: no per-op modes, replay, trace, isolation or observer): its output booked
        as the dispatch books it (no QInfo; the grid it stays on) without the op table entry
        the run would drop."""
        out = call.result
        grid = self._float_grid(call, out, st, Mode.FAKE if st.mode is Mode.HYBRID else st.mode)
        self._set_out_info(out, None, st, call.name, grid)
        return out

    def _kept_input(self, x: Tensor, st: RunState, name: str) -> None:
        """``_kept_float``'s booking of an op not modelled that returned its input ``x`` itself,
        unchanged, and is not fused into a GEMM (an eval-mode dropout), in a run of ``st``."""
        grid = None
        if st.mode is not Mode.FLOAT and not st.grad:
            grid = same_grid.kept_grid(st.qt.get(x), x, st.mode is Mode.FIXED)
        self._set_out_info(x, None, st, name, grid)

    def _set_out_info(
        self, out: Any, info: Any, st: RunState, name: str, grid: QInfo | None = None
    ) -> None:
        """Book ``out`` as op ``name``'s output in ``st``: its producer, its QInfo ``info`` (a
        list: one per tensor leaf; None: not quantized) and the grid a float op's output stays
        on (``grid``; an op's output is otherwise new values, off any grid)."""
        if isinstance(out, Tensor) and not isinstance(info, list):  # the common case
            st.producers.set(out, name)
            if grid is None:
                st.grid.drop(out)
            else:
                st.grid.set(out, grid)
            if info is not None:
                st.qt.set(out, info)
            else:
                st.qt.drop(out)
            return
        leaves = tree_flatten(out)[0]
        infos = info if isinstance(info, list) else [info] * len(leaves)
        for leaf, li in zip(leaves, infos):
            if isinstance(leaf, Tensor):
                st.producers.set(leaf, name)
                st.grid.drop(leaf)
                if li is not None:
                    st.qt.set(leaf, li)
                else:
                    st.qt.drop(leaf)
        if grid is not None:
            st.grid.set(out, grid)

    def _run_quantized(self, call, plan, mode, om, st, deployed=False, target=None):
        """Quantized result of one op; an in-place op writes it into its target tensor
        (``target``, ``calls.inplace_target``: so aliases see it, as in the model) and the
        target's side-table entry is replaced. ``deployed``: a segment-LUT op in a FAKE run
        computes its deployed table."""
        out, info = self._run_quantized_value(call, plan, mode, om, st, deployed)
        if st.grad and isinstance(out, Tensor) and not out.requires_grad:
            out = self._float_gradient(call, plan, out)
        if target is not None and isinstance(out, Tensor) and out.shape == target.shape:
            target.copy_(out)
            return target, info
        return out, info

    def _float_gradient(self, call, plan, out: Tensor) -> Tensor:
        """``out`` (its bits) with the gradient of the op's float function on the same inputs,
        for a kernel with no gradient of its own (integer and composite kernels)."""
        args, kwargs = list(call.args), dict(call.kwargs)
        if kwargs.get("inplace"):
            kwargs["inplace"] = False
        acts = [A.get(args, kwargs, s) for s in plan.acts]
        weight = A.get(args, kwargs, plan.weight) if plan.weight is not None else None
        if not any(isinstance(v, Tensor) and v.requires_grad for v in [*acts, weight]):
            return out
        if call.category is not None and calls.is_inplace(call):
            return out
        ref = calls.out_of_place(call)(*args, **kwargs)
        if not isinstance(ref, Tensor) or ref.shape != out.shape:
            return out
        return through(ref, out)

    def _route(self, call, plan, mode, om, deployed) -> OpRoute:
        """The value-independent decisions of ``call``'s quantized run (``op_route``)."""
        name = call.name
        rq = self._resolved.get(name) or self.qconfig_of(name)
        chain = self._chain.get(name) if call.category is OpCategory.GEMM else None
        r = self._routes.get((name, mode))
        if r is None or not route_matches(r, plan, mode, om, deployed, rq, chain, self.platform):
            r = make_route(
                call,
                plan,
                mode,
                om,
                deployed,
                rq,
                chain,
                self.platform,
                fake_kernel(call, self.platform),
                fixed_lut.DEPLOYED_CATEGORIES,
            )
            self._routes[name, mode] = r
        return r

    def _run_quantized_value(self, call, plan, mode, om, st, deployed=False):
        r = self._route(call, plan, mode, om, deployed)
        rq, name = r.rq, call.name
        args, kwargs = list(call.args), dict(call.kwargs)
        if kwargs.get("inplace"):
            kwargs["inplace"] = False  # computed out of place, then written by _run_quantized
        in_infos: list = []
        arrived: list = []  # the quantization each activation input came with
        split_b = r.split_b
        qt = st.qt
        fake = mode is Mode.FAKE
        pass_through = call.category is OpCategory.PASS_THROUGH
        for i, slot in enumerate(plan.acts):
            v = A.get(args, kwargs, slot)
            if not (isinstance(v, Tensor) and v.is_floating_point()):
                in_infos.append(None)
                arrived.append(None)
                continue
            info = qt.get(v)
            arrived.append(info)
            if info is None and pass_through and self.passes_wide_output(name, st.producers.get(v)):
                in_infos.append(None)  # a GEMM's int32 / float32 model output moves as it is
                continue
            if (
                info is None
                and fake
                and r.keep_float_inputs
                and st.float_ops
                and st.producers.get(v) in st.float_ops
            ):
                in_infos.append(None)  # a float op's output stays float (sensitivity runs)
                continue
            want = rq.input_dtype or (info.dtype if info is not None else rq.output_dtype)
            if split_b and i == 1:
                want = SPLIT_OPERAND_DTYPE
            if info is None or info.dtype is not want:
                if info is not None and info.dtype.is_float and want.is_float:
                    v, info = self.cast_float(name, v, want), QInfo(want)
                else:
                    v, info = self.quantize_act(name, f"in{i}", v, want, rq, mode)
                A.put(args, kwargs, slot, v)
            in_infos.append(info)
        wq = None
        chain = r.chain
        if chain:
            st.fused_done.add(name)
            plan = self._fold(call, plan, args, kwargs)
        if plan.weight is not None and r.quantize_weight:
            w = A.get(args, kwargs, plan.weight)
            if rq.weight_dtype.is_int:
                wv, codes, w_scale = self.weight_coded(
                    name, w, rq.weight_dtype, mode, rq.weight_split, A.weight_channel_axis(call)
                )
                wq = (codes, w_scale, w)
                A.put(args, kwargs, plan.weight, wv)
            else:
                A.put(args, kwargs, plan.weight, self.cast_float(name, w, rq.weight_dtype))
        x_info = in_infos[0] if in_infos else None
        if fake and wq is not None and plan.bias is not None and x_info is not None:
            b = A.get(args, kwargs, plan.bias)
            if b is not None and x_info.dtype.is_int:
                A.put(args, kwargs, plan.bias, self.bias_value(b, x_info.scale, wq[1], name))
        if split_b and in_infos[1] is not None and in_infos[1].dtype.is_int:
            if fake:  # QAT value of the split operand: s (b_hi + b_lo / 2**k)
                b = A.get(args, kwargs, plan.acts[1])
                k, fr = rq.weight_split, self.platform.fake_round
                A.put(args, kwargs, plan.acts[1], split_operand_fake(b, in_infos[1].scale, k, fr))
        if r.gemm and _int16_operands(in_infos, rq, wq):
            dts = [i.dtype for i in in_infos if i is not None]
            if split_b:  # both passes take the int8 halves of the second operand
                dts = dts[:1] + [DType.INT8]
            self._check_gemm(name, call.op_type, dts + ([rq.weight_dtype] if wq else []))
        if r.grid:
            self._check_grid(name, A.get(args, kwargs, plan.acts[0]).shape)
            grid_info = in_infos[1] if len(in_infos) > 1 else None
            if fake and (grid_info is None or grid_info.dtype.is_int):
                # an integer grid chain: the grid is int16 at its fixed scale (not a float16 one)
                fake_grid(self.platform, args, kwargs, plan)
        quant_out = r.quant_out
        clamp = self._fused_clamp(name) if chain else None
        if r.deployed_kernel:
            res = fixed_lut.run_deployed(self, call, plan, args, kwargs, in_infos, rq)
            if res is not None:
                return res
        if r.single_period:
            fake_single_period(self.platform, args, kwargs, plan, in_infos[0])
        if r.fake_kernel is not None:  # the QAT form of a composite, or of a clipped LUT input
            made = r.fake_kernel(self, call, plan, in_infos, rq, r.deployed)
            res = None if made is None else made.compute(args, kwargs)
            if res is not None:
                if made.deps is not None and st.mode is Mode.FAKE and om is None and st.steady():
                    prep = steady_prepare.prepare_composite(
                        self, call, r, plan, in_infos, arrived, made, *res
                    )
                    if prep is not None:
                        self._prepared[name, Mode.FAKE] = prep
                return res
        if mode is Mode.FIXED:
            if quant_out and call.category is OpCategory.GEMM:
                res, run = fixed_gemm.run_gemm(
                    self, call, plan, args, kwargs, in_infos, wq, rq, clamp
                )
                if run is not None and om is None and st.steady():
                    prep = steady_prepare.prepare_fixed_gemm(
                        self, call, r, plan, in_infos, arrived, wq, run, (args, kwargs), *res
                    )
                    if prep is not None:
                        self._prepared[name, Mode.FIXED] = prep
            else:
                res = fixed_ops.run_fixed(
                    self, call, plan, args, kwargs, in_infos, wq, rq, quant_out, clamp
                )
                if res is not None and om is None and st.steady():
                    self._prepare_fixed_op(call, r, plan, in_infos, arrived, wq, clamp, res)
            if res is not None:
                self._fixed_in_float.discard(name)
                return res
            if (
                quant_out
                and rq.output_dtype.is_int
                and call.category is not OpCategory.PASS_THROUGH
            ):
                # an integer output no fixed kernel took: computed in float (a float16 output
                # on J6H/P is computed in float by design)
                self._fixed_in_float.add(name)
        out = r.fn(*args, **kwargs)
        fuse = clamp is not None and r.fuse_clamp  # fake quant applies the fused clamp
        if clamp and not fuse:
            out = torch.clamp(out, clamp[0], clamp[1])
        bounds = clamp if fuse else None
        res = self._quant_output(call, out, in_infos, rq, quant_out, mode, bounds, (args, kwargs))
        if (
            mode is Mode.FIXED
            and call.op_type in same_grid.LAYOUT_OPS
            and isinstance(res[1], list)
            and not calls.is_inplace(call)
            and not same_grid.constant_pad(call)  # its fill is no code of the input
        ):  # a layout op moves the codes as it moves the values
            infos = same_grid.layout_codes(
                r.fn, args, kwargs, plan.acts[0], in_infos[0], out, res[1]
            )
            res = (res[0], infos)
        if st.mode is Mode.FAKE and om is None and st.steady():
            prep = steady_prepare.prepare(
                self, call, r, plan, in_infos, arrived, wq, args, kwargs, bounds, *res
            )
            if prep is not None:
                self._prepared[name, Mode.FAKE] = prep
        elif st.mode is Mode.FIXED and om is None and st.steady():
            prep = steady_prepare.prepare_fixed_layout(self, call, r, plan, in_infos, arrived, *res)
            if prep is not None:
                self._prepared[name, Mode.FIXED] = prep
            else:  # no fixed kernel: computed in float, its output quantized
                self._prepare_fixed_op(call, r, plan, in_infos, arrived, wq, clamp, res)
        return res

    def _prepare_fixed_op(self, call, r, plan, in_infos, arrived, wq, clamp, res) -> None:
        """Keep ``steady_prepare.prepare_fixed_op`` of a steady FIXED call that gave ``res``
        with no weight and no fused clamp (by its fixed kernel, or in float and quantized)."""
        if wq is None and clamp is None:
            prep = steady_prepare.prepare_fixed_op(self, call, r, plan, in_infos, arrived, *res)
            if prep is not None:
                self._prepared[call.name, Mode.FIXED] = prep

    def _fused_clamp(self, name: str) -> tuple | None:
        for c in self._chain.get(name, []):
            inf = self._info[c]
            if inf.op_type != "batch_norm":
                return inf.post
        return None

    def _quant_output(self, call, out, in_infos, rq, quant_out, mode, bounds=None, used=None):
        """(value, QInfo) of the op's result ``out`` quantized at its output (``used``: the
        (args, kwargs) the op ran with; where ``out`` is a fresh tensor of theirs,
        ``args.fresh_result``, a FAKE fake quant may overwrite it)."""
        if call.category is OpCategory.PASS_THROUGH:
            src = in_infos[0] if in_infos else None
            if src is None or src.dtype.is_float:
                return out, src
            snap = same_grid.SNAPS.get(call.op_type)
            if snap is not None:  # masked_fill's fill, where's number, abs's largest value
                out = snap(call, out, src, self.platform.fake_round)
            leaves = tree_flatten(out)[0]  # max over a dimension: its indices are no activation
            return out, [
                QInfo(src.dtype, src.scale, zero_point=src.zero_point)
                if A.is_float_tensor(leaf)
                else None
                for leaf in leaves
            ]
        if not quant_out or not A.is_float_tensor(out):
            return out, None
        src = in_infos[0] if in_infos else None
        held = call.category is OpCategory.GRID_SAMPLE or (
            call.category is OpCategory.RESAMPLE and keeps_input_quantization(call, self.platform)
        )
        if held and src is not None and src.dtype.is_int:
            zp = src.zero_point
            codes = self.platform.quantize_codes(out, src.scale, src.dtype, zp)
            return dequantize(codes, src.scale, zero_point=zp), QInfo(
                src.dtype, src.scale, zero_point=zp
            )
        if call.category is OpCategory.GEMM and rq.high_precision_output:
            return out, None
        owned = call.category is OpCategory.GEMM or (  # only a fake quant writes in place
            mode is not Mode.FIXED and used is not None and A.fresh_result(out, *used)
        )
        return self.quantize_act(call.name, "out", out, rq.output_dtype, rq, mode, bounds, owned)


def _int16_operands(in_infos: list, rq, wq) -> bool:
    """Whether a GEMM may have two INT16 operands (only then ``_check_gemm`` has work; an
    upper bound: the split operand is counted too)."""
    n16 = 1 if wq is not None and rq.weight_dtype is DType.INT16 else 0
    for info in in_infos:
        if info is not None and info.dtype is DType.INT16:
            n16 += 1
    return n16 >= 2
