"""One calibration rule as a value: what a user, a per-op choice or an experiment picks from."""

from __future__ import annotations

from dataclasses import dataclass

from quantlab.calibration.kinds import HistogramMethod, ObserverKind, parse_enum
from quantlab.qconfig import OpQConfig


@dataclass(frozen=True)
class ObserverChoice:
    """An observer kind with the parameters that make it one rule.

    ``method`` is required for HISTOGRAM (and only allowed there); ``percentile`` applies to
    PERCENTILE and to the HISTOGRAM method PERCENTILE (None: the qconfig's, default 99.99).
    """

    kind: ObserverKind
    method: HistogramMethod | None = None
    percentile: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", parse_enum(ObserverKind, self.kind, "observer"))
        if self.kind is ObserverKind.FIXED:
            raise ValueError("observer FIXED is a given scale, not a calibration rule to choose")
        if self.method is not None:
            m = parse_enum(HistogramMethod, self.method, "histogram_method")
            object.__setattr__(self, "method", m)
        if (self.kind is ObserverKind.HISTOGRAM) != (self.method is not None):
            raise ValueError(
                f"observer {self.kind.name}: a histogram_method is needed for HISTOGRAM and "
                f"allowed only there; allowed methods: {', '.join(m.name for m in HistogramMethod)}"
            )

    @property
    def label(self) -> str:
        """``MSE``, ``HISTOGRAM/SQNR``, ``PERCENTILE 99.99``, ..."""
        name = self.kind.name if self.method is None else f"{self.kind.name}/{self.method.name}"
        return name if self.percentile is None else f"{name} {self.percentile:g}"

    def rule(self) -> OpQConfig:
        """The qconfig rule that selects this observer (other fields left to inherit)."""
        return OpQConfig(
            observer=self.kind, histogram_method=self.method, percentile=self.percentile
        )

    @classmethod
    def parse(cls, text: str) -> ObserverChoice:
        """The inverse of ``label``: ``"HISTOGRAM/SQNR"``, ``"PERCENTILE 99.9"``, ``"KL"``."""
        name, _, pct = text.strip().partition(" ")
        kind, _, method = name.partition("/")
        return cls(kind, method or None, float(pct) if pct else None)


VENDOR_CHOICES = (
    ObserverChoice(ObserverKind.MINMAX),
    ObserverChoice(ObserverKind.MSE),
    ObserverChoice(ObserverKind.KL),
    ObserverChoice(ObserverKind.PERCENTILE),
    ObserverChoice(ObserverKind.MIX),
    ObserverChoice(ObserverKind.CLIPSTD),
    ObserverChoice(ObserverKind.HISTOGRAM, HistogramMethod.MSE),
)
"""The vendor plugin's observers a calibration can be chosen from (CLIP needs a user range)."""

PEER_CHOICES = (
    ObserverChoice(ObserverKind.GLOBAL_MINMAX),
    ObserverChoice(ObserverKind.MSE_POOLED),
    ObserverChoice(ObserverKind.HISTOGRAM, HistogramMethod.SQNR),
    ObserverChoice(ObserverKind.HISTOGRAM, HistogramMethod.KL),
    ObserverChoice(ObserverKind.HISTOGRAM, HistogramMethod.PERCENTILE),
)
"""Other runtimes' defaults and the remaining full-histogram methods."""
