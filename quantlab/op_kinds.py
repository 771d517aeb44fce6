"""Which op a torch call is: its op type and ``OpCategory`` (how quantlab simulates it), or
None for a call that is not an op (metadata, comparisons).

``classify(func, args, kwargs)`` answers by the function's identity, then by its ``__name__``
(the functional, tensor-method and in-place spellings of one op share one op type), by the
arguments for hardtanh (relu6 or clamp), pow (its exponent), casts, max / min (of one tensor,
or of two: maximum / minimum), pad (its mode) and where (its operands). ``KNOWN_OP_TYPES``
lists every op type quantlab models. Op capture (``quantlab.capture``) names and records the
calls this module classifies.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

import quantlab.ops


class OpCategory(enum.Enum):
    """How an op is simulated.

    GEMM: conv/linear/matmul (integer GEMM + requantization in fixed mode).
    ADD / MUL / DIV: elementwise arithmetic (tensor or scalar operands).
    PASS_THROUGH: moves or selects values (reshape, slicing, relu, max pooling): keeps scale.
    REQUANT: merges or clamps values and requantizes to its own output scale (cat, stack, clamp).
    LUT: unary nonlinear function (segment look-up table in fixed mode).
    REDUCE: sum / mean; POOL: average pooling; SOFTMAX; NORM: layer_norm, group_norm,
    instance_norm, batch_norm; RESAMPLE: interpolate; GRID_SAMPLE;
    EMBEDDING: a table gathered by integer ids (F.embedding).
    """

    __hash__ = object.__hash__  # members are singletons: identity hashing, done in C

    GEMM = "gemm"
    ADD = "add"
    MUL = "mul"
    DIV = "div"
    PASS_THROUGH = "pass_through"
    REQUANT = "requant"
    LUT = "lut"
    REDUCE = "reduce"
    POOL = "pool"
    SOFTMAX = "softmax"
    LOG_SOFTMAX = "log_softmax"
    NORM = "norm"
    RESAMPLE = "resample"
    GRID_SAMPLE = "grid_sample"
    EMBEDDING = "embedding"


# function __name__ -> (op_type, category)
_BY_NAME: dict[str, tuple[str, OpCategory]] = {}


def _reg(names: str, op_type: str | None, cat: OpCategory) -> None:
    for n in names.split():
        _BY_NAME[n] = (op_type or n.strip("_"), cat)


_reg("conv1d", None, OpCategory.GEMM)
_reg("conv2d", None, OpCategory.GEMM)
_reg("conv_transpose1d", None, OpCategory.GEMM)
_reg("conv_transpose2d", None, OpCategory.GEMM)
_reg("linear", None, OpCategory.GEMM)
_reg("matmul bmm mm __matmul__ __rmatmul__", "matmul", OpCategory.GEMM)
_reg("add __add__ __radd__ __iadd__ add_", "add", OpCategory.ADD)
_reg("sub __sub__ __rsub__ __isub__ sub_ subtract subtract_ rsub", "sub", OpCategory.ADD)
_reg("mul __mul__ __rmul__ __imul__ mul_ multiply multiply_", "mul", OpCategory.MUL)
_reg(
    "div __truediv__ __rtruediv__ __rdiv__ __div__ __itruediv__ div_ true_divide true_divide_ "
    "divide divide_",
    "div",
    OpCategory.DIV,
)
_reg("reciprocal reciprocal_", None, OpCategory.LUT)
_reg("sum", None, OpCategory.REDUCE)
_reg("mean", None, OpCategory.REDUCE)
_reg("cat concat concatenate", "cat", OpCategory.REQUANT)
_reg("stack", None, OpCategory.REQUANT)
_reg(
    "clamp clip clamp_min clamp_max clamp_ clip_ clamp_min_ clamp_max_", "clamp", OpCategory.REQUANT
)
_reg("relu6", None, OpCategory.REQUANT)  # F.relu6; nn.ReLU6 calls hardtanh(0, 6)
_reg(
    "reshape view permute transpose t flatten squeeze unsqueeze contiguous expand expand_as "
    "chunk split unbind flip narrow select repeat view_as reshape_as movedim clone detach "
    "unflatten __getitem__ pixel_shuffle pixel_unshuffle",
    None,
    OpCategory.PASS_THROUGH,
)
# select or repeat values: the J6 plugin's QTensor keeps the scale (its wrap-ret ops)
_reg(
    "roll tile index_select gather repeat_interleave tril tril_ triu triu_ unfold "
    "channel_shuffle native_channel_shuffle",
    None,
    OpCategory.PASS_THROUGH,
)
_reg("relu relu_", "relu", OpCategory.PASS_THROUGH)
# |x| keeps the scale; only the lowest code's magnitude saturates (same_grid.snap_abs)
_reg("abs abs_ absolute absolute_", "abs", OpCategory.PASS_THROUGH)
_reg("amax amin", None, OpCategory.PASS_THROUGH)  # a maximum / minimum is one of its inputs
# orderings and order statistics: every value is one of the input's (int64 indices aside)
_reg("topk sort msort kthvalue median cummax cummin", None, OpCategory.PASS_THROUGH)
# finite values pass unchanged (quantized values are finite): the identity there
_reg("nan_to_num", None, OpCategory.PASS_THROUGH)
# every value is an input value or the fill, which takes the input's quantization (the J6
# plugin's QTensor masked_fill: the fill quantized at the input's scale, saturating)
_reg("masked_fill masked_fill_", "masked_fill", OpCategory.PASS_THROUGH)
_reg("avg_pool1d avg_pool2d adaptive_avg_pool1d adaptive_avg_pool2d", None, OpCategory.POOL)
_reg("interpolate", None, OpCategory.RESAMPLE)
_reg("grid_sample", None, OpCategory.GRID_SAMPLE)
_reg(
    "sigmoid tanh exp log sqrt rsqrt sin cos erf gelu silu hardsigmoid hardswish leaky_relu "
    "prelu elu softplus tan atan sinh cosh atanh asinh asin acos acosh mish log_sigmoid "
    "softsign selu tanhshrink expm1 exp2 erfc log2 log10 log1p celu",
    None,
    OpCategory.LUT,
)
_reg("logit logit_", "logit", OpCategory.LUT)  # inverse_sigmoid's table at the call's eps
# in-place methods
_reg(
    "sigmoid_ tanh_ exp_ log_ sqrt_ rsqrt_ sin_ cos_ erf_ tan_ atan_ sinh_ cosh_ atanh_ asinh_ "
    "asin_ acos_ acosh_ expm1_ exp2_ erfc_ log2_ log10_ log1p_ celu_",
    None,
    OpCategory.LUT,
)
# numpy-style aliases (torch.arcsin is torch.asin's)
for _name in "arctan arcsinh arccosh arctanh arcsin arccos".split():
    _reg(f"{_name} {_name}_", _name.replace("arc", "a"), OpCategory.LUT)
# torch.special's spellings
for _name in "erfc expm1 exp2 log1p logit".split():
    _reg(f"special_{_name}", _name, OpCategory.LUT)
_reg("softmax", None, OpCategory.SOFTMAX)
_reg("log_softmax", None, OpCategory.LOG_SOFTMAX)
_reg("layer_norm group_norm instance_norm", None, OpCategory.NORM)
_reg("embedding", None, OpCategory.EMBEDDING)
_reg("batch_norm", None, OpCategory.NORM)

# functions whose __name__ is not telling (boolean_dispatch wrappers, model-level patterns)
_BY_IDENTITY: dict[Any, tuple[str, OpCategory]] = {
    F.max_pool1d: ("max_pool1d", OpCategory.PASS_THROUGH),
    F.max_pool2d: ("max_pool2d", OpCategory.PASS_THROUGH),
    F.adaptive_max_pool1d: ("adaptive_max_pool1d", OpCategory.PASS_THROUGH),
    F.adaptive_max_pool2d: ("adaptive_max_pool2d", OpCategory.PASS_THROUGH),
    quantlab.ops.inverse_sigmoid: ("inverse_sigmoid", OpCategory.LUT),
}

# calls that never produce a new activation (metadata, casts we follow as the same tensor)
_IGNORED = frozenset(
    "size dim numel __get__ __len__ __format__ __repr__ __bool__ __index__ __int__ __float__ "
    "item tolist stride is_contiguous is_floating_point data_ptr element_size __eq__ __ne__ "
    "__lt__ __le__ __gt__ __ge__ eq ne lt le gt ge greater greater_equal less less_equal "
    "not_equal isnan isinf isfinite any all argmax argmin "
    "__hash__ __iter__ __setstate__ __reduce_ex__ __deepcopy__ requires_grad_ type dtype "
    "device shape".split()
)

_POW_NAMES = frozenset("pow __pow__ pow_ __ipow__".split())  # tensor ** exponent
_CAST_NAMES = frozenset(("to", "float", "type_as"))  # x.to(...), x.float(), x.type_as(y)
_EXTREME_NAMES = frozenset(("max", "min"))  # torch.max / Tensor.max, torch.min / Tensor.min
# padding that copies input values (F.pad's reflect, replicate and circular modes)
COPYING_PAD_MODES = frozenset(("reflect", "replicate", "circular"))


def _cast_kind(name: str, args: tuple, kwargs: dict) -> tuple[str, OpCategory | None]:
    """A cast that keeps a float tensor's dtype (``x.to(device)``, ``x.float()`` of a float32
    tensor, ``x.to(y)`` or ``x.type_as(y)`` of y's dtype) returns the same values: a
    pass-through op, as ``contiguous`` is; any other cast is not modelled (a float16 cast runs
    in float)."""
    x = args[0] if args else kwargs.get("self", kwargs.get("input"))
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return name, None
    target = torch.float32 if name == "float" else kwargs.get("dtype")
    for a in args[1:]:
        if isinstance(a, torch.dtype):
            target = a
        elif isinstance(a, torch.Tensor):
            target = a.dtype
    return name, OpCategory.PASS_THROUGH if target in (None, x.dtype) else None


# ops that are the identity in eval mode: not modelled, and dropped by a deployment export
EVAL_IDENTITY_TYPES = frozenset(
    ("dropout", "dropout1d", "dropout2d", "alpha_dropout", "feature_alpha_dropout")
)

KNOWN_OP_TYPES = frozenset(
    {t for t, _ in _BY_NAME.values()}
    | {t for t, _ in _BY_IDENTITY.values()}
    | {"relu6", "pow", "max", "min", "maximum", "minimum", "pad", "where"}
    | _CAST_NAMES
)


_PAIR_NAMES = {"max": "maximum", "min": "minimum", "maximum": "maximum", "minimum": "minimum"}


def _pair_extreme_kind(name: str, args: tuple, kwargs: dict) -> tuple[str, OpCategory | None]:
    """The elementwise maximum / minimum of two tensors (``torch.maximum(x, y)``,
    ``torch.max(x, y)``): of two float tensors a select that requantizes both to its output
    scale (as cat does its inputs); through ``out=`` or of anything else, not modelled."""
    kind = _PAIR_NAMES[name]
    x = args[0] if args else kwargs.get("input")
    y = args[1] if len(args) > 1 else kwargs.get("other")
    if len(args) > 2 or not set(kwargs) <= {"input", "other"}:
        return kind, None
    return kind, OpCategory.REQUANT if has_values(x) and has_values(y) else None


def _extreme_kind(name: str, args: tuple, kwargs: dict) -> tuple[str, OpCategory | None]:
    """torch.max / torch.min of one float tensor, of all its elements or over a dimension (the
    values and their indices): every value is one of its inputs, a pass-through op as amax
    is; of two tensors (elementwise), ``_pair_extreme_kind``; written through ``out=``: not
    modelled."""
    other = args[1] if len(args) > 1 else kwargs.get("other")
    if isinstance(other, Tensor):
        return _pair_extreme_kind(name, args, kwargs)
    x = args[0] if args else kwargs.get("input")
    second = args[1] if len(args) > 1 else kwargs.get("dim")
    one_tensor = second is None or (isinstance(second, int) and not isinstance(second, bool))
    if (
        isinstance(x, Tensor)
        and x.is_floating_point()
        and one_tensor
        and not {"other", "out"} & kwargs.keys()
    ):
        return name, OpCategory.PASS_THROUGH
    return name, None


WHERE_PARAMS = ("condition", "input", "other")


def has_values(v: Any) -> bool:
    """Whether ``v`` is a float tensor of at least one dimension (an operand with values, not
    a number)."""
    return isinstance(v, Tensor) and v.is_floating_point() and v.dim() > 0


def _constant(v: Any) -> bool:
    """Whether ``v`` is one number: a Python int or float, or a 0-d float tensor that needs no
    gradient."""
    if isinstance(v, Tensor):
        return v.dim() == 0 and v.is_floating_point() and not v.requires_grad
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _where_kind(func: Callable, args: tuple, kwargs: dict) -> tuple[str, OpCategory | None]:
    """torch.where(condition, input, other) with a bool condition: of two float tensors, a
    select that requantizes both to its output scale (as cat does); of one float tensor and
    one number, a pass-through op whose number is quantized on the tensor's grid (as
    masked_fill's fill). Any other where (``Tensor.where``, ``out=``, integer operands, two
    numbers) is not modelled."""
    if func is not torch.where or len(args) > 3 or not set(kwargs) <= set(WHERE_PARAMS):
        return "where", None
    cond, x, y = (args[i] if i < len(args) else kwargs.get(n) for i, n in enumerate(WHERE_PARAMS))
    if not isinstance(cond, Tensor) or cond.dtype != torch.bool:
        return "where", None
    if has_values(x) and has_values(y):
        return "where", OpCategory.REQUANT
    if (has_values(x) and _constant(y)) or (_constant(x) and has_values(y)):
        return "where", OpCategory.PASS_THROUGH
    return "where", None


def _pad_kind(args: tuple, kwargs: dict) -> tuple[str, OpCategory | None]:
    """F.pad: a pass-through op in a mode that copies input values (``COPYING_PAD_MODES``),
    which moves the codes as it moves the values, and in mode "constant", whose fill is
    quantized on the input's grid (``simulate.same_grid.snap_pad``)."""
    mode = args[2] if len(args) > 2 else kwargs.get("mode", "constant")
    modelled = mode in COPYING_PAD_MODES or mode == "constant"
    return "pad", OpCategory.PASS_THROUGH if modelled else None


def scalar_exponent(e) -> float | None:
    """``e`` as one finite float exponent: a Python number, or a tensor of one value that
    needs no gradient; None for anything else (a tensor of exponents, a bool)."""
    if isinstance(e, Tensor):
        if e.numel() != 1 or e.requires_grad or e.dtype == torch.bool:
            return None
        e = e.item()
    if isinstance(e, bool) or not isinstance(e, (int, float)) or not math.isfinite(e):
        return None
    return float(e)


def pow_exponent(args: tuple, kwargs: dict) -> float | None:
    """The exponent of a ``tensor ** exponent`` call (``scalar_exponent``); None for anything
    else (a tensor of exponents, a scalar base)."""
    base = args[0] if args else kwargs.get("input", kwargs.get("self"))
    if not isinstance(base, Tensor) or not base.is_floating_point():
        return None
    return scalar_exponent(args[1] if len(args) > 1 else kwargs.get("exponent"))


def _pow_kind(args: tuple, kwargs: dict) -> tuple[str, OpCategory | None]:
    """pow as the vendor builds it: x * x for the exponent 2 (a MUL), a segment LUT of
    x ** e for any other scalar exponent; not modelled otherwise."""
    e = pow_exponent(args, kwargs)
    if e is None:
        return "pow", None
    return "pow", OpCategory.MUL if e == 2.0 else OpCategory.LUT


def classify(func: Callable, args: tuple, kwargs: dict) -> tuple[str, OpCategory | None] | None:
    """(op_type, category) of a torch function call; category None = an op quantlab does not
    model (it runs in float); None = not an op at all (metadata, comparisons)."""
    try:
        return _KIND_OF[func]
    except (KeyError, TypeError):  # not seen yet, or not hashable
        pass
    name = getattr(func, "__name__", "")
    if name == "hardtanh":
        lo = kwargs.get("min_val", args[1] if len(args) > 1 else -1.0)
        hi = kwargs.get("max_val", args[2] if len(args) > 2 else 1.0)
        if lo == 0.0 and hi == 6.0:
            return "relu6", OpCategory.REQUANT
        return "clamp", OpCategory.REQUANT
    if name in _POW_NAMES:
        return _pow_kind(args, kwargs)
    if name in _CAST_NAMES:  # by its arguments: never kept in _KIND_OF
        return _cast_kind(name, args, kwargs)
    if name in _EXTREME_NAMES:
        return _extreme_kind(name, args, kwargs)
    if name in ("maximum", "minimum"):
        return _pair_extreme_kind(name, args, kwargs)
    if name == "pad":
        return _pad_kind(args, kwargs)
    if name == "where":  # by its arguments: never kept in _KIND_OF
        return _where_kind(func, args, kwargs)
    kind = _classify_by_name(func, name)
    try:
        _KIND_OF[func] = kind  # a function's kind depends on the function alone (not hardtanh)
    except TypeError:
        pass
    return kind


def _classify_by_name(func: Callable, name: str) -> tuple[str, OpCategory | None] | None:
    hit = _BY_IDENTITY.get(func)
    if hit is not None:
        return hit
    hit = _BY_NAME.get(name)
    if hit is not None:
        return hit
    if name in _IGNORED:
        return None
    return name.strip("_") or type(func).__name__, None


_KIND_OF: dict[Any, tuple[str, OpCategory | None] | None] = dict(_BY_IDENTITY)
