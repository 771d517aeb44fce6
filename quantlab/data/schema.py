"""Schema of the ``data`` config group."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DataConfig:
    """Which inputs to use. ``name`` is a key of the data registry (quantlab.data).

    Calibration and evaluation splits are fixed: each dataset has an ordered calibration pool and
    a disjoint ordered evaluation pool; the first ``num_calib`` / ``num_eval`` items of each are
    used (all of a pool when it is smaller; see quantlab.data for each dataset's pools).
    """

    name: str = "synthetic"
    num_calib: int = 8
    num_eval: int = 8
    seed: int = 0
    batch_size: int = 1  # items per batch (sentences: pairs per batch)

    def __post_init__(self) -> None:
        for field_name in ("num_calib", "num_eval", "batch_size"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"data.{field_name} must be >= 1, got {getattr(self, field_name)}")
