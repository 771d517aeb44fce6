"""Deployment form of an eval-mode model: BatchNorm folded into convolutions, Dropout removed.

Deployment toolchains fold an inference BatchNorm into the convolution that feeds it and drop
Dropout before quantizing, so the NPU never sees either op. ``to_deployment_form`` does the same
on a module in place, finding conv -> batch_norm pairs by running the model once (hooks), so it
works for ``nn.Sequential`` stacks and hand-written ``forward`` methods alike.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten


def _parent_and_attr(root: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, attr = name.rpartition(".")
    return (root.get_submodule(parent_name) if parent_name else root), attr


_METADATA = {"dim", "size", "numel", "__get__", "stride", "is_contiguous", "is_floating_point"}


class _CountUses(TorchFunctionMode):
    """Counts, per tensor id, the torch calls (functions and methods, metadata reads excluded)
    that take the tensor as an argument; keeps every seen tensor alive so ids stay unique."""

    def __init__(self, uses: Counter, alive: list):
        super().__init__()
        self.uses, self.alive = uses, alive

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") not in _METADATA:
            for t in tree_flatten((args, kwargs or {}))[0]:
                if isinstance(t, Tensor):
                    self.uses[id(t)] += 1
                    self.alive.append(t)
        return func(*args, **(kwargs or {}))


def conv_bn_pairs(module: nn.Module, inputs: tuple[Tensor, ...]) -> list[tuple[str, str]]:
    """(conv name, batch_norm name) pairs where a BatchNorm2d's input is the tensor a Conv2d
    or ConvTranspose2d returned and nothing else uses that tensor, found by one forward pass
    on ``inputs``."""
    return _pairs_and_output(module, inputs)[0]


def _stock_batch_norm(m: nn.Module) -> bool:
    """A BatchNorm2d whose forward is torch's own. A subclass that overrides it (timm's
    BatchNormAct2d applies an activation after the norm) cannot become ``nn.Identity``; its
    ``F.batch_norm`` call is left to the Simulator, which fuses it into the GEMM before it."""
    return (
        isinstance(m, nn.BatchNorm2d)
        and type(m).forward is nn.BatchNorm2d.forward
        and m.running_mean is not None  # without running statistics it normalizes by the batch's
    )


def _pairs_and_output(module: nn.Module, inputs: tuple[Tensor, ...]):
    produced: dict[int, str] = {}
    bn_input: dict[str, int] = {}
    uses: Counter = Counter()
    alive: list[Tensor] = []  # every tensor seen stays referenced, so no id is reused
    handles = []
    for name, m in module.named_modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):

            def conv_hook(mod, args, out, name=name):
                produced[id(out)] = name
                alive.append(out)

            handles.append(m.register_forward_hook(conv_hook))
        elif _stock_batch_norm(m):

            def bn_hook(mod, args, name=name):
                bn_input[name] = id(args[0])
                alive.append(args[0])

            handles.append(m.register_forward_pre_hook(bn_hook))
    try:
        with torch.no_grad(), _CountUses(uses, alive):
            out = module(*inputs)
    finally:
        for h in handles:
            h.remove()
    pairs = [(produced[t], bn) for bn, t in bn_input.items() if t in produced and uses[t] == 1]
    return pairs, out


@torch.no_grad()
def fold_conv_bn(conv: nn.Conv2d | nn.ConvTranspose2d, bn: nn.BatchNorm2d) -> None:
    """conv <- bn(conv(.)) for eval-mode BatchNorm: W' = W * g / sqrt(var + eps) per output
    channel (a transposed convolution's (C, O / groups, kh, kw) weight holds them along dim 1,
    per group), b' = (b - mean) * g / sqrt(var + eps) + beta (g = 1, beta = 0 for a BatchNorm
    without affine parameters); computed in float64, stored in float32."""
    gamma = bn.weight.double() if bn.weight is not None else 1.0
    scale = gamma / torch.sqrt(bn.running_var.double() + bn.eps)
    w = conv.weight.double()
    if isinstance(conv, nn.ConvTranspose2d):
        g = conv.groups
        w = w.reshape(g, w.shape[0] // g, *w.shape[1:]) * scale.reshape(g, 1, -1, 1, 1)
        w = w.reshape(conv.weight.shape)
    else:
        w = w * scale.reshape(-1, 1, 1, 1)
    b = conv.bias.double() if conv.bias is not None else torch.zeros_like(scale)
    b = (b - bn.running_mean.double()) * scale
    if bn.bias is not None:
        b = b + bn.bias.double()
    conv.weight.copy_(w.to(conv.weight.dtype))
    if conv.bias is None:
        conv.bias = nn.Parameter(b.to(conv.weight.dtype))
    else:
        conv.bias.copy_(b.to(conv.bias.dtype))


def to_deployment_form(module: nn.Module, inputs: tuple[Tensor, ...]) -> nn.Module:
    """Fold every conv -> BatchNorm2d pair (found on ``inputs``) and replace the BatchNorm and
    every ``nn.Dropout`` by ``nn.Identity``; in place, returns ``module`` in eval mode.

    Outputs change only by float32 rounding of the folded weights (relative ~1e-6). A BatchNorm
    without a feeding conv is kept (it stays a visible op).
    """
    module.eval()
    for name, m in list(module.named_modules()):  # eval-mode Dropout is the identity already
        if isinstance(m, nn.Dropout):
            parent, attr = _parent_and_attr(module, name)
            setattr(parent, attr, nn.Identity().eval())
    if not any(_stock_batch_norm(m) for m in module.modules()):
        return module
    pairs, before = _pairs_and_output(module, inputs)
    for conv_name, bn_name in pairs:
        fold_conv_bn(module.get_submodule(conv_name), module.get_submodule(bn_name))
        parent, attr = _parent_and_attr(module, bn_name)
        setattr(parent, attr, nn.Identity().eval())
    with torch.no_grad():
        after = module(*inputs)
    for i, (a, b) in enumerate(zip(_float_leaves(after), _float_leaves(before), strict=True)):
        err = float((a - b).abs().max()) if a.numel() else 0.0
        bound = 1e-4 * max(1.0, float(b.abs().max()) if b.numel() else 0.0)
        if not err <= bound:
            raise RuntimeError(
                f"folding BatchNorm changed the model's float output {i} by {err:.3g} (> "
                f"{bound:.3g}): a folded conv output must also feed something other than its "
                "BatchNorm"
            )
    return module


def _float_leaves(out) -> list[Tensor]:
    """The floating-point tensors of a model output (a tensor, or a tuple, list or dict of
    them), in ``tree_flatten`` order; integer outputs such as top-k indices are left out."""
    return [t for t in tree_flatten(out)[0] if isinstance(t, Tensor) and t.is_floating_point()]
