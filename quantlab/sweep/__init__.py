"""Sweeps that do not lose work: per-job folders with DONE markers, a summary at the end.

``python -m quantlab -m +exp=<name> key=a,b,c`` runs one job per combination, each writing its
report atomically into its own folder and its DONE marker last. Rerunning the same command with
``hydra.sweep.dir=<the same folder>`` skips every job whose folder holds DONE. When the
multirun ends, ``SummaryCallback`` merges every finished job into ``summary.csv`` plus plots;
``python -m quantlab.sweep <sweep folder>`` does the same by hand (e.g. after a cluster sweep
whose launching process was stopped).
"""

from quantlab.sweep.callback import SummaryCallback
from quantlab.sweep.summary import JobRecord, find_jobs, summarize_sweep, swept_keys

__all__ = ["SummaryCallback", "JobRecord", "find_jobs", "summarize_sweep", "swept_keys"]
