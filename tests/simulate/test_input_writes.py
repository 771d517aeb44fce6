"""A model whose forward writes into its input (``x.sub_(m).mul_(k)``): the simulator finds it
on its first run, which works on a copy, warns once, and hands every later run a copy of its
inputs. Calibration (which runs its first batch twice), repeated runs and sensitivity passes
then see each batch as given: they match a twin that computes the same out of place, and the
caller's tensors are never written."""

from __future__ import annotations

import warnings

import pytest
import torch
from bits import assert_bits_equal
from torch import nn

from quantlab.analysis.sensitivity import sensitivity
from quantlab.simulate import Mode, Simulator


class Normalizes(nn.Module):
    def __init__(self, in_place: bool) -> None:
        super().__init__()
        self.in_place = in_place
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.head = nn.Conv2d(6, 4, 1)

    def forward(self, x):
        if self.in_place:
            x.sub_(0.5).mul_(2.0)
        else:
            x = (x - 0.5) * 2.0
        return self.head(torch.relu(self.conv(x)))


def _pair():
    """Simulators of the model that writes its input and of its out-of-place twin (same
    weights), neither switching to traced programs."""
    sims = []
    for in_place in (True, False):
        torch.manual_seed(0)
        sims.append(Simulator(Normalizes(in_place).eval(), "j6m", steady_programs=False))
    return sims


def _batches(n: int = 3):
    g = torch.Generator().manual_seed(1)
    return [(torch.rand(2, 3, 6, 6, generator=g),) for _ in range(n)]


def test_calibration_and_runs_see_each_batch_as_given_and_never_write_it():
    writes, twin = _pair()
    calib = _batches()
    given = [b[0].clone() for b in calib]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        writes.calibrate(calib, progress=False)
    told = [w for w in caught if "writes into its input in place" in str(w.message)]
    assert len(told) == 1 and "Normalizes.forward" in str(told[0].message)
    assert writes.writes_inputs
    for b, g in zip(calib, given, strict=True):
        assert_bits_equal(b[0], g)
    twin.calibrate(calib, progress=False)
    assert not twin.writes_inputs
    x = _batches(1)[0][0]
    x_given = x.clone()
    for mode in (Mode.FLOAT, Mode.FAKE, Mode.FIXED):
        first = writes.run(x, mode=mode)
        assert_bits_equal(writes.run(x, mode=mode), first)
        assert_bits_equal(first, twin.run(x.clone(), mode=mode))
    assert_bits_equal(x, x_given)


def test_a_write_found_after_discovery_is_told_and_later_runs_get_copies():
    """A forward that writes its input only when a flag is set: the run that first writes
    works on the caller's tensors (as the model's own call would), says so, and every later
    run gets a copy."""
    writes, _ = _pair()
    writes.model.in_place = False
    writes.calibrate(_batches(), progress=False)
    assert not writes.writes_inputs
    writes.model.in_place = True
    x = _batches(1)[0][0]
    x_given = x.clone()
    with pytest.warns(UserWarning, match="this run wrote into the tensors it was given"):
        writes.run(x, mode=Mode.FAKE)
    assert writes.writes_inputs
    assert not torch.equal(x, x_given)  # written once, by that run
    x_written = x.clone()
    writes.run(x, mode=Mode.FIXED)
    writes.run(x, mode=Mode.FLOAT)
    assert_bits_equal(x, x_written)


def test_sensitivity_of_a_model_that_writes_its_input_matches_its_twin():
    tables = []
    for sim in _pair():
        calib = _batches()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sim.calibrate(calib, progress=False)
            naive = sensitivity(sim, calib[:2], replay=False, progress=False).table
            replayed = sensitivity(sim, calib[:2], progress=False).table
        cols = ["op_name", "sensitive_type", "metric", "value"]
        assert naive[cols].equals(replayed[cols])
        tables.append(replayed[cols])
    assert tables[0].equals(tables[1])


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_a_program_of_a_model_that_writes_its_input_works_on_copies(mode):
    writes, twin = _pair()
    calib = _batches()
    with pytest.warns(UserWarning, match="writes into its input"):
        writes.calibrate(calib, progress=False)
    twin.calibrate(calib, progress=False)
    x = _batches(1)[0][0]
    x_given = x.clone()
    prog = writes.program(x, mode=mode)
    for _ in range(2):
        assert_bits_equal(prog(x), twin.run(x.clone(), mode=mode))
    assert_bits_equal(x, x_given)
    assert prog.fallbacks == 0
