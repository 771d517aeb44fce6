"""Random nets against the captured run. Each net is a random program of steps drawn from
``random_nets.STEPS``, each reading earlier tensors: GEMMs with fused chains (batch_norm,
clamps) reached late, in-place writes through views and chunks, in-place sums on a tensor other
steps hold, item assignment, calls that are not modelled ops, views kept and read after writes.

- Replay: every studied op, in FAKE, FIXED and FLOAT op modes, over FLOAT, FAKE and FIXED
  traces, gives the naive run's bits, and the trace does not change.
- Programs: a net's traced program gives ``Simulator.run``'s bits in FAKE, HYBRID and FIXED
  mode, on inputs at several magnitudes.

Even seeds run their GEMMs on torch's int8 matrix product, odd seeds on the float32 and C
paths (``_both_gemm_paths``)."""

from __future__ import annotations

import re

import pytest
import torch
from bits import assert_bits_equal, leaves
from random_nets import UPSAMPLING_STEPS, C, RandomNet, S

from quantlab.simulate import Mode, OpMode, Simulator

# some nets write into their input (a step on a view of it): the simulator copies inputs then
pytestmark = pytest.mark.filterwarnings("ignore:RandomNet.forward writes into its input")


def _both_gemm_paths(seed: int, request) -> None:
    """Even seeds with AUTO on torch's int8 matrix product (the path of CPUs with VNNI), odd
    ones on the float32 and C paths (conftest's default, the path of other CPUs)."""
    if seed % 2 == 0:
        request.getfixturevalue("int8_product_fast")


# 49: a convolution's fused chain reached after a studied op (a replay passes it through)
@pytest.mark.parametrize("seed", [*range(20), 49])
def test_random_nets_replay_to_the_naive_bits(seed, request):
    _both_gemm_paths(seed, request)
    _replay_to_the_naive_bits(seed, None)


@pytest.mark.parametrize("seed", range(4))
def test_random_upsampling_nets_replay_to_the_naive_bits(seed, request):
    """Nets with transposed convolutions (a fused BatchNorm, a fused relu6, groups)."""
    _both_gemm_paths(seed, request)
    _replay_to_the_naive_bits(seed, UPSAMPLING_STEPS, n_steps=10)


def _replay_to_the_naive_bits(seed: int, steps: dict | None, n_steps: int = 14):
    torch.manual_seed(seed)
    model = RandomNet(seed, n_steps, steps).eval()
    g = torch.Generator().manual_seed(seed)
    shape = (2, C, S, S)
    sim = Simulator(model, "j6m")
    sim.calibrate([(torch.randn(shape, generator=g),) for _ in range(2)], progress=False)
    x = torch.randn(shape, generator=g)
    sim.run(x.clone(), mode=Mode.FAKE)
    names = list(sim.ops["name"])
    compared = 0
    for mode in (Mode.FLOAT, Mode.FAKE, Mode.FIXED):
        trace = sim.trace(x.clone(), mode=mode)  # every run gets its own input: steps write it
        before = {k: v.clone() for k, v in trace.outputs.items() if isinstance(v, torch.Tensor)}
        for name in names:
            for om in (OpMode(Mode.FAKE), OpMode(Mode.FIXED), OpMode(Mode.FLOAT)):
                try:  # an op fused into its GEMM has no output point of its own to quantize
                    naive = sim.run(x.clone(), mode=mode, op_modes={name: om})
                except ValueError as err:
                    with pytest.raises(ValueError, match=re.escape(str(err)[:40])):
                        sim.run(x.clone(), mode=mode, op_modes={name: om}, replay=trace)
                    continue
                fast = sim.run(x.clone(), mode=mode, op_modes={name: om}, replay=trace)
                for p, q in zip(leaves(fast), leaves(naive), strict=True):
                    assert_bits_equal(p, q)
                compared += 1
        for k, v in before.items():
            assert_bits_equal(trace.outputs[k], v)
    assert compared >= 3 * len(names)


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
# 109, 111: an in-place sum on a tensor another step still holds (traced as a write)
@pytest.mark.parametrize("seed", [*range(100, 106), 109, 111])
def test_random_nets_run_as_programs_with_the_captured_runs_bits(seed, platform, request):
    _both_gemm_paths(seed, request)
    _programs_give_the_captured_bits(seed, platform, None)


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime", "tflite"])
@pytest.mark.parametrize("seed", range(200, 203))
def test_random_upsampling_nets_run_as_programs_with_the_captured_runs_bits(
    seed, platform, request
):
    _both_gemm_paths(seed, request)
    _programs_give_the_captured_bits(seed, platform, UPSAMPLING_STEPS)


def _programs_give_the_captured_bits(seed: int, platform: str, steps: dict | None):
    torch.manual_seed(seed)
    model = RandomNet(seed, 14, steps).eval()
    g = torch.Generator().manual_seed(seed)
    shape = (2, C, S, S)
    sim = Simulator(model, platform, steady_programs=False)
    sim.calibrate([(torch.randn(shape, generator=g),) for _ in range(2)], progress=False)
    xs = [torch.randn(shape, generator=g) * s for s in (0.1, 1.0, 3.0)] + [torch.zeros(shape)]
    for mode in (Mode.FAKE, Mode.HYBRID, Mode.FIXED):
        prog = sim.program(xs[1].clone(), mode=mode)  # every step of STEPS can be traced
        for x in xs:
            for p, q in zip(
                leaves(prog(x.clone())), leaves(sim.run(x.clone(), mode=mode)), strict=True
            ):
                assert_bits_equal(p, q)
        assert prog.fallbacks == 0
