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

import itertools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from quantlab.decompositions import decomposition, splits
from quantlab.op_kinds import OpCategory, classify


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


# calls that draw random numbers: their results change from run to run, no export folds them
RANDOM = frozenset(
    "rand rand_like randn randn_like randint randint_like randperm normal normal_ uniform_ "
    "bernoulli bernoulli_ multinomial poisson exponential_ geometric_ cauchy_ log_normal_ "
    "random_".split()
)


class ModelConstants:
    """The tensors of one run whose values do not depend on the model's inputs: parameters and
    views of them, the ``seeds`` (the model's buffers), what a call with no tensor argument
    makes (``torch.arange``, ``torch.ones``), and what a call on such tensors alone makes.
    A deployment export folds them into constants (rotary sin/cos tables from ``arange`` and
    an ``inv_freq`` buffer, position embeddings gathered by a ``position_ids`` buffer, a
    window mask built from ``zeros`` and slicing). A tensor a call writes while reading
    anything else (``buf[:, :n] = x``) is one no longer, nor is the tensor it views.

    Holds every tensor it names until the run ends, so no id is reused meanwhile.
    """

    __slots__ = ("_held",)

    def __init__(self, seeds=()) -> None:
        self._held: dict[int, torch.Tensor] = {id(t): t for t in seeds}

    def holds(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is a constant of this run."""
        if id(t) in self._held or type(t) is _PARAMETER or views_parameter(t):
            return True
        return t._base is not None and id(t._base) in self._held

    def all_constant(self, func: Callable, args: tuple, kwargs: dict) -> bool:
        """Whether ``func`` makes a constant: it draws no random numbers (``RANDOM``) and every
        tensor among ``args`` and ``kwargs`` (and in their lists and tuples) is a constant;
        True for a call with no tensor argument."""
        if getattr(func, "__name__", "") in RANDOM:
            return False
        for a in itertools.chain(args, kwargs.values()):
            if isinstance(a, torch.Tensor):
                if not self.holds(a):
                    return False
            elif isinstance(a, (list, tuple)) and not all(
                self.holds(b) for b in a if isinstance(b, torch.Tensor)
            ):
                return False
        return True

    def add(self, out: Any) -> None:
        """Name the tensors of a constant call's result (a tensor, or a list or tuple of
        them) constants."""
        if isinstance(out, torch.Tensor):
            self._held[id(out)] = out
        elif isinstance(out, (list, tuple)):
            for o in out:
                if isinstance(o, torch.Tensor):
                    self._held[id(o)] = o

    def written(self, func: Callable, args: tuple, kwargs: dict) -> None:
        """A call that reads something else writes: its target, and the tensor the target
        views, are constants no longer."""
        target = kwargs.get("out")
        if not isinstance(target, torch.Tensor):
            if not (args and isinstance(args[0], torch.Tensor)):
                return
            if not (mutates(func) or kwargs.get("inplace")):
                return
            target = args[0]
        self._held.pop(id(target), None)
        if target._base is not None:
            self._held.pop(id(target._base), None)


_RUN_CONSTANTS: list[ModelConstants] = []  # the constants of the captures in progress


def is_run_constant(t: torch.Tensor) -> bool:
    """Whether ``t`` is a constant of the innermost capture in progress (``ModelConstants``):
    a GEMM takes such a tensor as its weight, as a parameter."""
    return bool(_RUN_CONSTANTS) and _RUN_CONSTANTS[-1].holds(t)


def model_constants(model: nn.Module) -> ModelConstants:
    """A run's ``ModelConstants``, seeded with ``model``'s buffers."""
    return ModelConstants(model.buffers())


class CaptureMode(TorchFunctionMode):
    """Name every op call and hand it to ``handler`` (which must return the op's result).

    A call on constants alone (``ModelConstants``: parameters, the model's buffers, what calls
    with no tensor argument make and what is made from those) that writes nothing is no op:
    it makes a constant of the model, which a deployment folds (the rows
    nn.MultiheadAttention splits from its packed in-projection weight, a rotary sin/cos table,
    a position embedding gathered by a buffer of positions). It runs as called; its result
    is a constant too. Without ``constants`` the model's buffers are not among them.

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
        constants: ModelConstants | None = None,
    ) -> None:
        super().__init__()
        self.tracker = tracker
        self.handler = handler
        self.on_mutation = on_mutation
        self.before = before
        self.constants = constants if constants is not None else ModelConstants()
        self.counts: dict[tuple[str, str], int] = defaultdict(int)
        self.decomposed = False  # whether a call ran as its parts (quantlab.decompositions)

    def __enter__(self):
        _RUN_CONSTANTS.append(self.constants)
        return super().__enter__()

    def __exit__(self, *exc):
        _RUN_CONSTANTS.pop()
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        if splits(func):
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
        constants = self.constants
        if constants.all_constant(func, args, kwargs):
            result = func(*args, **kwargs)
            constants.add(result)
            return result
        constants.written(func, args, kwargs)
        if kind is None or not _has_float_tensor(args, kwargs):
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
