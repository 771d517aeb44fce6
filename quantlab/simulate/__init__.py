"""Simulate an eager PyTorch model in float, fake-quant and fixed-point modes, per platform.

from quantlab.simulate import Simulator, Mode, View
sim = Simulator(model, platform="j6m")            # or a PlatformConfig; qconfig=QConfigSpec
sim.calibrate(batches)                            # float runs feed the observers
y_fake, y_fixed = sim.run(x, mode=Mode.FAKE), sim.run(x, mode=Mode.FIXED)
table = sim.compare(x, a=Mode.FAKE, b=Mode.FIXED, view=View.ISOLATED)  # one row per op
loss = sim.train_step((x,), loss_fn, optimizer)   # QAT through FAKE mode (simulate.training)
"""

from quantlab.simulate.core import Simulator
from quantlab.simulate.modes import FakeOps, Mode, OpMode, ScaleTraining, Trace, View

__all__ = ["Simulator", "FakeOps", "Mode", "OpMode", "ScaleTraining", "Trace", "View"]
