"""Calibration: the rules that turn activation statistics into scales, and choosing them per op.

``kinds``     ObserverKind and HistogramMethod: every rule by name, with its definition.
``vendor``    the vendor plugin's per-batch rules (MSE, Percentile, Mix, Clip, ClipStd) and EMA.
``kl``        the KLObserver entropy search.
``histogram`` full and |x| histograms, the exact expected error under a histogram.
``search``    MSE / SQNR / KL / percentile searches over a full histogram.
``choice``    ObserverChoice: one rule as a qconfig value; the standard candidate set.
``per_op``    pick, per op, the rule whose scale minimises an error (a QConfigSpec).

Every rule ends in an absolute maximum; the scale is the platform's scale rule applied to it.
"""

from quantlab.calibration.kinds import HistogramMethod, ObserverKind

__all__ = ["HistogramMethod", "ObserverKind"]
