"""Fixed-point GEMM kernels: conv1d/conv2d, conv_transpose1d/2d, linear, matmul (exact
integer sums, the platform's requantization, fused clamps), planned once per call's
value-independent decisions (``GemmRun``). The operands' codes and int16 rules are
``fixed_gemm_operands``; the high/low weight split and the int15 matmul split are
``fixed_gemm_split``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import Tensor

from quantlab.numerics import gemm
from quantlab.numerics.code_bounds import bound_codes
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm.exact import INTEGER_PATHS
from quantlab.simulate import args as A
from quantlab.simulate import fixed_common as fc
from quantlab.simulate.fixed_gemm_float import float_gemm, runs_in_float
from quantlab.simulate.fixed_gemm_operands import (
    int16_codes,
    int16_scale,
    magnitude,
    operand_codes,
    prepare_int16,
)
from quantlab.simulate.fixed_gemm_split import split_gemm, split_matmul
from quantlab.simulate.qtensor import QInfo


def _conv_channel_axis(op_type: str, acc) -> int:
    """The output-channel axis of a convolution's sums: 1 when batched, 0 when not."""
    return 1 if acc.dim() == (4 if op_type.endswith("2d") else 3) else 0


def _arrived_as(v: Any, info: Any, scale: Any, dtype: DType, zero_point: int, shape) -> bool:
    """Whether operand ``v`` with QInfo ``info`` has the scale object, dtype, zero point and
    shape a run was planned for."""
    return (
        info is not None
        and info.scale is scale
        and info.dtype is dtype
        and info.zero_point == zero_point
        and isinstance(v, Tensor)
        and tuple(v.shape) == shape
    )


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class GemmRun:
    """One GEMM's fixed-point run with every decision that does not read the operands' values
    made: the operands' dtypes, zero points and scales, the input shape, the kernel (planned
    convolution, int8 product, u8s8 pair saturation), the weight's GEMM codes, the bias and
    output scale, the fused clamp's codes and the requantization constants (``plan_gemm``).

    ``run(x_codes, b_codes)`` (a call of the run) takes the first operand's codes (its QInfo's
    ``codes_native``) and, for a matmul of two activations, the second's, and returns (value,
    QInfo) as the platform computes it: exact integer sums, then ``finish_gemm``. ``gemm_op``
    computes every fixed GEMM through it, so a run kept by a prepared call (``steady``) gives
    the same bits while its ``takes`` holds."""

    name: str
    op_type: str
    platform: Any
    x_shape: tuple
    x_dtype: DType
    x_zero_point: int
    x_scale: Tensor  # the first operand's scale as it arrived
    x_coarse: Tensor | None  # its coarsened int16 matmul scale (None: kept)
    w_codes: Tensor | None  # the weight's GEMM codes (None: a second activation operand)
    b_dtype: DType | None  # a second activation operand's dtype, zero point, scales
    b_zero_point: int
    b_scale: Tensor | None
    b_coarse: Tensor | None
    b_shape: tuple | None  # a second activation operand's shape
    kind: str  # "pairs", "conv", "conv_transpose", "linear" or "matmul"
    conv: Any  # gemm.PreparedConv of a weight's convolution (None: planned per call)
    params: dict  # a convolution's parameters (``args.conv_params``)
    w_float32: Tensor | None  # a linear weight's float32 cast for the float paths
    zx_u8: int  # "pairs": the uint8 input's zero point
    xs: Tensor  # the scales the sums are finished with
    ws: Tensor
    bias: Tensor | None
    out_scale: Tensor | None
    out_dtype: DType
    fin_dtype: DType
    zero_point: int
    contract: Any
    clamp: tuple | None
    clamp_codes: Any
    bound: int
    constants: Any
    cast_float: Any  # sim.cast_float (float16 outputs count their overflow in the run)
    memo: Any  # sim.op_memo (a convolution of two activations plans per call)

    def takes(self, x: Any, info: Any) -> bool:
        """Whether ``x``, arriving with QInfo ``info``, is an input this run was planned for:
        the same shape, dtype, zero point and scale object."""
        return _arrived_as(x, info, self.x_scale, self.x_dtype, self.x_zero_point, self.x_shape)

    def takes_second(self, b: Any, info: Any) -> bool:
        """``takes`` for a second activation operand ``b`` (a run planned with one)."""
        return _arrived_as(b, info, self.b_scale, self.b_dtype, self.b_zero_point, self.b_shape)

    def __call__(self, x_codes: Tensor, b_codes: Tensor | None = None) -> tuple:
        p = self.platform
        xc = gemm.centre_codes(x_codes, self.x_zero_point) if self.x_zero_point else x_codes
        xc = int16_codes(p, xc, self.x_scale, self.x_coarse, self.x_dtype)
        wc = self.w_codes
        if wc is None:
            bc = gemm.centre_codes(b_codes, self.b_zero_point) if self.b_zero_point else b_codes
            wc = int16_codes(p, bc, self.b_scale, self.b_coarse, self.b_dtype)
        kind = self.kind
        if kind == "pairs":  # the runtime's uint8 codes: x + 128 with zero point zx + 128
            raw = xc.to(torch.int16) + self.zx_u8
            if self.op_type == "linear":
                acc, axis = gemm.pair_saturated_matmul(raw, wc.t(), self.zx_u8), -1
            else:
                acc = gemm.pair_saturated_conv(raw, wc, self.zx_u8, **self.params)
                axis = _conv_channel_axis(self.op_type, acc)
        elif kind == "conv":
            conv = self.conv
            if conv is None:  # a convolution of two activations: planned per call
                conv = _prepared_conv(
                    self.memo,
                    self.name,
                    self.op_type,
                    self.params,
                    tuple(xc.shape),
                    xc.dtype,
                    wc,
                    False,
                )
            acc = conv(xc, as_int64=False)
            axis = _conv_channel_axis(self.op_type, acc)
        elif kind == "conv_transpose":
            acc = gemm.int_conv_transpose(xc, wc, **self.params, as_int64=False)
            axis = _conv_channel_axis(self.op_type, acc)
        elif kind == "linear":
            acc, axis = gemm.int_linear(xc, wc, as_int64=False, w_float32=self.w_float32), -1
        else:
            acc, axis = gemm.int_matmul(xc, wc, as_int64=False), -1
        fin_dt = self.fin_dtype
        res = gemm.finish_gemm(
            acc,
            self.xs,
            self.ws,
            self.bias,
            self.out_scale,
            fin_dt,
            self.contract,
            axis,
            clamp_codes=self.clamp_codes,
            sum_bound=self.bound,
            reuse_acc=True,
            out_zero_point=self.zero_point,
            constants=self.constants,
            with_values=fin_dt is not DType.FLOAT32,  # the codes' values in the same pass
        )
        if fin_dt is DType.FLOAT32:
            if self.clamp is not None:
                res = torch.clamp(res, self.clamp[0], self.clamp[1])
            if self.out_dtype is DType.FLOAT16:
                return self.cast_float(self.name, res, DType.FLOAT16), QInfo(DType.FLOAT16)
            return res, None
        return fc.emit(res[0], self.out_scale, self.out_dtype, self.zero_point, value=res[1])


def gemm_op(sim, call, plan, args, kwargs, in_infos, wq, rq, clamp=None):
    """(value, QInfo) of a fixed-mode GEMM, or None for the float fallback (``run_gemm``)."""
    return run_gemm(sim, call, plan, args, kwargs, in_infos, wq, rq, clamp)[0]


def run_gemm(sim, call, plan, args, kwargs, in_infos, wq, rq, clamp=None) -> tuple:
    """((value, QInfo) or None for the float fallback, the ``GemmRun`` that computed it or
    None) of a fixed-mode GEMM: ``plan_gemm``, then its run on the operands' codes."""
    made = plan_gemm(sim, call, plan, args, kwargs, in_infos, wq, rq, clamp)
    if not isinstance(made, GemmRun):
        return made, None  # None (the float fallback) or the result of a split GEMM
    x = fc.codes(args, kwargs, plan.acts[0], in_infos[0])
    b = None if wq is not None else fc.codes(args, kwargs, plan.acts[1], in_infos[1])
    return made(x, b), made


def plan_gemm(sim, call, plan, args, kwargs, in_infos, wq, rq, clamp=None):
    """The ``GemmRun`` of a fixed-mode GEMM call (``in_infos``: its activation inputs'
    QInfos; ``wq``: its weight's (codes, scale, float weight), None for a matmul of two
    activations; ``clamp``: the bounds of a fused relu6/clamp); None where the integer kernel
    does not apply (the float fallback); a split GEMM (``rq.weight_split``) is computed here
    and its (value, QInfo) returned."""
    p = sim.platform
    xi = in_infos[0]
    if not fc.zp_info(xi):
        return None
    if xi.zero_point and xi.dtype is not DType.INT8:
        fc.warn_float(
            call, f"an integer GEMM takes zero points on int8 operands only, not {xi.dtype.name}"
        )
        return None
    xs = xi.scale
    x = A.get(args, kwargs, plan.acts[0])
    matmul = call.op_type == "matmul"
    wi = None
    if wq is not None:
        wc, ws, w_float = wq
        wdt = rq.weight_dtype
        if rq.weight_split:
            if xi.zero_point:
                fc.warn_float(call, "the high/low weight split takes an input without a zero point")
                return None
            xc = operand_codes(args, kwargs, plan.acts[0], xi)
            return split_gemm(sim, call, plan, args, kwargs, xi, xc, w_float, ws, rq, clamp)
        w_shape = tuple(wc.shape)
    else:
        wi = in_infos[1] if len(in_infos) > 1 else None
        if not fc.zp_info(wi):
            return None
        if wi.zero_point and wi.dtype is not DType.INT8:
            fc.warn_float(
                call,
                f"an integer GEMM takes zero points on int8 operands only, not {wi.dtype.name}",
            )
            return None
        if rq.weight_split and matmul:
            xc = operand_codes(args, kwargs, plan.acts[0], xi)
            b = fc.codes(args, kwargs, plan.acts[1], in_infos[1])
            return split_matmul(sim, call, xi, xc, b, in_infos[1].scale, rq, clamp)
        wc, ws, wdt = None, wi.scale, wi.dtype
        w_shape = tuple(A.get(args, kwargs, plan.acts[1]).shape)
    if call.op_type == "linear" and wq is None:
        wq_axis_ok = ws.numel() == 1
        if not wq_axis_ok:
            return None
    transposed = call.op_type in A.TRANSPOSED
    hp_out = bool(rq.high_precision_output)
    if runs_in_float(p, xi.dtype, wdt, rq.output_dtype, hp_out, transposed):
        return float_gemm(sim, call, plan, args, kwargs, xi, wq, wi, rq, clamp)
    params = A.conv_params(call)
    if call.op_type in ("linear", "matmul"):
        k = x.shape[-1]
    elif transposed:
        k = (w_shape[0] // params.get("groups", 1)) * math.prod(w_shape[2:])
    else:
        k = math.prod(w_shape[1:])
    # the first operand's GEMM codes: in its own dtype, or centred on its zero point (int16)
    x_gemm = torch.int16 if xi.zero_point else xi.dtype.torch_dtype
    x_coarse = int16_scale(p, xs, xi.dtype, k, matmul)
    if x_coarse is not None:
        xs = x_coarse
    b_coarse = None
    if wq is not None and wdt is DType.INT16:  # a weight's int16 operand codes, made once
        w_in = (wc, ws)
        wc, ws = sim.op_memo(
            call.name,
            "int16_weight",
            (*w_in, p, k, matmul),
            lambda: prepare_int16(sim, *w_in, wdt, k, matmul),
        )
    elif wq is not None:
        wc = int16_codes(p, wc, ws, None, wdt)
    else:
        b_coarse = int16_scale(p, ws, wdt, k, matmul)
        if b_coarse is not None:
            ws = b_coarse
    zo = 0
    hp = rq.high_precision_output
    out_dt = p.high_precision_output if hp else rq.output_dtype
    # an INT32 high-precision output leaves as its float value, acc * fl32(s_x * s_w): the
    # FLOAT32 finish computes exactly that
    fin_dt = DType.FLOAT32 if out_dt.is_float or out_dt is DType.INT32 else out_dt
    out_scale = None
    if fin_dt is not DType.FLOAT32:
        out_scale, zo = fc.out_scale(sim, call, rq), fc.out_zero_point(sim, call, rq)
    bias = A.get(args, kwargs, plan.bias) if plan.bias is not None else None
    if call.op_type == "matmul":
        bias = None
    ccodes = None
    if clamp is not None and out_scale is not None:
        ccodes = sim.op_memo(
            call.name,
            "clamp_codes",
            (clamp, out_scale, out_dt, zo),
            lambda: bound_codes(clamp[0], clamp[1], out_scale, out_dt, zo, rule=p.bound_rule),
        )
    contract = sim.op_memo(
        call.name,
        "contract",
        (p, call.op_type, out_dt, xi.dtype, wdt),
        lambda: _checked_contract(p, call.op_type, out_dt, xi.dtype, wdt),
    )
    pairs = (
        p.u8s8_pair_saturation
        and p.qlinear_zero_point == 128
        and wq is not None
        and xi.dtype is DType.INT8
        and wc.dtype == torch.int8
        and (
            call.op_type == "linear"
            # a convolution with a wide output runs as ConvInteger, whose sums are exact
            or (call.op_type in ("conv1d", "conv2d") and fin_dt is not DType.FLOAT32)
        )
    )
    conv = w32 = None
    zx_u8 = 0
    if pairs:
        zx_u8 = int(xi.zero_point or 0) + 128
        if call.op_type != "linear" and isinstance(params.get("padding", 0), str):
            fc.warn_float(call, "u8s8_pair_saturation takes numeric convolution padding")
            return None
        kind = "pairs"
    elif transposed:
        kind = "conv_transpose"
    elif call.op_type in ("conv1d", "conv2d"):
        kind = "conv"
        if wq is not None:
            conv = _prepared_conv(
                sim.op_memo, call.name, call.op_type, params, tuple(x.shape), x_gemm, wc, True
            )
    elif call.op_type == "linear":
        kind = "linear"
        if wq is not None and not _takes_int8_product(sim, call, tuple(x.shape), x_gemm, wc):
            # a weight's float32 cast for the float paths, made once while its codes are the
            # same (the int8 matrix product reads the codes: no cast)
            w32 = sim.op_memo(call.name, "w_float32", (wc,), lambda: wc.to(torch.float32))
    else:
        if call.func.__name__ == "__rmatmul__":
            return None
        kind = "matmul"
    bound = k * magnitude(xi) * magnitude(wi, wdt)
    version = bias._version if bias is not None else None
    constants = sim.op_memo(  # scales and weight codes are cached objects, new when they change
        call.name,
        "finish",
        (xs, ws, bias, version, out_scale, fin_dt, contract),
        lambda: gemm.finish_constants(xs, ws, bias, out_scale, fin_dt, contract),
    )
    return GemmRun(
        name=call.name,
        op_type=call.op_type,
        platform=p,
        x_shape=tuple(x.shape),
        x_dtype=xi.dtype,
        x_zero_point=xi.zero_point,
        x_scale=xi.scale,
        x_coarse=x_coarse,
        w_codes=wc,
        b_dtype=None if wi is None else wi.dtype,
        b_zero_point=0 if wi is None else wi.zero_point,
        b_scale=None if wi is None else wi.scale,
        b_coarse=b_coarse,
        b_shape=None if wi is None else w_shape,
        kind=kind,
        conv=conv,
        params=params,
        w_float32=w32,
        zx_u8=zx_u8,
        xs=xs,
        ws=ws,
        bias=bias,
        out_scale=out_scale,
        out_dtype=out_dt,
        fin_dtype=fin_dt,
        zero_point=zo,
        contract=contract,
        clamp=clamp,
        clamp_codes=ccodes,
        bound=bound,
        constants=constants,
        cast_float=sim.cast_float,
        memo=sim.op_memo,
    )


def _takes_int8_product(sim, call, x_shape: tuple, x_dtype: torch.dtype, wc: Tensor) -> bool:
    """Whether the linear ``x @ wc.T`` (x: codes of ``x_shape`` and ``x_dtype``) runs on the
    int8 matrix product (plan INT32). Its plan reads no data for int8 x int8 codes (shapes and
    dtypes alone, here of a stand-in without data), so it is made once per input shape and
    weight."""
    if not (x_dtype == wc.dtype == torch.int8):
        return False

    def plan_path() -> bool:
        stand_in = torch.empty((), dtype=x_dtype).expand(x_shape)
        plan = gemm.plan_matmul(stand_in, wc.t(), disabled=gemm.auto_excluded())
        return plan.path is gemm.GemmPath.INT32

    return sim.op_memo(call.name, "int8_product", (x_shape, wc), plan_path)


def _prepared_conv(
    memo, name: str, op_type: str, params: dict, x_shape: tuple, x_dtype, wc: Tensor, weight: bool
) -> gemm.PreparedConv:
    """Op ``name``'s exact convolution of codes of ``x_shape`` and ``x_dtype`` by ``wc``,
    checked and planned once per input shape and dtype, weight codes and parameters
    (``gemm.prepare_conv``; ``memo``: the simulator's ``op_memo``); a weight's codes
    (``weight``) get their float32 cast made once with it, kept while the codes are the same
    tensor, unless the plan is an integer path (``exact.INTEGER_PATHS``: int8 products, the
    depthwise C loop, int64), which reads the codes themselves."""
    nsp = 2 if op_type == "conv2d" else 1

    def make():
        conv = gemm.prepare_conv(x_shape, x_dtype, wc, nsp, **params)
        if weight and (conv.plan is None or conv.plan.path not in INTEGER_PATHS):
            # the float paths' cast of the weight, made once (the same checks and plan)
            conv = dataclasses.replace(conv, w_float32=wc.to(torch.float32))
        return conv

    key = (x_shape, x_dtype, wc, tuple(params.items()))
    return memo(name, "conv", key, make)


def _checked_contract(p, op_type: str, out_dt: DType, x_dt: DType, w_dt: DType):
    """The platform's GEMM contract for this op, after checking its operand dtypes against it
    (centred int8 operands count as int8)."""
    contract = p.gemm_contract(op_type, out_dt is DType.INT32, activation=x_dt)
    as_coded = [torch.empty(0, dtype=d.torch_dtype) for d in (x_dt, w_dt)]
    gemm.check_gemm_operands(*as_coded, contract)
    return contract
