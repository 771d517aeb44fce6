"""Pinned fixed-mode bits of a real network: refactors and speed work must not move them.

The run: MobileNetV2 on j6m with every activation observer set to MSE_POOLED (so the pinned
bits guard the fixed-point arithmetic, not the choice of calibration default), calibrated on
the photos' calibration items, then the first 8 evaluation items as one batch in fixed mode.
Every captured op's output (the float32 value ``code * scale`` of its integer codes) and the
model output are hashed. A change that moves any code or any scale changes a digest.
The calibration is a float run whose last bits depend on how torch splits its reductions across
threads (a scale one ulp apart moves every value after it), so the digests are taken with two
intra-op threads, set for this test and restored after it; and on the kind of CPU (instruction
set), so a CPU of another kind compares with its own file where one is written (``cpu_pins``).

Regenerate (only when a change of numerics is intended and explained):
    python tests/simulate/test_pinned_codes.py [--this-cpu]
(``--this-cpu``: this CPU kind's file, ``cpu_pins.kind_path``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from cpu_pins import kind_path, pinned_path

pytest.importorskip("PIL")

GOLDEN = Path(__file__).with_name("pinned_mobilenet_v2_j6m.json")
EVAL_ITEMS = 8


def _digest(t) -> str:
    t = t.detach().contiguous().cpu()
    return hashlib.sha256(t.numpy().tobytes() + str(t.dtype).encode()).hexdigest()[:16]


def fixed_mode_digests(program: bool = False) -> dict:
    """The digests (and with ``program``, ``program_output``: the digest of the same batch's
    output from a traced FIXED program of the simulator, ``Simulator.program``, built on the
    same items in reverse order)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        return _digests(program)
    finally:
        torch.set_num_threads(threads)


def _digests(program: bool) -> dict:
    from quantlab.calibration.kinds import ObserverKind
    from quantlab.data import load_data
    from quantlab.models import build_model
    from quantlab.platforms import load_platform
    from quantlab.qconfig import OpQConfig, QConfigSpec
    from quantlab.simulate import Mode, Simulator

    bundle = build_model("mobilenet_v2")
    data = load_data("photos", bundle.name)
    spec = QConfigSpec(global_=OpQConfig(observer=ObserverKind.MSE_POOLED))
    sim = Simulator(bundle.module, load_platform("j6m"), spec)
    sim.calibrate(data.calib)
    items = data.eval[:EVAL_ITEMS]
    batch = torch.cat([b[0] for b in items])
    with torch.no_grad():
        trace = sim.trace(batch, mode=Mode.FIXED)
    ops = {}
    for name in trace.order:
        out = trace.outputs[name]
        if isinstance(out, torch.Tensor):
            ops[name] = _digest(out)
    found = {"output": _digest(trace.result), "ops": ops}
    if program:
        other = torch.cat([b[0] for b in items[::-1]])  # the same items in reverse order
        found["program_output"] = _digest(sim.program(other, mode=Mode.FIXED)(batch))
    return found


def test_mobilenet_v2_j6m_fixed_codes_are_pinned():
    want = json.loads(pinned_path(GOLDEN).read_text())
    got = fixed_mode_digests(program=True)
    changed = [n for n in want["ops"] if got["ops"].get(n) != want["ops"][n]]
    assert set(got["ops"]) == set(want["ops"]), "the captured op names changed"
    assert not changed, f"{len(changed)} ops changed codes; first: {changed[:5]}"
    assert got["output"] == want["output"]
    assert got["program_output"] == want["output"]  # the traced program: the same bits


if __name__ == "__main__":
    import sys

    path = kind_path(GOLDEN) if "--this-cpu" in sys.argv else GOLDEN
    path.write_text(json.dumps(fixed_mode_digests(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}")
