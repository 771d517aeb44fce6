"""Schema of the ``data`` config group."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DataConfig:
    """Which inputs to use. ``name`` is a key of the data registry (quantlab.data).

    Calibration and evaluation splits are fixed: the first ``num_calib`` items of the ordered
    dataset calibrate, the next ``num_eval`` evaluate (see quantlab.data for each dataset's order).
    """

    name: str = "synthetic"
    num_calib: int = 8
    num_eval: int = 8
    seed: int = 0
