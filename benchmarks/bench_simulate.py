"""Benchmark: the simulator's cost against the model run plainly, and against onnxruntime.

Not a test. For each case (MobileNetV2 and EfficientNet-Lite0 with their ImageNet weights,
BatchNorm folded, 1x3x224x224; MobileNetV2 at batch 8; MiniLM at sequence 128) every variant
runs interleaved in one process, ``--rounds`` rounds after a warm-up (each timed call after
20 ms of untimed calls of the same variant, as in a loop), and its median wall time
is divided by the median of the baseline: plain eager torch, ``model(*x)`` under
``torch.no_grad()`` with nothing captured. Process CPU time (all threads) is reported beside it,
and the paired ratio: the median over rounds of each round's time over the same round's eager
time (with quartiles), which a slow spell of the machine spanning a round moves less.
Variants: quantlab float mode, fake mode on j6m (``Simulator.run`` in a loop's steady state,
where its runs have switched to a traced program, and captured per op with
``steady_programs=False``), fixed mode on j6m, fixed mode on the onnxruntime profile (a loop's
steady runs in the onnxruntime session that gives their bits, ``simulate.runtime_program``; also
timed on quantlab's own traced program, and with asymmetric activations, QOperator's numerics),
onnxruntime fp32 and int8 QOperator (static, per-channel; exported from the same module;
``session.intra_op.allow_spinning`` = "0"), all on ``--threads`` intra-op threads;
and fake mode's floor: the model with every op captured and nothing quantized, and the fake
quant's passes alone (their sum estimates what any per-op fake run costs); and fixed mode's
integer kernels alone (a steady fixed j6m run's calls of them, replayed in order), against
onnxruntime int8.
Also: int16 segment-LUT evaluation against torch.sigmoid on as many elements (after the loop
that switches the gather to its compiled tier, as any long run does), and the peak
memory growth of one MobileNetV2 run per mode (fresh subprocess each).

Targets (each printed as met or missed with its figure): float <= 1.1x eager, fake (j6m)
<= 1.3x, fixed (j6m and onnxruntime, the latter also with asymmetric activations) <= 2.5x
eager and <= 1.5x onnxruntime int8, LUT <= 1.5x torch.sigmoid. The load average
(``os.getloadavg``) before and after is recorded: figures from a loaded machine are distorted.
Writes reports/benchmarks/simulate.{md,json,png} atomically (``--profile``: also
simulate_profile.md, where a fake and a fixed MobileNetV2 run spend their time and MiniLM's
fixed program by op type; ``--profile-only``: that report alone).

    .venv/bin/python benchmarks/bench_simulate.py [--rounds 15] [--threads 2] [--quick]
        [--out DIR] [--profile | --profile-only]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform as host
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from quantlab.capture import CaptureMode, ModuleTracker
from quantlab.export.ort_host import onnxruntime_profile
from quantlab.models import build_model
from quantlab.models.registry import example_inputs
from quantlab.numerics.gemm import kernels, requant_native
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.report import markdown_table
from quantlab.report.io import atomic_savefig, atomic_write_text
from quantlab.report.plots import Plot, PlotKind, draw
from quantlab.simulate import Mode, Simulator
from quantlab.simulate.traced_graph import same_bits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_info import cpu_description, shown_path  # noqa: E402
from lut_tiers import describe, run_until_compiled, sigmoid_case  # noqa: E402
from ort_baseline import ort_runners  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "reports" / "benchmarks"
EAGER = "eager torch float (baseline)"
ORT8 = "onnxruntime int8 QOperator"
FLOAT, FAKE = "quantlab float", "quantlab fake j6m"
FAKE_CAPTURED = "quantlab fake j6m, captured per op"
FIXED, FIXED_ORT = "quantlab fixed j6m", "quantlab fixed onnxruntime profile"
# the onnxruntime profile's steady FIXED runs computed by quantlab's traced program instead of
# the onnxruntime session that gives its bits (quantlab.simulate.runtime_program)
FIXED_ORT_OWN = "quantlab fixed onnxruntime profile, quantlab's program"
# the same profile with zero points (asymmetric uint8 activations), QOperator's numerics
FIXED_ORT_ASYM = "quantlab fixed onnxruntime profile, asymmetric"
FIXED_CAPTURED = "quantlab fixed j6m, captured per op"
# what any per-op simulation of an eager model adds before quantizing anything, and the fake
# quant's own arithmetic: together an estimate of a fake run's floor ("Fake mode's floor")
CAPTURED = "eager, every op captured, nothing quantized"
FQ_PASSES = "fake-quant passes alone"
# the integer kernels a steady fixed j6m run calls, replayed in order with nothing else: what
# quantlab's kernels cost before any of its own work ("Fixed mode's kernels")
FIXED_KERNELS = "quantlab fixed j6m, its integer kernels alone"
# variant -> (limit x eager, limit x onnxruntime int8 or None)
TARGETS = {
    FLOAT: (1.1, None),
    FAKE: (1.3, None),
    FIXED: (2.5, 1.5),
    FIXED_ORT: (2.5, 1.5),
    FIXED_ORT_ASYM: (2.5, 1.5),
}
# case label -> kernel -> calls per fixed j6m run (``integer_kernels``)
KERNEL_CALLS: dict[str, dict[str, int]] = {}
# case label -> variant -> how its steady runs switched to a traced program (or why they did not)
SWITCH: dict[str, dict[str, dict]] = {}
SWITCHING = {
    FAKE: ("j6m", Mode.FAKE),
    FIXED: ("j6m", Mode.FIXED),
    FIXED_ORT: ("onnxruntime", Mode.FIXED),
    FIXED_ORT_OWN: ("onnxruntime own", Mode.FIXED),
    FIXED_ORT_ASYM: ("onnxruntime asymmetric", Mode.FIXED),
}
LUT_TARGET = 1.5
MEMORY_TARGET = 2.0


@dataclass(frozen=True)
class Case:
    model: str
    batch: int = 1
    seq: int = 0  # token models: sequence length

    @property
    def label(self) -> str:
        shape = f"seq {self.seq}" if self.seq else "224x224"
        return f"{self.model} b{self.batch} {shape}"

    def inputs(self, seed: int) -> tuple:
        if not self.seq:
            return example_inputs(self.model, self.batch, seed)
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(1000, 30000, (self.batch, self.seq), generator=gen)
        ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
        return ids, torch.ones_like(ids)


CASES = (
    Case("mobilenet_v2"),
    Case("efficientnet_lite0"),
    Case("minilm", seq=128),
    Case("mobilenet_v2", batch=8),
)


def variants(case: Case, threads: int) -> dict[str, Callable[[], object]]:
    """Every timed variant of ``case``, set up (calibrated, weights coded, sessions built)."""
    module = build_model(case.model).module
    x = case.inputs(0)
    calib = [case.inputs(1), case.inputs(2)]
    out: dict[str, Callable[[], object]] = {}

    def eager():
        with torch.no_grad():
            return module(*x)

    out[EAGER] = eager
    sims = {}
    asymmetric = QConfigSpec(global_=OpQConfig(activation_symmetry="asymmetric"))
    ort = onnxruntime_profile()  # the profile of this machine's onnxruntime
    for key, prof, steady, spec in (
        ("j6m", "j6m", True, None),
        ("captured", "j6m", False, None),  # every FAKE run captured per op
        ("onnxruntime", ort, True, None),
        ("onnxruntime own", ort, True, None),
        ("onnxruntime captured", ort, False, None),
        ("onnxruntime asymmetric", ort, True, asymmetric),
        ("onnxruntime asymmetric captured", ort, False, asymmetric),
    ):
        sim = Simulator(module, prof, qconfig=spec, steady_programs=steady)
        sim.calibrate(calib, progress=False)
        sims[key] = sim
    sims["onnxruntime own"].steady_programs.runtime_sessions = False
    out[FLOAT] = lambda: sims["j6m"].run(*x, mode=Mode.FLOAT)
    out[FAKE] = lambda: sims["j6m"].run(*x, mode=Mode.FAKE)
    out[FAKE].program_of = lambda: sims["j6m"].steady_programs.status(x, Mode.FAKE).program
    out[FAKE_CAPTURED] = lambda: sims["captured"].run(*x, mode=Mode.FAKE)
    out[FIXED] = lambda: sims["j6m"].run(*x, mode=Mode.FIXED)
    out[FIXED_ORT] = lambda: sims["onnxruntime"].run(*x, mode=Mode.FIXED)
    out[FIXED_ORT_OWN] = lambda: sims["onnxruntime own"].run(*x, mode=Mode.FIXED)
    out[FIXED_ORT_ASYM] = lambda: sims["onnxruntime asymmetric"].run(*x, mode=Mode.FIXED)
    out[FIXED_CAPTURED] = lambda: sims["captured"].run(*x, mode=Mode.FIXED)
    SWITCH[case.label] = {
        v: run_until_switched(out[v], sims[key], x, mode) for v, (key, mode) in SWITCHING.items()
    }
    out.update(ort_runners(module, x, calib, threads))
    out[CAPTURED] = captured_runner(module, x)
    sims["j6m"].run(*x, mode=Mode.FAKE)
    out[FQ_PASSES] = fake_quant_passes(sims["j6m"])
    out[FIXED_KERNELS] = integer_kernels(out[FIXED])
    KERNEL_CALLS[case.label] = out[FIXED_KERNELS].calls
    for fn in out.values():  # warm-up: plans, scales, weight codes and tables are built here
        fn()
    if not torch.equal(out[CAPTURED](), eager()):
        raise RuntimeError(f"{case.label}: the captured run does not give the eager output")
    if not torch.equal(out[FAKE](), out[FAKE_CAPTURED]()):
        raise RuntimeError(f"{case.label}: the steady FAKE run differs from the captured one")
    if not torch.equal(out[FIXED](), out[FIXED_CAPTURED]()):
        raise RuntimeError(f"{case.label}: the steady FIXED run differs from the captured one")
    for v, key in ((FIXED_ORT, "onnxruntime"), (FIXED_ORT_ASYM, "onnxruntime asymmetric")):
        captured = sims[f"{key} captured"].run(*x, mode=Mode.FIXED)
        if not same_bits(out[v](), captured) or (
            v == FIXED_ORT and not same_bits(out[FIXED_ORT_OWN](), captured)
        ):
            raise RuntimeError(f"{case.label}: {v} differs from the captured FIXED run")
    return out


def run_until_switched(steady: Callable[[], object], sim: Simulator, x: tuple, mode: Mode) -> dict:
    """Run ``steady`` (a steady run of ``sim`` in ``mode``) until its runs switch to a traced
    program or the switch fails; how many captured runs and seconds that took, the build's
    seconds, and the reason where there is no program."""
    t0 = time.perf_counter()
    while True:
        steady()
        state = sim.steady_programs.status(x, mode)
        if state.program is not None or state.failed is not None:
            break
    return {
        "captured_runs": state.captured_runs,
        "captured_s": round(state.captured_s, 2),
        "build_s": round(state.build_s, 2),
        "loop_s": round(time.perf_counter() - t0, 2),
        "switched": state.program is not None,
        "runs_as": type(state.program).__name__ if state.program is not None else None,
        "failed": state.failed or state.runtime_failed,
    }


def captured_runner(module, x: tuple) -> Callable[[], object]:
    """``model(*x)`` under ``no_grad`` with the simulator's capture active (module-path hooks,
    the torch-function mode naming every op) and every op run as written: the cost of seeing
    each op, which every non-plain simulator run pays before it quantizes anything."""
    tracker = ModuleTracker(module)

    def as_written(call):  # ops that are not modelled ran already; their result is kept
        return call.result if call.result is not None else call.run()

    def run():
        with torch.no_grad(), tracker, CaptureMode(tracker, as_written):
            return module(*x)

    return run


def fake_quant_passes(sim: Simulator) -> Callable[[], object]:
    """The output fake quant of every op a steady FAKE run of ``sim`` replays (its prepared
    calls), each on a float32 tensor of that op's output shape and in place where the run
    writes in place, with nothing else: the fake quant's own arithmetic (composites such as
    LayerNorm, whose prepared call is their whole QAT form, are left out; an add or multiply
    whose run fuses the fake quant into its own pass, ``steady.compute``, counts as a separate
    pass). A tensor quantized in place is quantized again on the next call: the same
    passes."""
    gen = torch.Generator().manual_seed(0)
    work = [
        (prep.fq, torch.randn(sim._info[name].output_shape, generator=gen) * 3, prep.owned)
        for (name, mode), prep in sim._prepared.items()
        # a pass-through op or a composite has no output fake quant
        if mode is Mode.FAKE and prep.fq is not None
    ]

    def run():
        for fq, t, owned in work:
            fq(t, inplace=owned)

    return run


# where a fixed run calls its integer kernels: the int8 matrix product (1x1 and im2col
# convolutions, matmuls), the depthwise sums, the multiply-and-shift requantization
KERNEL_SITES = (
    (kernels, "_int_mm"),
    (kernels, "depthwise_conv_int32"),
    (requant_native, "requantize_shift"),
)


def integer_kernels(run: Callable[[], object]) -> Callable[[], object]:
    """The calls one ``run()`` makes to the integer kernels at ``KERNEL_SITES``, replayed in
    the same order on copies of their positional tensor arguments (a keyword argument, such as
    an ``out=`` buffer the run made, is the run's own) with nothing else around them. The
    replay is checked once to give every recorded call's outputs bit for bit (the same work);
    it keeps the count of calls per kernel in ``calls``."""
    recorded: list[tuple[Callable, list, dict, object]] = []
    originals = {(mod, name): getattr(mod, name) for mod, name in KERNEL_SITES}

    def recorder(fn):
        def record(*args, **kwargs):
            copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            result = fn(*args, **kwargs)
            recorded.append((fn, copies, kwargs, _snapshot(result)))
            return result

        return record

    try:
        for (mod, name), fn in originals.items():
            setattr(mod, name, recorder(fn))
        run()
    finally:
        for (mod, name), fn in originals.items():
            setattr(mod, name, fn)

    for fn, args, kwargs, want in recorded:
        if not _same_snapshot(_snapshot(fn(*args, **kwargs)), want):
            raise RuntimeError(f"replaying {fn.__name__} did not give its recorded output")
    calls = [(fn, args, kwargs) for fn, args, kwargs, _ in recorded]
    recorded.clear()  # the outputs' copies go

    def replay():
        for fn, args, kwargs in calls:
            fn(*args, **kwargs)

    replay.calls = {
        name: sum(fn is originals[mod, name] for fn, *_ in calls) for mod, name in KERNEL_SITES
    }
    return replay


def _snapshot(result) -> list:
    """The tensors of a kernel's result (a tensor or a tuple of them), copied."""
    parts = result if isinstance(result, tuple) else (result,)
    return [p.clone() if isinstance(p, torch.Tensor) else p for p in parts]


def _same_snapshot(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        same_bits(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b)
    )


def kernel_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Per case: fixed j6m and its integer kernels alone over onnxruntime int8 QOperator,
    against the fixed target over QOperator."""
    limit = TARGETS[FIXED][1]
    rows = []
    for case, sub in table.groupby("case", sort=False):
        by = sub.set_index("variant")
        rows.append(
            {
                "case": case,
                "fixed_x_ort_int8": by.x_ort_int8[FIXED],
                "kernels_x_ort_int8": by.x_ort_int8[FIXED_KERNELS],
                "kernels_x_eager": by.x_eager[FIXED_KERNELS],
                "kernels_share_of_fixed": by.median_wall_ms[FIXED_KERNELS]
                / by.median_wall_ms[FIXED],
                **{f"{name}_calls": n for name, n in KERNEL_CALLS[case].items()},
                "target": limit,
                "kernels_above_target": bool(by.x_ort_int8[FIXED_KERNELS] > limit),
            }
        )
    return pd.DataFrame(rows)


def floor_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Per case: fake mode's floor (captured run + fake-quant passes, x eager) against the
    fake run, and what is left for quantlab's own per-op work."""
    rows = []
    for case, sub in table.groupby("case", sort=False):
        by = sub.set_index("variant")
        x, paired = by.x_eager, by.paired_x_eager
        floor = x[CAPTURED] + x[FQ_PASSES]
        rows.append(
            {
                "case": case,
                "captured_x": x[CAPTURED],
                "fq_passes_x": x[FQ_PASSES],
                "floor_x": floor,
                "floor_paired": paired[CAPTURED] + paired[FQ_PASSES],
                "fake_x": x[FAKE_CAPTURED],
                "fake_paired": paired[FAKE_CAPTURED],
                "dispatch_x": x[FAKE_CAPTURED] - floor,
                "target": TARGETS[FAKE][0],
                "floor_above_target": bool(floor > TARGETS[FAKE][0]),
                # the traced program sees no op: its floor is the model plus the fake quants
                "program_floor_x": 1.0 + x[FQ_PASSES],
                "program_x": x[FAKE] if SWITCH[case][FAKE]["switched"] else float("nan"),
            }
        )
    return pd.DataFrame(rows)


# untimed calls of a variant before each of its timed calls (at least one)
LEAD_IN_S = 0.02


def time_interleaved(fns: dict[str, Callable[[], object]], rounds: int) -> pd.DataFrame:
    """Wall and CPU time of one call of each variant per round. Each timed call follows
    ``LEAD_IN_S`` seconds of untimed calls of the same variant, so it meets the machine as a
    loop of that variant does. Measured on 2 cores: an onnxruntime run of MobileNetV2 took
    2.2 ms right after an eager torch call, 2.5 ms after a 2 to 50 ms sleep, 1.7 ms after one
    call of its own and 1.3 ms (its loop's time) after 8 or more; at batch 8, 12.0 ms right
    after eager torch against 8.7 ms after a call of its own."""
    rows = []
    for r in range(rounds):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            while time.perf_counter() - t < LEAD_IN_S:
                fn()
            t, c = time.perf_counter(), time.process_time()
            fn()
            rows.append(
                {
                    "round": r,
                    "variant": name,
                    "wall_s": time.perf_counter() - t,
                    "cpu_s": time.process_time() - c,
                }
            )
    return pd.DataFrame(rows)


def bench_case(case: Case, rounds: int, threads: int) -> pd.DataFrame:
    fns = variants(case, threads)
    gc.collect()
    times = time_interleaved(fns, rounds)
    med = times.groupby("variant", sort=False).agg(
        median_wall_ms=("wall_s", "median"), median_cpu_ms=("cpu_s", "median")
    )
    med = med * 1e3
    med["x_eager"] = med.median_wall_ms / med.loc[EAGER, "median_wall_ms"]
    # paired: each round's time over the eager time of the same round, then the median; a
    # slow spell of the machine that spans a round moves both and cancels
    wall = times.pivot(index="round", columns="variant", values="wall_s")
    paired = wall.div(wall[EAGER], axis=0)
    med["paired_x_eager"] = paired.median()
    med["paired_q25"] = paired.quantile(0.25)
    med["paired_q75"] = paired.quantile(0.75)
    med["cpu_x_eager"] = med.median_cpu_ms / med.loc[EAGER, "median_cpu_ms"]
    med["x_ort_int8"] = med.median_wall_ms / med.loc[ORT8, "median_wall_ms"]
    med["per_item_ms"] = med.median_wall_ms / case.batch
    med = med.reset_index()
    med.insert(0, "case", case.label)
    med["rounds"] = rounds
    return med


def bench_lut(threads: int, repeats: int, log2n: int = 22) -> dict:
    """int16 sigmoid segment LUT (SegmentLut.evaluate) vs torch.sigmoid on 2**log2n elements."""
    n = 1 << log2n
    x, codes, lut, _ = sigmoid_case(log2n)
    switch = run_until_compiled(lut, codes)  # a loop's steady state: the gather's compiled tier
    preallocated = torch.empty_like(x)
    fns = {
        "torch.sigmoid": lambda: torch.sigmoid(x),
        "torch.sigmoid out=": lambda: torch.sigmoid(x, out=preallocated),
        "lut": lambda: lut.evaluate(codes),
    }
    for fn in fns.values():
        fn()
    times = time_interleaved(fns, repeats)
    med = times.groupby("variant").wall_s.median()
    return {
        "elements": n,
        "threads": threads,
        "sigmoid_ms": med["torch.sigmoid"] * 1e3,
        "lut_ms": med["lut"] * 1e3,
        "ratio": med["lut"] / med["torch.sigmoid"],
        "sigmoid_out_ms": med["torch.sigmoid out="] * 1e3,
        "ratio_out": med["lut"] / med["torch.sigmoid out="],
        "repeats": repeats,
        "switch": switch,
    }


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_child(mode: str, threads: int) -> None:
    """Run MobileNetV2 once in ``mode`` in this (fresh) process; print the peak RSS growth."""
    torch.set_num_threads(threads)
    case = CASES[0]
    sim = Simulator(build_model(case.model).module, "j6m")
    sim.calibrate([case.inputs(1)], progress=False)
    x = case.inputs(0)
    for m in (Mode.FAKE, Mode.FIXED):
        sim.run(*x, mode=m)
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status_kb("VmRSS")
    y = sim.run(*x, mode=mode)
    peak = _status_kb("VmHWM")
    print(json.dumps({"mode": mode, "peak_growth_kib": peak - before, "out": float(y.sum())}))


def memory(threads: int) -> dict[str, float]:
    """Peak resident growth (MiB) of one run per mode, each in a fresh subprocess (glibc's mmap
    threshold pinned at 64 KiB so freed tensors leave the resident set)."""
    mib = {}
    for mode in ("float", "fake", "fixed"):
        cmd = [sys.executable, __file__, "--memory-child", mode, "--threads", str(threads)]
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT, env=env)
        mib[mode] = json.loads(out.stdout.strip().splitlines()[-1])["peak_growth_kib"] / 1024
    return mib


def target_rows(table: pd.DataFrame, lut: dict, mem: dict) -> list[dict]:
    rows = []
    for case, sub in table.groupby("case", sort=False):
        sub = sub.set_index("variant")
        for v, (lim_e, lim_o) in TARGETS.items():
            if v not in sub.index:  # a traced program where torch.fx cannot trace the model
                rows.append(_target(f"{case}: {v} / eager", float("nan"), lim_e))
                continue
            fig = sub.loc[v, "x_eager"]
            rows.append(_target(f"{case}: {v} / eager", fig, lim_e, sub.loc[v, "paired_x_eager"]))
            if lim_o is not None:
                rows.append(_target(f"{case}: {v} / {ORT8}", sub.loc[v, "x_ort_int8"], lim_o))
    rows.append(_target("int16 sigmoid LUT / torch.sigmoid", lut["ratio"], LUT_TARGET))
    if mem:
        fig = mem["fixed"] / mem["float"]
        rows.append(_target("peak memory of one run: fixed / float", fig, MEMORY_TARGET))
    return rows


def _target(what: str, figure: float, limit: float, paired: float | None = None) -> dict:
    return {
        "target": what,
        "figure": round(float(figure), 3),
        "paired": None if paired is None else round(float(paired), 3),
        "limit": limit,
        "status": "met" if figure <= limit else "not measured" if figure != figure else "MISSED",
    }


def batch_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Per-item cost at batch 8 over batch 1, per variant (below 1: the per-item cost falls)."""
    b1 = table[table.case == CASES[0].label].set_index("variant").per_item_ms
    b8 = table[table.case == CASES[-1].label].set_index("variant").per_item_ms
    return pd.DataFrame(
        {"variant": b1.index, "per_item_ms_b1": b1.values, "per_item_ms_b8": b8[b1.index].values}
    ).assign(b8_over_b1=lambda d: d.per_item_ms_b8 / d.per_item_ms_b1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=None, help="default 15, with --quick 3")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--quick", action="store_true", help="first case only, 3 rounds unless --rounds, no memory"
    )
    ap.add_argument("--out", type=Path, default=OUT, help="report folder")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also write simulate_profile.md (MobileNetV2; MiniLM's fixed program by op type)",
    )
    ap.add_argument(
        "--profile-only", action="store_true", help="write simulate_profile.md and nothing else"
    )
    ap.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.threads)
        return
    torch.set_num_threads(args.threads)
    start, load_before = time.time(), os.getloadavg()
    cases = CASES[:1] if args.quick else CASES
    rounds = args.rounds if args.rounds is not None else (3 if args.quick else 15)
    if args.profile_only:
        write_profile(args.out, args.threads, rounds)
        return
    parts = []
    for case in cases:
        print(f"timing {case.label} ...", flush=True)
        parts.append(bench_case(case, rounds, args.threads))
    table = pd.concat(parts, ignore_index=True)
    lut = bench_lut(args.threads, max(rounds, 9))
    mem = {} if args.quick else memory(args.threads)
    load_after = os.getloadavg()
    target_list = target_rows(table, lut, mem)
    targets = pd.DataFrame(target_list)
    batch = batch_rows(table) if not args.quick else pd.DataFrame()
    floor = floor_rows(table)
    kernel_floor = kernel_rows(table)
    meta = {
        "load_average_1_5_15_before": [round(v, 2) for v in load_before],
        "load_average_1_5_15_after": [round(v, 2) for v in load_after],
        "cpu_count": os.cpu_count(),
        "threads": args.threads,
        "rounds": rounds,
        "torch": torch.__version__,
        "python": host.python_version(),
        "machine": host.machine(),
        "cpu": cpu_description(),
        "seconds": round(time.time() - start, 1),
        "command": "python benchmarks/bench_simulate.py"
        + (" --quick" if args.quick else "")
        + (f" --rounds {args.rounds}" if args.rounds is not None else "")
        + (f" --out {shown_path(args.out)}" if args.out.resolve() != OUT.resolve() else ""),
    }
    result = {
        "meta": meta,
        "targets": target_list,  # paired: null where no paired ratio applies
        "cases": table.to_dict("records"),
        "batch8_per_item": batch.to_dict("records"),
        "fake_floor": floor.to_dict("records"),
        "fixed_kernels": kernel_floor.to_dict("records"),
        "switch_to_program": SWITCH,
        "lut": lut,
        "peak_memory_growth_mib": mem,
    }
    show = table[
        ["case", "variant", "median_wall_ms", "x_eager", "median_cpu_ms"]
        + ["paired_x_eager", "paired_q25", "paired_q75", "cpu_x_eager", "x_ort_int8"]
        + ["per_item_ms"]
    ]
    missed = int((targets.status == "MISSED").sum())
    unmeasured = int((targets.status == "not measured").sum())
    md = [
        "# Simulator speed against plain eager torch and onnxruntime",
        "",
        f"Load average (1, 5, 15 min) {meta['load_average_1_5_15_before']} before and "
        f"{meta['load_average_1_5_15_after']} after, on {meta['cpu_count']} cores: "
        + (
            "the machine was busy when it started; timings are distorted (ratios measured "
            "interleaved less so)."
            if load_before[0] > 0.5
            else "the machine was idle when it started (the figure after counts the "
            "benchmark's own threads)."
        ),
        "",
        f"Baseline: plain eager torch, `model(*x)` under `torch.no_grad()`, nothing captured, in "
        f"the same process. Medians of {rounds} interleaved rounds, each timed call after "
        f"{LEAD_IN_S * 1e3:.0f} ms of untimed calls of the same variant, as in a loop (an "
        "onnxruntime call right after eager torch, or after a pause, takes up to twice its "
        "loop's time here; `time_interleaved`), wall time (CPU time of all threads beside "
        f"it), {args.threads} intra-op threads everywhere; onnxruntime with "
        "`session.intra_op.allow_spinning` = 0, its int8 model statically quantized (QOperator, "
        "int8 weights per channel, uint8 activations) from the same module. Pretrained weights, "
        "BatchNorm folded. torch " + torch.__version__ + f"; run took {meta['seconds']} s.",
        "",
        f"CPU: {meta['cpu']}.",
        "",
        f"## Targets: {len(targets) - missed - unmeasured} met, {missed} missed"
        + (f", {unmeasured} not measured" if unmeasured else ""),
        "",
        markdown_table(
            targets.astype({"paired": object, "figure": object}).fillna(
                {"paired": "-", "figure": "-"}
            )
        ),
        "",
        f"`{FAKE}`, `{FIXED}`, `{FIXED_ORT}`: `Simulator.run(*x, mode=...)` as a loop runs "
        "it: once steady runs of one mode and input signature have taken `PROGRAM_AFTER_S` "
        "seconds captured (and `PROGRAM_AFTER_RUNS` runs), they run as a traced program "
        "(torch.fx trace, every module inlined, its Python state guarded by torch dynamo; "
        "`quantlab.simulate.steady_programs`), with "
        "the same bits as the captured run (checked here before timing, and in "
        "tests/simulate/test_steady_programs.py, test_program.py and test_pinned_codes.py). "
        f"`{FAKE_CAPTURED}`, `{FIXED_CAPTURED}`: every run captured per op "
        "(`steady_programs=False`). Before the timed rounds each of these loops ran until the "
        "switch:",
        "",
        markdown_table(
            pd.DataFrame(
                [
                    {"case": c, "variant": v, **info}
                    for c, by in SWITCH.items()
                    for v, info in by.items()
                ]
            )
        ),
        "",
        "captured_runs and captured_s: the runs (and their seconds) before the switch; "
        "build_s: building the program (two runs in its mode, the torch.fx trace and named run, "
        "torch dynamo's trace for the guards); loop_s: the whole loop. A loop shorter than "
        "captured_s + build_s runs captured throughout, at the captured figure.",
        "",
        f"The onnxruntime profile is the one of this machine's onnxruntime "
        f"(`quantlab.export.ort_host.onnxruntime_profile()`): here `{onnxruntime_profile()}`. "
        f"`{FIXED_ORT}` and `{FIXED_ORT_ASYM}` switch to a `RuntimeProgram`: the onnxruntime "
        "profile's fixed mode is what onnxruntime computes on its QDQ export, so the loop runs "
        "that export in an onnxruntime session (torch's thread count, spinning off; "
        "`quantlab.simulate.runtime_program`), proven on the build's inputs to give the "
        "captured FIXED run's bits and used while nothing it was exported from changed "
        "(checked here before timing against a captured run, and in "
        f"tests/simulate/test_runtime_program.py). `{FIXED_ORT_OWN}`: the same runs on "
        "quantlab's own traced program (`steady_programs.runtime_sessions = False`), what the "
        "emulation itself costs. "
        f"`{FIXED_ORT_ASYM}`: activations with zero points (`activation_symmetry: "
        "asymmetric`, calibrated from min and max), the numerics of the QOperator baseline; "
        "with the profile's default symmetric activations a ReLU6's int8 codes reach below its "
        "0, so the export clips the convolution's uint8 codes (a Clip node per ReLU6, "
        "`emit_gemm.code_clip`) where the QOperator model folds the bound into the output's "
        "uint8 range.",
        "",
        "## Per case (x eager: median wall time over eager's; x ort int8: over onnxruntime int8)",
        "",
        "paired: the median over rounds of each round's wall time over the eager time of the "
        "same round (q25, q75: its quartiles). A slow spell of the machine that spans a round "
        "moves a variant and its baseline alike, so the paired ratio drifts less between runs; "
        "the targets are judged on x eager, the ratio of medians.",
        "",
        markdown_table(show, max_rows=100, floatfmt=".3g"),
        "",
    ]
    md += [
        "## Fake mode's floor",
        "",
        f"captured_x: `{CAPTURED}` (module-path hooks and the torch-function mode that names "
        "each op, every op run as written), over eager. fq_passes_x: the output fake quant "
        "of every op a steady fake run replays, alone on tensors of their output shapes, in "
        "place where the run writes in place (composites such as LayerNorm are left out; "
        "an add or multiply the run computes with its fake quant in one pass counts as a "
        "pass of its own), over eager. floor_x = captured_x + fq_passes_x estimates what a "
        "fake run costs before any of quantlab's own per-op work (dispatch_x = fake_x - "
        "floor_x; "
        "floor_paired and fake_paired: the same from the paired ratios). Where floor_x is "
        f"above the fake target ({TARGETS[FAKE][0]}x), a simulator that sees the model's ops "
        "one by one would miss the target in this run even with no per-op work of its own. "
        f"fake_x is `{FAKE_CAPTURED}`. The traced program (`{FAKE}` after the switch) sees "
        "no op: its floor is the model itself plus the fake quants (program_floor_x = 1 + "
        "fq_passes_x; program_x: its time over eager, blank where the runs did not switch).",
        "",
        markdown_table(floor, floatfmt=".3g"),
        "",
    ]
    md += [
        "## Fixed mode's kernels against onnxruntime int8",
        "",
        f"`{FIXED_KERNELS}`: the calls a steady `{FIXED}` run makes to quantlab's integer "
        "kernels (torch's int8 matrix product `torch._int_mm` for the 1x1 and im2col "
        "convolutions and the matmuls, the depthwise convolution's C sums, the C pass of the "
        "multiply-and-shift requantization that writes the codes and their float32 values), "
        "recorded once and replayed in the same order on copies of their arguments with "
        "nothing else (checked before timing to give every recorded output bit for bit; "
        "`integer_kernels`). Left out: what the run does besides them (convolutions computed "
        "exactly in float32, such as MobileNetV2's first one, the elementwise fixed kernels "
        "and LUTs, layout copies, quantlab's per-op work). kernels_x_ort_int8: their time "
        f"over `{ORT8}`; where it is above the fixed target ({TARGETS[FIXED][1]}x), a fixed "
        "run built on these kernels misses the target in this run even with no other work. "
        "kernels_share_of_fixed: their time over the fixed run's. *_calls: calls per run.",
        "",
        markdown_table(kernel_floor, floatfmt=".3g"),
        "",
    ]
    if not batch.empty:
        md += [
            "## Batch 8 against batch 1 (MobileNetV2): per-item wall time",
            "",
            markdown_table(batch, floatfmt=".3g"),
            "",
        ]
    md += [
        f"int16 sigmoid segment LUT (`SegmentLut.evaluate`) on {lut['elements']} codes: "
        f"{lut['lut_ms']:.2f} ms vs torch.sigmoid {lut['sigmoid_ms']:.2f} ms on as many float32 "
        f"values ({lut['ratio']:.2f}x; against torch.sigmoid into a preallocated output, "
        f"{lut['sigmoid_out_ms']:.2f} ms, the stricter figure, as its time does not move with "
        f"the allocator's state: {lut['ratio_out']:.2f}x; bench_lut.py explains). "
        f"{describe(lut['switch'])}"
        + (" Peak memory growth of one MobileNetV2 run (MiB): " if mem else "")
        + ", ".join(f"{k} {v:.1f}" for k, v in mem.items()),
        "",
        "![x eager per variant](simulate.png)",
        "",
        f"Reproduce: `{meta['command']}` (writes simulate.md, simulate.json, simulate.png).",
        "",
    ]
    plot = Plot(
        "simulate",
        x="variant",
        y="x_eager",
        xlabel="variant",
        ylabel="median wall time (x plain eager torch)",
        title="Simulator and onnxruntime cost per case",
        facet="case",
        kind=PlotKind.BAR,
    )
    fig = draw(plot, table)
    atomic_write_text(args.out / "simulate.json", json.dumps(result, indent=1, default=float))
    atomic_savefig(fig, args.out / "simulate.png")
    atomic_write_text(args.out / "simulate.md", "\n".join(md))
    print("\n".join(md))
    if args.profile:
        write_profile(args.out, args.threads, rounds)


def write_profile(out: Path, threads: int, rounds: int) -> None:
    """simulate_profile.md: where fake and fixed MobileNetV2 runs spend their time, and
    MiniLM's steady fixed program by op type (``program_steps_section``)."""
    from profile_stages import aten_table, profile_run, python_table

    case = CASES[0]
    fns = variants(case, threads)
    load_before = os.getloadavg()
    timed = [EAGER, CAPTURED, FQ_PASSES, FAKE_CAPTURED, FAKE, FIXED_CAPTURED, FIXED]
    med = time_interleaved({v: fns[v] for v in timed}, rounds).groupby("variant").wall_s.median()
    ms = med * 1e3
    eager, captured, passes, fake = ms[EAGER], ms[CAPTURED], ms[FQ_PASSES], ms[FAKE_CAPTURED]
    layers = [
        ("the model's own run (eager torch, nothing captured)", eager),
        (
            "seeing every op: module-path wrapper, torch-function mode (captured - eager)",
            captured - eager,
        ),
        ("the output fake quants' passes alone", passes),
        (
            "quantlab's per-op work: prepared-call checks, side table, op table "
            "(fake - captured - passes)",
            fake - captured - passes,
        ),
        ("fake run, captured per op (total)", fake),
        (f"{FAKE}: after the switch to a traced program (total)", ms[FAKE]),
    ]
    layer_table = pd.DataFrame(
        [{"part": k, "ms per run": v, "x eager": v / eager} for k, v in layers]
    )
    fixed_layers = [
        ("the model's own run (eager torch, nothing captured)", eager),
        ("seeing every op (captured - eager)", captured - eager),
        (
            "fixed run's own work besides seeing the ops: dispatch, kernels, bookkeeping "
            "(fixed captured - captured)",
            ms[FIXED_CAPTURED] - captured,
        ),
        ("fixed run, captured per op (total)", ms[FIXED_CAPTURED]),
        (f"{FIXED}: after the switch to a traced program (total)", ms[FIXED]),
        ("saved by the program (fixed captured - program)", ms[FIXED_CAPTURED] - ms[FIXED]),
    ]
    fixed_table = pd.DataFrame(
        [{"part": k, "ms per run": v, "x eager": v / eager} for k, v in fixed_layers]
    )
    md = [
        f"# Where the time goes: {case.label}, j6m, {threads} threads",
        "",
        f"Load average (1, 5, 15 min) {[round(v, 2) for v in load_before]} before and "
        f"{[round(v, 2) for v in os.getloadavg()]} after the timed rounds, on "
        f"{os.cpu_count()} cores. Reproduce: `python benchmarks/bench_simulate.py "
        "--profile-only` (`--profile` writes it after simulate.md's run; this report is its "
        "own run).",
        "",
    ]
    md += _section(
        f"{FAKE_CAPTURED}: wall time by part",
        f"Medians of {rounds} interleaved rounds of each variant (wall time, no profiler), "
        "parts taken as differences: the captured run is the model with every op seen and "
        "nothing quantized; the passes are the output fake quant of every prepared call on a "
        "tensor of that op's output shape; what is left of the fake run is quantlab's own "
        "per-op work (a fake run also skips the fused clamps the eager model computes, so this "
        "part reads slightly low).",
        layer_table,
    )
    aten = aten_table(fns[FAKE_CAPTURED], 5)  # warm from the timed rounds; no stage table here
    md += _section(
        f"{FAKE_CAPTURED}: own time per function",
        "cProfile over 5 runs: own time of each Python function or builtin (builtins such as "
        "torch.conv2d hold the op's computation; a captured op's builtin counts twice per "
        "call: the model's call, which the capture takes over, and the simulator's own). "
        "cProfile adds a fixed cost to every Python call, so the Python functions read high "
        "against the wall-time parts above; the list shows what the per-op work consists of.",
        python_table(fns[FAKE_CAPTURED], 5),
    )
    md += _section(f"{FAKE_CAPTURED}: aten ops", "torch.profiler self CPU time over 5 runs.", aten)
    md += _section(
        f"{FAKE}, after the switch to a traced program: own time per function",
        "cProfile over 5 runs, as above: what a steady run still does besides the ops. "
        + checks_line(fns[FAKE], fns[FAKE].program_of(), case.inputs(0)),
        python_table(fns[FAKE], 5),
    )
    md += _section(
        f"{FIXED}: wall time by part",
        f"Medians of the same {rounds} interleaved rounds. A fixed run replaces the model's "
        "float GEMMs by exact integer ones, so its own work is what it adds to, and saves from, "
        "the model's run.",
        fixed_table,
    )
    aten, stages = profile_run(fns[FIXED])
    md += _section(
        f"{FIXED}, after the switch to a traced program: stages",
        "Cumulative time of the functions implementing each stage (cProfile over 5 runs, which "
        "inflates Python-heavy stages; the shares still rank them). The program sees no op, so "
        "the rest is dispatch, bookkeeping and the model's float ops.",
        stages,
    )
    md += _section(f"{FIXED}: aten ops", "torch.profiler self CPU time over 5 runs.", aten)
    md += program_steps_section(CASES[2], threads, rounds)
    atomic_write_text(out / "simulate_profile.md", "\n".join(md))
    print("\n".join(md))


def program_steps_section(case: Case, threads: int, rounds: int) -> list[str]:
    """simulate_profile.md's section on ``case``'s steady fixed j6m run (a traced program):
    its wall time against plain eager torch, onnxruntime int8 QOperator and its integer
    kernels alone (interleaved medians), and the program's steps' wall time by op type."""
    from profile_stages import step_table

    module = build_model(case.model).module
    x, calib = case.inputs(0), [case.inputs(1), case.inputs(2)]
    sim = Simulator(module, "j6m")
    sim.calibrate(calib, progress=False)

    def fixed():
        return sim.run(*x, mode=Mode.FIXED)

    switch = run_until_switched(fixed, sim, x, Mode.FIXED)
    if not switch["switched"]:
        raise RuntimeError(f"{case.label}: the fixed runs did not switch: {switch['failed']}")

    def eager():
        with torch.no_grad():
            return module(*x)

    fns = {EAGER: eager, FIXED: fixed, ORT8: ort_runners(module, x, calib, threads)[ORT8]}
    fns[FIXED_KERNELS] = integer_kernels(fixed)
    for fn in fns.values():
        fn()
    ms = time_interleaved(fns, rounds).groupby("variant").wall_s.median() * 1e3
    steps = step_table(sim, fixed, 10)
    text = (
        f"Medians of {rounds} interleaved rounds (wall time): eager torch {ms[EAGER]:.1f} ms, "
        f"{FIXED} {ms[FIXED]:.1f} ms ({ms[FIXED] / ms[ORT8]:.2f}x {ORT8}, {ms[ORT8]:.1f} ms), "
        f"its integer kernels alone {ms[FIXED_KERNELS]:.1f} ms (torch's int8 matrix product "
        "and the multiply-and-shift pass, replayed in order as in simulate.md). Below, the "
        "traced program's steps over 10 runs, each timed around its call with no profiler, by "
        "the op type they compute (a step holds its op's kernels, its quantization and "
        "quantlab's per-op work; the integer matrix products are in linear and matmul)."
    )
    return _section(f"{case.label}: {FIXED}, its program's steps by op type", text, steps)


def checks_line(fake: Callable[[], object], program, x: tuple, runs: int = 25) -> str:
    """The wall time of the traced program's per-call checks, and of torch dynamo's guards among
    them, each timed right after a steady run (as a loop meets them: their objects out of the
    caches), with no profiler running."""

    def after_a_run_us(check) -> float:
        times = []
        for _ in range(runs):
            fake()
            t = time.perf_counter()
            check()
            times.append((time.perf_counter() - t) * 1e6)
        return float(pd.Series(times).median())

    checks = after_a_run_us(lambda: program._holds(x))
    guards = after_a_run_us(lambda: program.guard.holds(x))
    return (
        f"Without a profiler, right after a steady run, the program's checks take {checks:.0f} "
        f"us, of which torch dynamo's guards over forward take {guards:.0f} us (medians of "
        f"{runs}); in a tight loop of checks alone, with their objects in the caches, a "
        "fraction of that."
    )


def _section(title: str, text: str, table: pd.DataFrame) -> list[str]:
    """Markdown lines of one report section: its heading, what it measured, its table."""
    return [f"## {title}", "", text, "", markdown_table(table, floatfmt=".3g"), ""]


if __name__ == "__main__":
    main()
