"""A GEMM's weight and bias with the batch_norm fused into it folded in, as a run computes
with them (``fusion.fold_batch_norm``), from the BatchNorm module's own tensors as they are
now. A part of the Simulator (``OpDispatch`` and the ONNX export call it)."""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.simulate import args as A
from quantlab.simulate.fusion import fold_batch_norm


class BatchNormFolding:
    """The Simulator's folding of fused batch_norms into their GEMMs' weights and biases."""

    def _fold(self, call, plan: A.ArgPlan, args: list, kwargs: dict) -> A.ArgPlan:
        """Put the batch_norm-folded weight and bias of GEMM ``call`` into its arguments; the
        plan of the folded arguments (a bias slot added when the call had none)."""
        if plan.weight is None:
            return plan
        w = A.get(args, kwargs, plan.weight)
        b = A.get(args, kwargs, plan.bias) if plan.bias is not None else None
        groups = A.conv_params(call).get("groups", 1) if call.op_type in A.TRANSPOSED else 0
        folded = self.batch_norm_folded(call.name, w, b, groups, self._recording_grad())
        if folded is None:
            return plan
        wf, bf = folded
        A.put(args, kwargs, plan.weight, wf)
        if plan.bias is None:
            plan = A.ArgPlan(plan.acts, plan.weight, ("k", "bias"))
        A.put(args, kwargs, plan.bias, bf)
        return plan

    def batch_norm_folded(
        self, name: str, w: Tensor, b: Tensor | None, transposed_groups: int = 0, grad=False
    ) -> tuple[Tensor, Tensor] | None:
        """(w', b') of GEMM ``name`` (weight ``w``, bias ``b``) with the batch_norm fused into
        it folded in (``fusion.fold_batch_norm``: the tensors its runs compute with, cached
        while nothing changes); None when no batch_norm is fused into it.
        ``transposed_groups``: a transposed convolution's groups (0 otherwise)."""
        info = self._info
        bn = [info[c] for c in self._chain.get(name, []) if info[c].op_type == "batch_norm"]
        if not bn:
            return None
        post = self._batch_norm_params(bn[0])
        return fold_batch_norm(
            self._fold_cache, name, w, b, post, grad, transposed_groups=transposed_groups
        )

    def _batch_norm_params(self, inf) -> tuple:
        """(running_mean, running_var, weight, bias, eps) of a fused batch_norm op: the BatchNorm
        module's own tensors as they are now when the op is a BatchNorm module's call (its GEMM
        runs first, so the op's arguments of this run are not seen yet, and a tensor the module
        was given since the last run counts); else what the op was called with last run."""
        try:
            m = self.model.get_submodule(inf.module) if inf.module else self.model
        except AttributeError:
            return inf.post
        if not isinstance(m, torch.nn.modules.batchnorm._BatchNorm) or inf.post is None:
            return inf.post
        if m.running_mean is None or m.running_var is None:
            return inf.post
        return m.running_mean, m.running_var, m.weight, m.bias, float(m.eps)
