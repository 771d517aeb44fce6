"""A FAKE run fake-quantizes an op's result in place only when the op has just made it
(``args.fresh_result``): a view, an argument returned by an in-place op or ``out=``, a
``detach`` alias, a result with a gradient, a tensor subclass and the result of a call whose
arguments' storage cannot be read are quantized into a new tensor, so no other tensor
changes, and every run gives the bits of a run that never writes in place."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal
from torch import nn
from torch.nn import functional as F

from quantlab.numerics import fake_quant_native
from quantlab.simulate import Mode, Simulator
from quantlab.simulate import args as A


def test_a_new_result_is_fresh():
    x, y = torch.randn(8), torch.randn(8)
    assert A.fresh_result(torch.add(x, y), (x, y), {})
    assert A.fresh_result(torch.cat([x, y]), ([x, y],), {"dim": 0})
    assert A.fresh_result(torch.sigmoid(x), (x,), {})


@pytest.mark.parametrize(
    "made",
    [
        pytest.param(lambda x, y: (x.view(2, 4), (x,), {}), id="view"),
        pytest.param(lambda x, y: (x[1:], (x,), {}), id="slice view"),
        pytest.param(lambda x, y: (x.mul_(2.0), (x, 2.0), {}), id="in-place op"),
        pytest.param(lambda x, y: (F.relu(x, inplace=True), (x,), {"inplace": True}), id="relu_"),
        pytest.param(lambda x, y: (torch.add(x, 1.0, out=y), (x, 1.0), {"out": y}), id="out="),
        pytest.param(lambda x, y: (x.detach(), (x,), {}), id="detach"),
        pytest.param(lambda x, y: (x[2:].detach(), (x,), {}), id="alias at an offset"),
        pytest.param(lambda x, y: (y, ([x, y],), {}), id="a list element"),
        pytest.param(lambda x, y: (x.float(), (x,), {}), id="cast to its own dtype"),
        pytest.param(lambda x, y: (torch.add(x, y).requires_grad_(), (x, y), {}), id="gradient"),
        pytest.param(lambda x, y: ((x + y, x - y), (x, y), {}), id="not a tensor"),
        pytest.param(lambda x, y: (_Sub(x + y), (x, y), {}), id="a tensor subclass"),
        pytest.param(lambda x, y: (x + 1, (x.to_sparse(),), {}), id="storage unreadable"),
    ],
)
def test_an_alias_of_an_argument_a_view_or_a_gradient_is_not_fresh(made):
    x, y = torch.randn(8), torch.randn(8)
    out, call_args, kwargs = made(x, y)
    assert not A.fresh_result(out, call_args, kwargs)


class _Sub(torch.Tensor):
    pass


class AliasNet(nn.Module):
    """Quantized ops whose results are new tensors and ops whose results are an argument, a
    view of one or share one's storage, each followed by a use of that argument."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x):
        y, z = self.a(x), self.b(x)
        s = torch.sigmoid(y)  # new
        m = y * z  # new
        r = F.relu(z, inplace=True)  # z itself
        buf = torch.zeros_like(s)
        t = torch.add(s, m, out=buf)  # buf
        u = torch.tanh(m)  # new, m used again below
        v = u.mul_(0.75)  # an in-place op: the simulator computes it out of place
        h = torch.cat([s, m, r, t, u, v, buf, y, z], -1)
        return h, m, s, buf


def _sims(m, calib, **kw):
    sim = Simulator(m, "j6m", **kw)
    sim.calibrate(calib, progress=False)
    return sim


def test_in_place_fake_quants_give_the_bits_of_a_run_that_never_writes_in_place(monkeypatch):
    torch.manual_seed(0)
    m = AliasNet().eval()
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(4, 16, generator=g),) for _ in range(3)]
    xs = [torch.randn(4, 16, generator=g) * s for s in (0.1, 1.0, 4.0, 40.0)]
    runs = {}
    for kind in ("in place", "never"):
        if kind == "never":
            monkeypatch.setattr(A, "fresh_result", lambda out, call_args, kwargs: False)
        captured = _sims(m, calib, steady_programs=False)
        programmed = _sims(m, calib)
        prog = programmed.program(calib[0][0], mode=Mode.FAKE)
        got = []
        for x in xs:
            before = x.clone()
            for _ in range(3):  # the first run dispatches, later ones follow prepared calls
                got.append(captured.run(x, mode=Mode.FAKE))
            got.append(prog(x))
            assert_bits_equal(x, before)  # the input is never written
        assert prog.fallbacks == 0
        runs[kind] = got
    for got, want in zip(runs["in place"], runs["never"], strict=True):
        for a, b in zip(got, want, strict=True):
            assert_bits_equal(a, b)


def test_new_results_of_elementwise_ops_are_fake_quantized_in_place(monkeypatch):
    """The gain the rule is for: on a steady run every new result is fake-quantized in place
    (the GEMMs', which are always new, and every other op's that ``fresh_result`` finds new),
    the ``out=`` add's into a new tensor."""
    torch.manual_seed(0)
    m = AliasNet().eval()
    n = 257
    calib = [(torch.randn(n, 16),) for _ in range(2)]
    sim = _sims(m, calib, steady_programs=False)
    x = torch.randn(n, 16)
    sim.run(x, mode=Mode.FAKE)
    in_place, fresh = [], []
    real_fq, real_fresh = fake_quant_native.reciprocal, A.fresh_result

    def fq(x, rf, sf, lo, hi, out=None):
        in_place.append(out is x)
        return real_fq(x, rf, sf, lo, hi, out)

    def seen(out, call_args, kwargs):
        fresh.append(real_fresh(out, call_args, kwargs))
        return fresh[-1]

    monkeypatch.setattr(fake_quant_native, "reciprocal", fq)
    monkeypatch.setattr(A, "fresh_result", seen)
    sim.run(x, mode=Mode.FAKE)
    assert fresh.count(False) == 1  # the out= add (mul_ runs out of place, calls.out_of_place)

    # in place: the two GEMMs, sigmoid, tanh and cat (relu's result lies on its input's grid
    # and is not quantized again) and mul_; into new tensors: the out= add and the inputs
    # quantized at the GEMMs and at the cat; y * z computes its product and fake quant in one
    # pass into a new tensor (fake_quant_native.binary), with no separate fake quant
    assert in_place.count(True) == 6, (in_place, fresh)
    assert in_place.count(False) == 4, (in_place, fresh)
