"""Fine-tuning through the simulator: QAT under the platform's qconfig, on any eager model.

A training run is a FAKE (or HYBRID) run with gradients recorded: its forward values are the
no-gradient run's bits, and each quantized value passes its gradient straight through
(``quantlab.simulate.straight_through``): fake quantization to its input inside the range,
weights and biases to their float parameters (through the batch_norm fold), a deployed segment
table (``FakeOps.DEPLOYED``, ``Mode.HYBRID``) by its own slope, the deployed softmax and an
integer or composite kernel by the float function's gradient. Activation scales stay at their
calibrated values (the vendor's fixed-scale QAT) unless ``learn_scales`` makes them LSQ
parameters. The model runs in eval mode throughout (BatchNorm statistics frozen, folded as
deployed; no Dropout).

    sim = Simulator(model, "j6m", fake_ops=FakeOps.DEPLOYED); sim.calibrate(batches)
    opt = torch.optim.Adam(sim.model.parameters(), lr=1e-4)
    for x, y in data:
        loss = sim.train_step((x,), lambda out: F.mse_loss(out, y), opt)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from quantlab.simulate.modes import Mode
from quantlab.simulate.run_state import RunState


class QatTraining:
    """The Simulator's training API: ``train_forward``, ``train_step``, ``learn_scales``."""

    def train_forward(self, *inputs: Any, mode: Mode | str = Mode.FAKE) -> Any:
        """What ``run(*inputs, mode=mode)`` returns (the same bits), with gradients recorded
        to the model's parameters (and learned scales). ``mode``: FAKE or HYBRID."""
        mode = Mode.parse(mode)
        if mode not in (Mode.FAKE, Mode.HYBRID):
            raise ValueError(f"train_forward mode must be FAKE or HYBRID, got {mode.name}")
        if not self._calibrated:
            raise ValueError("train_forward needs calibrate(batches) first")
        if not self._discovered:
            self._forward(inputs, RunState(Mode.FLOAT, {}))
        return self._forward(inputs, RunState(mode, {}, grad=True))

    def train_step(
        self,
        inputs: Sequence[Any],
        loss_fn: Callable[[Any], Tensor],
        optimizer: torch.optim.Optimizer,
        mode: Mode | str = Mode.FAKE,
    ) -> float:
        """One optimizer step: zero the gradients, ``loss_fn(train_forward(*inputs, mode))``,
        backward, ``optimizer.step()``; returns the loss (a Python float)."""
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(self.train_forward(*inputs, mode=mode))
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            raise ValueError("train_step: loss_fn must return a one-element tensor")
        if not loss.requires_grad:
            raise ValueError(
                "train_step: the loss has no gradient (no trainable parameter reaches the output)"
            )
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    def learn_scales(self, *inputs: Any, mode: Mode | str = Mode.FAKE) -> list[nn.Parameter]:
        """Make every calibrated activation scale that ``inputs`` reach a trainable parameter
        (LSQ; ``ScaleTraining.LEARNED``), starting at its calibrated value; returns them for
        the optimizer. Every later run (FIXED included) uses the learned values. Points with
        ``observer: FIXED`` keep their fixed scale."""
        if self._learned_scales is None:
            self._learned_scales = {}
        out = self.train_forward(*inputs, mode=mode)
        del out
        return list(self._learned_scales.values())

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The model's parameters that require gradients, then the learned scales (if any)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        return params + list((self._learned_scales or {}).values())
