"""quantlab leaves torch's global state as it found it: importing it, and running the exact
GEMM fast paths, float16 emulation, LUTs, a fixed-mode simulation and steady fake runs that
switch to a traced program (torch dynamo traces its guards), change no precision flag, grad mode
or torch-function mode,
no thread count and no random number generator state, and a large LUT evaluation starts no
thread (a thread running torch ops gets an OpenMP pool of its own, which then slows the
caller's torch calls) (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = r"""
import hashlib, json, threading, warnings
import numpy as np
import torch
import torch._dynamo

warnings.simplefilter("ignore")
PAIRS = [("generic", "all")] + [(b, o) for b in ("mkldnn", "cuda")
                                for o in ("all", "matmul", "conv", "rnn")]

def snapshot():
    get = torch._C._get_fp32_precision_getter
    s = {f"{b}.{o}": get(b, o) for b, o in PAIRS}
    s["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    s["nnpack"] = torch._C._get_nnpack_enabled()
    s["mkldnn"] = torch._C._get_mkldnn_enabled()
    s["cpu_fp16_reduced_reduction"] = torch._C._get_cpu_allow_fp16_reduced_precision_reduction()
    s["threads"] = torch.get_num_threads()
    s["interop_threads"] = torch.get_num_interop_threads()
    s["torch_rng"] = hashlib.sha256(torch.random.get_rng_state().numpy().tobytes()).hexdigest()
    s["numpy_rng"] = hashlib.sha256(np.random.get_state()[1].tobytes()).hexdigest()
    s["grad"] = torch.is_grad_enabled()
    s["torch_function_modes"] = torch._C._len_torch_function_stack()
    s["dynamo_stance"] = repr(torch._dynamo.eval_frame._stance)
    return s

report = {}
before_import = snapshot()
import quantlab, quantlab.numerics, quantlab.numerics.lut, quantlab.simulate, quantlab.platforms
import quantlab.numerics.float16 as f16
from quantlab.numerics import gemm
from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import build_lut
from quantlab.simulate import Mode, Simulator
report["import"] = [k for k, v in snapshot().items() if v != before_import[k]]

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Sigmoid(),
                            torch.nn.Conv2d(8, 4, 1), torch.nn.Flatten(), torch.nn.Linear(64, 5))
g = torch.Generator().manual_seed(1)
calib = torch.randn(2, 3, 4, 4, generator=g)
x = torch.randn(2, 3, 4, 4, generator=g)

# a user who asked for reduced-precision float32 kernels and two threads
torch.set_float32_matmul_precision("medium")
torch.backends.mkldnn.conv.fp32_precision = "bf16"
torch.set_num_threads(2)
user = snapshot()
thread_calls = []
real_set_threads = torch.set_num_threads
torch.set_num_threads = lambda n: (thread_calls.append(n), real_set_threads(n))[1]

def codes(shape, dtype, seed):
    info = torch.iinfo(dtype)
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(info.min, info.max + 1, shape, generator=gen).to(dtype)

gemm.int_conv2d(codes((1, 8, 6, 6), torch.int8, 2), codes((4, 8, 3, 3), torch.int8, 3), padding=1)
gemm.int_conv2d(codes((1, 64, 32, 32), torch.int16, 4), codes((64, 64, 3, 3), torch.int8, 5),
                padding=1)
gemm.int_matmul(codes((5, 40), torch.int8, 6), codes((40, 3), torch.int8, 7))
gemm.int_matmul(codes((5, 40), torch.int16, 8), codes((40, 3), torch.int16, 9))
f16.matmul(torch.randn(3, 4, generator=g).half(), torch.randn(4, 2, generator=g).half())
lut = build_lut("sigmoid", DType.INT16, 0.001, DType.INT16, 1 / 32767)
lut.evaluate(codes((3000,), torch.int16, 10))
threads_before = set(threading.enumerate())
lut.evaluate(codes((1 << 22,), torch.int16, 11))
report["lut_threads_started"] = [t.name for t in set(threading.enumerate()) - threads_before]
sim = Simulator(model, "j6m")
sim.calibrate([(calib,)])
sim.run(x, mode=Mode.FAKE)
sim.run(x, mode=Mode.FIXED)
import quantlab.simulate.steady_programs as steady_programs
steady_programs.PROGRAM_AFTER_S = 0.0  # the next steady FAKE run builds a traced program
sim.run(x, mode=Mode.FAKE)
sim.run(x, mode=Mode.FAKE)
sim.run(x, mode=Mode.FIXED)  # and the next steady FIXED run builds one too
sim.run(x, mode=Mode.FIXED)
report["program_runs"] = [sim.steady_programs.status((x,), m).program_runs
                          for m in (Mode.FAKE, Mode.FIXED)]
from torch._dynamo.utils import counters
frames = dict(counters["frames"])
with torch.no_grad():
    model(x)  # the model itself runs eagerly: dynamo traced only the guard's own function
report["frames_traced_by_a_plain_call"] = {k: v - frames.get(k, 0)
                                           for k, v in counters["frames"].items()
                                           if v != frames.get(k, 0)}
report["use"] = [k for k, v in snapshot().items() if v != user[k]]
report["set_num_threads_calls"] = thread_calls
print(json.dumps(report))
"""


def test_import_and_fast_paths_leave_torch_global_state_alone():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    want = {
        "import": [],
        "use": [],
        "set_num_threads_calls": [],
        "lut_threads_started": [],
        "program_runs": [1, 1],
        "frames_traced_by_a_plain_call": {},
    }
    assert report == want, out.stderr[-2000:]
