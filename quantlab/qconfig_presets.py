"""The ``qconfig`` config group: which per-op precision a run starts from.

``qconfig=default`` (the platform's template), ``qconfig=int16`` (every op int16 where the
platform allows it), ``qconfig=float16`` (global float16 with int8 Conv/Linear/MatMul, the J6H/P
starting point) or ``qconfig=file qconfig.path=PATH.yaml`` (a qconfig YAML file,
``quantlab.qconfig.load``). ``preset_spec`` turns the choice into a ``QConfigSpec`` for one
platform; a preset is a recipe over op types, so its rules need not match every model, while a
file's rules must each match an op of the model (``quantlab.qconfig.check_matches``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from quantlab.numerics.dtypes import DType
from quantlab.platforms import PlatformConfig
from quantlab.qconfig import GEMM_TYPES, OpQConfig, QConfigSpec

WEIGHTED_GEMM_TYPES = tuple(sorted(GEMM_TYPES - {"matmul"}))


class QConfigPreset(enum.Enum):
    """DEFAULT: the platform template alone (``QConfigSpec()``).
    INT16: activations int16; GEMM operands int16 as far as ``platform.max_int16_gemm_operands``
        allows (2: input and weight int16; 1: input int16, weight int8, matmul inputs int8;
        0: int8 operands).
    FLOAT16: activations float16, Conv/Linear/MatMul inputs and weights int8 (needs
        ``platform.float16_available``).
    FILE: the YAML file at ``qconfig.path``."""

    DEFAULT = "default"
    INT16 = "int16"
    FLOAT16 = "float16"
    FILE = "file"


@dataclass
class QConfigChoice:
    """Schema of the ``qconfig`` config group."""

    preset: QConfigPreset = QConfigPreset.DEFAULT
    path: str | None = None  # the qconfig YAML file (qconfig=file only)

    def __post_init__(self) -> None:
        if self.preset is QConfigPreset.FILE and not self.path:
            raise ValueError(
                "qconfig.path is required with qconfig=file: the qconfig YAML file to use "
                "(e.g. the qconfig/*.yaml that +exp=mixed_precision wrote)"
            )
        if self.preset is not QConfigPreset.FILE and self.path:
            raise ValueError(
                f"qconfig.path is only read with qconfig=file, but qconfig={self.preset.value}; "
                "allowed: qconfig=file qconfig.path=PATH.yaml"
            )


def preset_spec(choice: QConfigChoice, platform: PlatformConfig) -> QConfigSpec:
    """The ``QConfigSpec`` that ``choice`` selects on ``platform`` (a file is read here)."""
    if choice.preset is QConfigPreset.DEFAULT:
        return QConfigSpec()
    if choice.preset is QConfigPreset.FILE:
        from quantlab.qconfig import load

        return load(choice.path)
    if choice.preset is QConfigPreset.INT16:
        n16 = platform.max_int16_gemm_operands
        weighted = OpQConfig(
            input_dtype=DType.INT16 if n16 >= 1 else DType.INT8,
            weight_dtype=DType.INT16 if n16 >= 2 else DType.INT8,
        )
        matmul = OpQConfig(input_dtype=DType.INT16 if n16 >= 2 else DType.INT8)
        return QConfigSpec(
            global_=OpQConfig(output_dtype=DType.INT16),
            by_type={t: weighted for t in WEIGHTED_GEMM_TYPES} | {"matmul": matmul},
        )
    if not platform.float16_available:
        raise ValueError(
            f"qconfig=float16 needs float16, which is not available on {platform.name} "
            "(platform.float16_available=false); use it with platform=j6b, j6h or j6p, or "
            "choose qconfig=default or qconfig=int16"
        )
    int8 = OpQConfig(input_dtype=DType.INT8, weight_dtype=DType.INT8)
    return QConfigSpec(
        global_=OpQConfig(output_dtype=DType.FLOAT16),
        by_type={t: int8 for t in WEIGHTED_GEMM_TYPES}
        | {"matmul": OpQConfig(input_dtype=DType.INT8)},
    )
