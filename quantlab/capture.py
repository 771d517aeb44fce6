"""Op capture while an unmodified eager model runs, with stable op names.

A ``torch.overrides.TorchFunctionMode`` sees every torch function call (``F.conv2d``,
``torch.sigmoid``, ``x + y``, ``x[..., :2]``, ...). The module path comes from a stack that every
module call pushes and pops while a ``ModuleTracker`` is active, so nothing is traced and Python
control flow works.

Op names are ``<module path>:<op_type>#<k>`` where k counts the calls of that op type inside
that module during one forward (module path "" for the top level), e.g.
``features.0.0:conv2d#0`` or ``:add#1``.

A torch call that composes other ops (attention: ``quantlab.decompositions``) is captured as
those ops, each named and quantized on its own.
"""

from __future__ import annotations

import enum
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

import quantlab.ops
from quantlab.decompositions import (
    SPLIT,
    decomposition,
)


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
_reg("relu relu_", "relu", OpCategory.PASS_THROUGH)
_reg("amax amin", None, OpCategory.PASS_THROUGH)  # a maximum / minimum is one of its inputs
_reg("avg_pool1d avg_pool2d adaptive_avg_pool1d adaptive_avg_pool2d", None, OpCategory.POOL)
_reg("interpolate", None, OpCategory.RESAMPLE)
_reg("grid_sample", None, OpCategory.GRID_SAMPLE)
_reg(
    "sigmoid tanh exp log sqrt rsqrt sin cos erf gelu silu hardsigmoid hardswish leaky_relu "
    "prelu elu softplus",
    None,
    OpCategory.LUT,
)
# in-place methods
_reg("sigmoid_ tanh_ exp_ log_ sqrt_ rsqrt_ sin_ cos_ erf_", None, OpCategory.LUT)
_reg("softmax", None, OpCategory.SOFTMAX)
_reg("log_softmax", None, OpCategory.LOG_SOFTMAX)
_reg("layer_norm group_norm instance_norm", None, OpCategory.NORM)
_reg("embedding", None, OpCategory.EMBEDDING)
_reg("batch_norm", None, OpCategory.NORM)

# functions whose __name__ is not telling (boolean_dispatch wrappers, model-level patterns)
_BY_IDENTITY: dict[Any, tuple[str, OpCategory]] = {
    F.max_pool1d: ("max_pool1d", OpCategory.PASS_THROUGH),
    F.max_pool2d: ("max_pool2d", OpCategory.PASS_THROUGH),
    F.adaptive_max_pool2d: ("adaptive_max_pool2d", OpCategory.PASS_THROUGH),
    quantlab.ops.inverse_sigmoid: ("inverse_sigmoid", OpCategory.LUT),
}

# calls that never produce a new activation (metadata, casts we follow as the same tensor)
_IGNORED = frozenset(
    "size dim numel __get__ __len__ __format__ __repr__ __bool__ __index__ __int__ __float__ "
    "item tolist stride is_contiguous is_floating_point data_ptr element_size __eq__ __ne__ "
    "__lt__ __le__ __gt__ __ge__ eq ne lt le gt ge isnan isinf isfinite any all argmax argmin "
    "__hash__ __iter__ __setstate__ __reduce_ex__ __deepcopy__ requires_grad_ type dtype "
    "device shape".split()
)

_POW_NAMES = frozenset("pow __pow__ pow_ __ipow__".split())  # tensor ** exponent
_CAST_NAMES = frozenset(("to", "float", "type_as"))  # x.to(...), x.float(), x.type_as(y)


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


KNOWN_OP_TYPES = frozenset(
    {t for t, _ in _BY_NAME.values()} | {t for t, _ in _BY_IDENTITY.values()} | {"relu6", "pow"}
)


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


@dataclass(slots=True)
class OpCall:
    """One captured call: its stable name and what was called with what."""

    name: str
    op_type: str
    category: OpCategory | None  # None: not modelled (runs in float)
    module: str
    call_index: int
    func: Callable
    args: tuple
    kwargs: dict
    result: Any = None  # already computed (ops that are not modelled run before the handler)

    def run(self, args: tuple | None = None, kwargs: dict | None = None) -> Any:
        """Call the original function (with replaced arguments if given)."""
        return self.func(*(self.args if args is None else args), **(kwargs or self.kwargs))


class ModuleTracker:
    """Module path stack kept by every module call while the tracker is active.

    A module the model did not hold when the tracker was made is named by its type under its
    caller's path, and runs in eval mode: its entry clears its train flag and lists it in
    ``switched`` (the caller restores the flag after the run)."""

    def __init__(self, model: nn.Module) -> None:
        # id -> (module, name): the entry holds its module, so no other object can take its id
        self._names = {id(m): (m, n) for n, m in model.named_modules()}
        self._modules = [m for m, _ in self._names.values()]
        self.stack: list[str] = [""]
        self.switched: list[nn.Module] = []

    def _enter(self, module: nn.Module) -> None:
        """``module`` is called: push its path."""
        entry = self._names.get(id(module))
        if entry is not None and entry[0] is module:
            self.stack.append(entry[1])
            return
        if module.training:
            module.training = False
            self.switched.append(module)
        parent = self.stack[-1]
        self.stack.append(f"{parent}.{type(module).__name__}" if parent else type(module).__name__)

    def _exit(self) -> None:
        """The innermost module call returned or raised: pop its path."""
        stack = self.stack
        if len(stack) > 1:
            stack.pop()

    def training_modules(self) -> list[nn.Module]:
        """The model's modules (as of the tracker's making) whose train flag is set."""
        return [m for m in self._modules if m.training]

    def __enter__(self) -> ModuleTracker:
        self.stack = [""]
        self.switched = []
        _activate(self)
        return self

    def __exit__(self, *exc) -> None:
        _deactivate(self)

    @property
    def current(self) -> str:
        return self.stack[-1]


# The active trackers, innermost last. While there is one, ``nn.Module._call_impl`` (what
# ``module(...)`` runs) is ``_tracked_call_impl``: it tells each active tracker before and after
# the call, also when the call raises, as global forward pre- and post-hooks would. Global hooks
# would send every module call in the process down torch's hook path, about 5 us each here
# against about 1 us for the wrapper (MobileNetV2: 213 module calls per forward).
_ACTIVE: list[ModuleTracker] = []
_PLAIN_CALL_IMPL: list = []  # the unwrapped nn.Module._call_impl while the wrapper is in place


def _tracked_call_impl(module: nn.Module, *args, **kwargs):
    call_impl = _PLAIN_CALL_IMPL[0]
    if len(_ACTIVE) == 1:
        tracker = _ACTIVE[0]
        tracker._enter(module)
        try:
            return call_impl(module, *args, **kwargs)
        finally:
            tracker._exit()
    trackers = tuple(_ACTIVE)
    for t in trackers:
        t._enter(module)
    try:
        return call_impl(module, *args, **kwargs)
    finally:
        for t in reversed(trackers):
            t._exit()


def _activate(tracker: ModuleTracker) -> None:
    if not _ACTIVE:
        _PLAIN_CALL_IMPL[:] = [nn.Module.__dict__["_call_impl"]]
        nn.Module._call_impl = _tracked_call_impl
    _ACTIVE.append(tracker)


def _deactivate(tracker: ModuleTracker) -> None:
    for i in range(len(_ACTIVE) - 1, -1, -1):
        if _ACTIVE[i] is tracker:
            del _ACTIVE[i]
            break
    if not _ACTIVE and _PLAIN_CALL_IMPL:
        nn.Module._call_impl = _PLAIN_CALL_IMPL.pop()


Handler = Callable[[OpCall], Any]


class CaptureMode(TorchFunctionMode):
    """Name every op call and hand it to ``handler`` (which must return the op's result).

    A call on parameters alone (every positional tensor a parameter or a view of one) that
    writes nothing is no op: it makes a constant of the model, which a deployment folds (the
    rows nn.MultiheadAttention splits from its packed in-projection weight).

    Calls made by the handler itself are not captured (torch pops the mode while a handler runs).
    ``before``: told of every torch call first, ``before(func, args, kwargs, kind)`` with
    ``classify``'s kind, whether or not the call is captured (a call not handed to ``handler``
    runs right after it, as does a captured call of no category, before ``handler`` sees it;
    a decomposed call: each of its parts); it returns None, or the (args, kwargs) the call
    runs with instead.
    """

    def __init__(
        self,
        tracker: ModuleTracker,
        handler: Handler,
        on_mutation: Callable[[torch.Tensor], None] | None = None,
        before: Callable[[Callable, tuple, dict, tuple | None], tuple | None] | None = None,
    ) -> None:
        super().__init__()
        self.tracker = tracker
        self.handler = handler
        self.on_mutation = on_mutation
        self.before = before
        self.counts: dict[tuple[str, str], int] = defaultdict(int)
        self.decomposed = False  # whether a call ran as its parts (quantlab.decompositions)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        if func in SPLIT:
            parts = decomposition(func, args, kwargs)
            if parts is not None:
                self.decomposed = True
                with self:  # the mode is popped while it handles a call: the parts come back
                    return parts()
        kind = classify(func, args, kwargs)
        if self.before is not None:
            swapped = self.before(func, args, kwargs, kind)
            if swapped is not None:
                args, kwargs = swapped
        if kind is None or not _has_float_tensor(args, kwargs) or _model_constant(func, args):
            return func(*args, **kwargs)
        op_type, category = kind
        result = None
        if category is None:
            result = func(*args, **kwargs)
            if mutates(func) and self.on_mutation is not None and isinstance(args[0], torch.Tensor):
                self.on_mutation(args[0])
            if not is_float_output(result):
                return result
        module = self.tracker.stack[-1]
        counts = self.counts
        key = (module, op_type)
        k = counts[key]
        counts[key] = k + 1
        call = OpCall(
            f"{module}:{op_type}#{k}", op_type, category, module, k, func, args, kwargs, result
        )
        return self.handler(call)


# Python's in-place operators by their binary operator's name (add: ``__iadd__``, ``operator.iadd``)
IN_PLACE_OPERATORS = tuple(
    "add sub mul matmul truediv floordiv mod pow lshift rshift and or xor".split()
)
# item assignment and every in-place operator (in-place methods' names end with "_")
_MUTATING = frozenset({"__setitem__"} | {f"__i{op}__" for op in IN_PLACE_OPERATORS})


def out_of_place_name(func: Callable) -> str:
    """``func``'s name without torch's in-place marking: ``clamp_min_`` -> ``clamp_min``,
    ``__iadd__`` -> ``__add__``; other names as they are."""
    name = getattr(func, "__name__", "")
    if name in _MUTATING and name.startswith("__i"):
        return "__" + name[3:]
    if name.endswith("_") and not name.startswith("_"):
        return name[:-1]
    return name


def mutates(func: Callable) -> bool:
    """Whether ``func`` changes its first argument in place (by torch's naming: ``add_``,
    ``__setitem__`` and the in-place operators)."""
    fname = getattr(func, "__name__", "")
    return fname.endswith("_") and not fname.startswith("_") or fname in _MUTATING


def is_float_output(out) -> bool:
    """Whether a call's result is (or holds) a floating-point tensor."""
    if isinstance(out, torch.Tensor):
        return out.is_floating_point()
    if isinstance(out, (list, tuple)):
        return any(isinstance(o, torch.Tensor) and o.is_floating_point() for o in out)
    return False


def _model_constant(func: Callable, args: tuple) -> bool:
    """Whether the call makes a constant of the model (class docstring): every positional
    tensor argument, and there is one, an ``nn.Parameter`` (not a subclass) or a view of one,
    and nothing written."""
    found = False
    for a in args:  # an activation is usually the first argument: the loop ends there
        if isinstance(a, torch.Tensor):
            if type(a) is not _PARAMETER and not views_parameter(a):
                return False
            found = True
    return found and not mutates(func)


def views_parameter(t: torch.Tensor) -> bool:
    """Whether ``t`` is a view of an ``nn.Parameter`` (rows split from a packed weight).
    Type tests, not isinstance: nn.Parameter's isinstance hook is slow for a per-call test."""
    return type(t._base) is _PARAMETER


_PARAMETER = nn.Parameter


def _has_float_tensor(args, kwargs) -> bool:
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.is_floating_point():
                return True
        elif isinstance(a, (list, tuple)) and _any_float_tensor(a):
            return True
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, torch.Tensor):
                if a.is_floating_point():
                    return True
            elif isinstance(a, (list, tuple)) and _any_float_tensor(a):
                return True
    return False


def _any_float_tensor(seq) -> bool:
    for b in seq:
        if isinstance(b, torch.Tensor) and b.is_floating_point():
            return True
    return False
