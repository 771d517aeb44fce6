"""The FAKE form of an op whose fixed kernel is a composite (normalisation, embedding), resolved
for one call: everything it looks up (scales, contract, fake-quantized parameters) is found
once, and ``compute(args, kwargs)`` gives the (value, QInfo) of the call's arguments (its
activation as the dispatch quantized it). With ``deps`` (the scale-cache entries it was made
from, as (key, entry) pairs), a steady FAKE run keeps it as the op's prepared call
(``steady_prepare.prepare_composite``) and computes the next calls by it while those entries,
the op's route and its other arguments stay the same."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ResolvedComposite:
    compute: Callable[[tuple, dict], tuple]
    deps: tuple | None = None  # None: computed by the full path every time (never prepared)
