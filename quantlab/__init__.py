"""quantlab: run a PyTorch model the way a fixed-point NPU computes it and measure the drift.

sim = quantlab.Simulator(model, platform="j6m")
sim.calibrate(batches)
y_fake, y_fixed = sim.run(x, mode="fake"), sim.run(x, mode="fixed")
table = sim.compare(x, a="fake", b="fixed")   # pandas DataFrame, one row per op
"""

from __future__ import annotations

__all__ = ["Simulator"]


def __getattr__(name: str):
    if name == "Simulator":
        from quantlab.simulate import Simulator

        return Simulator
    raise AttributeError(f"module 'quantlab' has no attribute {name!r}")
