"""keep_freed_memory: large tensors reuse freed memory instead of faulting in new pages, and the
command line applies it unless told not to."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pandas as pd
import pytest

from quantlab import host_memory

GLIBC = host_memory._libc() is not None

# rounds of a model step on a large batch: a 48 MiB float32 activation (above glibc's largest
# mmap threshold, 32 MiB; three sizes in turn), small tensors made while it lives, all freed at
# the end of the round; prints the minor page faults of each round and the peak resident size
_ROUNDS = """
import json, resource, sys, torch
from quantlab.host_memory import keep_freed_memory, kept
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
faults = []
for i in range(30):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.empty((12 << 20) + 1024 * (i % 3))
    x.fill_(1.0)
    small = [torch.ones(256) for _ in range(8)]
    total = x.sum() + sum(t.sum() for t in small)
    del x, small, total
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(json.dumps({"applied": applied, "kept": kept(), "faults": faults, "peak_mib": peak}))
"""


def _rounds(mode: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _ROUNDS, mode], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="mallopt switches exist only in glibc")
def test_kept_memory_serves_large_tensors_without_new_page_faults():
    default, keep = _rounds("default"), _rounds("keep")
    assert default["applied"] is False and default["kept"] is False
    assert keep["applied"] is True and keep["kept"] is True
    pages = (48 << 20) // 4096
    # the C library's default maps every 48 MiB tensor anew: each page faults on its first write
    assert all(f >= pages // 2 for f in default["faults"][10:])
    # kept: after the first few rounds freed blocks are reused and no page is faulted in again
    assert sum(keep["faults"][10:]) < pages // 10
    # and the heap holds about one activation more than the default's peak, not one per round
    assert keep["peak_mib"] < default["peak_mib"] + 2 * 48


@pytest.mark.skipif(not GLIBC, reason="mallopt switches exist only in glibc")
def test_keep_freed_memory_is_idempotent_in_one_process():
    code = (
        "from quantlab.host_memory import keep_freed_memory, kept\n"
        "print(kept(), keep_freed_memory(), keep_freed_memory(), kept())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True", "True", "True"]


def test_keep_freed_memory_changes_nothing_without_glibc(monkeypatch):
    monkeypatch.setattr(host_memory, "_applied", False)
    monkeypatch.setattr(host_memory, "_libc", lambda: None)
    assert host_memory.keep_freed_memory() is False
    assert host_memory.kept() is False


def test_command_line_keeps_freed_memory_unless_told_not_to(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir

    import quantlab.__main__ as entry
    from quantlab.config import CONFIG_DIR
    from quantlab.experiment import ExperimentResult

    calls = []

    def probe(exp, ctx):
        return ExperimentResult(table=pd.DataFrame({"x": [1]}), title="probe")

    monkeypatch.setattr(entry, "lookup", lambda schema: SimpleNamespace(fn=probe))
    monkeypatch.setattr(entry, "keep_freed_memory", lambda: calls.append("kept") or True)
    for flag in ("true", "false"):
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("config", overrides=["+exp=lut_error", f"keep_freed_memory={flag}"])
        entry.run(cfg, tmp_path / flag, "python -m quantlab +exp=lut_error")
        assert calls == ["kept"], flag  # applied by the true run, not again by the false one
    assert not host_memory.kept()  # the test process keeps its own malloc (tests/conftest.py)
