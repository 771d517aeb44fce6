"""Simulate an eager PyTorch model in float, fake-quant and fixed-point modes, per platform."""

from quantlab.simulate.core import Simulator
from quantlab.simulate.modes import Mode, OpMode, Trace, View

__all__ = ["Simulator", "Mode", "OpMode", "Trace", "View"]
