"""Fixed-point grid_sample, by concept: ``grid`` (how the device holds coordinates: GridCoord,
quantize_grid, fake_quant_grid), ``sampling`` (the integer kernel grid_sample_fixed),
``limits`` (input size limits), ``split`` (splitting W so each part's grid is finer). The slow
reference is ``quantlab.numerics.reference.grid_sample_reference``."""

from quantlab.numerics.grid_sample.grid import (
    ABS_MAX_FRAC_BITS,
    GridCoord,
    NanRule,
    QGrid,
    absolute_frac_bits,
    fake_quant_grid,
    normalize,
    normalized_grid_scale,
    quantize_grid,
    unnormalize,
)
from quantlab.numerics.grid_sample.limits import check_grid_limits, grid_limit_violation
from quantlab.numerics.grid_sample.sampling import (
    Padding,
    SampleMode,
    grid_positions_fixed,
    grid_sample_fixed,
)
from quantlab.numerics.grid_sample.split import (
    SplitPlan,
    plan_split,
    required_halo,
    split_grid_sample,
)

__all__ = [
    "ABS_MAX_FRAC_BITS",
    "GridCoord",
    "NanRule",
    "Padding",
    "QGrid",
    "SampleMode",
    "SplitPlan",
    "absolute_frac_bits",
    "check_grid_limits",
    "fake_quant_grid",
    "grid_limit_violation",
    "grid_positions_fixed",
    "grid_sample_fixed",
    "normalize",
    "normalized_grid_scale",
    "plan_split",
    "quantize_grid",
    "required_halo",
    "split_grid_sample",
    "unnormalize",
]
